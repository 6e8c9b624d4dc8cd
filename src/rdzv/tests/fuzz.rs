//! Property tests: whatever a peer says, in whatever order, the rendezvous
//! host's coordinator and the agent's state machine neither panic nor let a
//! stranger act; random bytes on the wire are errors, not panics.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::super::coord::{Coordinator, Out};
use super::super::proto::{self, Failure, Hello, Start, ToAgent, ToHost};
use super::super::state::{Action, AgentState, Event};
use crate::launch::machine::Exit;
use crate::launch::supervise::LocalFailure;

/// One thing that can happen to a coordinator of a 2-node job.
#[derive(Debug, Clone)]
enum Op {
    Join {
        conn: usize,
        run_id: bool,
        nnodes: usize,
        node_rank: Option<usize>,
        hosting: bool,
    },
    Failed {
        conn: usize,
        round: u32,
        code: i32,
        restartable: bool,
    },
    Ended {
        conn: usize,
        round: u32,
        code: i32,
    },
    Lost(usize),
    Seen(usize),
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let conn = 0usize..5;
    prop_oneof![
        (
            conn.clone(),
            any::<bool>(),
            1usize..4,
            proptest::option::of(0usize..3),
            any::<bool>()
        )
            .prop_map(|(conn, run_id, nnodes, node_rank, hosting)| Op::Join {
                conn,
                run_id,
                nnodes,
                node_rank,
                hosting
            }),
        (conn.clone(), 0u32..3, -2i32..140, any::<bool>()).prop_map(
            |(conn, round, code, restartable)| {
                Op::Failed {
                    conn,
                    round,
                    code,
                    restartable,
                }
            }
        ),
        (conn.clone(), 0u32..3, -1i32..3).prop_map(|(conn, round, code)| Op::Ended {
            conn,
            round,
            code
        }),
        conn.clone().prop_map(Op::Lost),
        conn.prop_map(Op::Seen),
        (0u64..30).prop_map(Op::Tick),
    ]
}

fn hello(
    conn: usize,
    run_id: bool,
    nnodes: usize,
    node_rank: Option<usize>,
    hosting: bool,
) -> Hello {
    Hello {
        host: format!("h{conn}"),
        nproc: 1 + conn % 2,
        nnodes,
        min_nodes: 0,
        node_rank,
        run_id: if run_id { "job".into() } else { "other".into() },
        hosting,
        port: 1000 + conn as u16,
        auth: "none".into(),
        nonce: String::new(),
        addr: None,
        ticket: String::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_coordinator_takes_any_sequence_and_only_members_act(ops in proptest::collection::vec(op(), 0..40)) {
        let t0 = Instant::now();
        let mut c = Coordinator::new(2, "job", 1, None, Duration::from_secs(60), Duration::from_secs(10), t0);
        let mut now = t0;
        let mut members: Vec<usize> = vec![];
        for op in ops {
            let out: Vec<Out> = match op {
                Op::Join { conn, run_id, nnodes, node_rank, hosting } => {
                    let h = hello(conn, run_id, nnodes, node_rank, hosting);
                    let good = run_id && nnodes == 2 && !members.contains(&conn);
                    let out = c.join(conn, h, "10.0.0.1", now);
                    // A bad hello is refused with a reason, and only it.
                    for o in &out {
                        if let ToAgent::Refused { why } = &o.msg {
                            prop_assert!(!why.is_empty());
                            prop_assert_eq!(o.conn, conn);
                            prop_assert!(o.close);
                        }
                    }
                    if !run_id || nnodes != 2 {
                        let refused = matches!(out.as_slice(), [Out { msg: ToAgent::Refused { .. }, .. }]);
                        prop_assert!(refused, "a bad hello was not refused: {:?}", out);
                    } else if good && !out.iter().any(|o| matches!(o.msg, ToAgent::Refused { .. })) {
                        members.push(conn);
                    }
                    out
                }
                Op::Failed { conn, round, code, restartable } => {
                    let f = Failure { round, cause: "x".into(), code, restartable };
                    let out = c.failed(conn, f);
                    if !members.contains(&conn) {
                        prop_assert!(out.is_empty(), "a stranger's failure acted: {:?}", out);
                    }
                    out
                }
                Op::Ended { conn, round, code } => c.ended(conn, round, code, 2000),
                Op::Lost(conn) => c.lost(conn, "gone"),
                Op::Seen(conn) => {
                    c.seen(conn, now);
                    vec![]
                }
                Op::Tick(s) => {
                    now += Duration::from_secs(s);
                    c.tick(now)
                }
            };
            // Nothing is ever said to a connection that never joined but its refusal.
            for o in &out {
                if !matches!(o.msg, ToAgent::Refused { .. }) {
                    prop_assert!(members.contains(&o.conn), "{:?} to a stranger", o.msg);
                }
            }
        }
    }

    #[test]
    fn the_agent_state_takes_any_sequence(evs in proptest::collection::vec(event(), 0..40)) {
        let t0 = Instant::now();
        let mut a = AgentState::new("me", "h:1", Duration::from_secs(30), Duration::from_secs(5), t0);
        let mut now = t0;
        let mut finished = false;
        for (ev, dt) in evs {
            now += Duration::from_millis(dt);
            let out = a.on(ev, now);
            // Once the node has finished, nothing more happens, whatever comes.
            prop_assert!(!finished || out.is_empty(), "acted after finishing: {:?}", out);
            let ends = out.iter().filter(|x| matches!(x, Action::Finish(_))).count();
            prop_assert!(ends <= 1, "finished twice at once: {:?}", out);
            finished |= ends == 1;
        }
    }

    #[test]
    fn random_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut r = std::io::BufReader::new(&bytes[..]);
        for _ in 0..8 {
            if !matches!(proto::recv::<ToHost>(&mut r), Ok(Some(_))) {
                break;
            }
        }
        let mut r = std::io::BufReader::new(&bytes[..]);
        let _ = proto::recv::<ToAgent>(&mut r);
    }
}

fn start(round: u32) -> Start {
    Start {
        round,
        restarts: 0,
        node_rank: 0,
        nnodes: 2,
        rank_offset: 0,
        world_size: 2,
        master_addr: "10.0.0.1".into(),
        master_port: 1,
        max_restarts: 1,
        hosts: vec![],
    }
}

fn event() -> impl Strategy<Value = (Event, u64)> {
    let msg = prop_oneof![
        Just(ToAgent::Beat),
        Just(ToAgent::Welcome),
        Just(ToAgent::Busy),
        (0u32..3).prop_map(|r| ToAgent::Start(start(r))),
        (0u32..3).prop_map(|round| ToAgent::Stop {
            round,
            cause: "c".into()
        }),
        (-1i32..140).prop_map(|code| ToAgent::End { code, cause: None }),
        Just(ToAgent::Refused { why: "no".into() }),
        Just(ToAgent::Incomplete { why: "few".into() }),
        Just(ToAgent::Challenge {
            nonce: "ab".into(),
            proof: "cd".into()
        }),
    ];
    let ev = prop_oneof![
        msg.prop_map(Event::Msg),
        Just(Event::Closed("closed".into())),
        Just(Event::Tick),
        prop_oneof![Just(2), Just(15)].prop_map(Event::Signal),
        (0usize..2, 1i32..140).prop_map(|(l, c)| Event::Local(LocalFailure::Rank(
            l,
            100,
            Exit::Code(c)
        ))),
        Just(Event::Local(LocalFailure::Signal(15))),
        (-1i32..3).prop_map(|code| Event::RoundEnded {
            code,
            port: 9,
            report: None
        }),
    ];
    (ev, 0u64..20_000)
}
