//! The coordinator of an elastic job (`--nnodes MIN:MAX`), driven with
//! made-up nodes and instants.

use super::super::*;

fn hello(host: &str, hosting: bool) -> Hello {
    Hello {
        host: host.into(),
        nproc: 1,
        nnodes: 3,
        min_nodes: 2,
        node_rank: None,
        run_id: "job".into(),
        hosting,
        port: 100,
        auth: "none".into(),
        nonce: String::new(),
        addr: None,
        ticket: String::new(),
    }
}

/// MIN 2, MAX 3, a last call of 2 s, a heartbeat timeout of 10 s.
fn coord(t0: Instant, max_restarts: u32) -> Coordinator {
    Coordinator::new(
        3,
        "job",
        max_restarts,
        None,
        Duration::from_secs(60),
        Duration::from_secs(10),
        t0,
    )
    .elastic(2, Duration::from_secs(2))
}

/// Each Start: (conn, round, restarts, node rank, nodes, world size).
fn starts(out: &[Out]) -> Vec<(Conn, u32, u32, usize, usize, usize)> {
    out.iter()
        .filter_map(|o| match &o.msg {
            ToAgent::Start(s) => Some((
                o.conn,
                s.round,
                s.restarts,
                s.node_rank,
                s.nnodes,
                s.world_size,
            )),
            _ => None,
        })
        .collect()
}

fn stops(out: &[Out]) -> Vec<Conn> {
    out.iter()
        .filter(|o| matches!(o.msg, ToAgent::Stop { .. }))
        .map(|o| o.conn)
        .collect()
}

fn end(out: &[Out]) -> Option<(i32, Option<String>)> {
    out.iter().find_map(|o| match &o.msg {
        ToAgent::End { code, cause } => Some((*code, cause.clone())),
        _ => None,
    })
}

/// A newcomer joins the running round and stays `ADMIT_AFTER`: only then
/// does the round stop for it.
fn admit(c: &mut Coordinator, conn: Conn, h: Hello, addr: &str, t: Instant) -> Vec<Out> {
    assert!(
        c.join(conn, h, addr, t).is_empty(),
        "nothing stops before it has stayed"
    );
    c.tick(t + ADMIT_AFTER)
}

/// Two nodes formed a job of 2 (after the last call): conns 1 (hosting) and 2.
fn formed(t0: Instant, max_restarts: u32) -> Coordinator {
    let mut c = coord(t0, max_restarts);
    assert!(c.join(2, hello("b", false), "10.0.0.2", t0).is_empty());
    assert!(c.join(1, hello("a", true), "10.0.0.1", t0).is_empty());
    assert!(c.tick(t0 + Duration::from_millis(1900)).is_empty());
    let out = c.tick(t0 + Duration::from_secs(2));
    assert_eq!(
        starts(&out),
        vec![(1, 0, 0, 0, 2, 2), (2, 0, 0, 1, 2, 2)],
        "MIN nodes start once the last call has passed"
    );
    c
}

#[test]
fn max_nodes_start_at_once_and_min_after_the_last_call() {
    let t0 = Instant::now();
    formed(t0, 3);
    let mut c = coord(t0, 3);
    c.join(1, hello("a", true), "10.0.0.1", t0);
    c.join(2, hello("b", false), "10.0.0.2", t0);
    let out = c.join(3, hello("c", false), "10.0.0.3", t0);
    assert_eq!(
        starts(&out).len(),
        3,
        "MAX nodes start without the last call"
    );
    // One node alone never starts; the join timeout ends it.
    let mut c = coord(t0, 3);
    c.join(1, hello("a", true), "10.0.0.1", t0);
    assert!(c.tick(t0 + Duration::from_secs(30)).is_empty());
    let out = c.tick(t0 + Duration::from_secs(60));
    assert!(
        matches!(&out[0].msg, ToAgent::Incomplete { why } if why.contains("only 1 of the 2 at least")),
        "{out:?}"
    );
}

#[test]
fn a_node_joining_a_round_restarts_it_with_the_newcomer_without_counting() {
    let t0 = Instant::now();
    let mut c = formed(t0, 3);
    let out = admit(&mut c, 3, hello("c", false), "10.0.0.3", t0);
    assert_eq!(stops(&out), vec![1, 2], "the running nodes stop for it");
    assert!(
        c.live().contains(&3),
        "the newcomer hears heartbeats meanwhile"
    );
    assert!(c.ended(1, 0, 143, 200).is_empty());
    let out = c.ended(2, 0, 143, 201);
    assert_eq!(
        starts(&out),
        vec![(1, 1, 0, 0, 3, 3), (2, 1, 0, 1, 3, 3), (3, 1, 0, 2, 3, 3)],
        "round 1 of 3 nodes, no restart counted"
    );
    // A fourth is refused: the job is at its most.
    let out = c.join(4, hello("d", false), "10.0.0.4", t0);
    assert!(
        matches!(&out[0].msg, ToAgent::Refused { why } if why.contains("full")),
        "{out:?}"
    );
}

#[test]
fn a_lost_node_leaves_the_survivors_to_go_on_and_counts_a_restart() {
    let t0 = Instant::now();
    let mut c = formed(t0, 3);
    admit(&mut c, 3, hello("c", false), "10.0.0.3", t0);
    c.ended(1, 0, 143, 200);
    c.ended(2, 0, 143, 201);
    // Node 2 (c) is killed: the others stop, then go on as 2 nodes.
    let out = c.lost(3, "its agent's connection closed");
    assert_eq!(stops(&out), vec![1, 2]);
    c.ended(1, 1, 143, 300);
    let out = c.ended(2, 1, 143, 301);
    assert_eq!(
        starts(&out),
        vec![(1, 2, 1, 0, 2, 2), (2, 2, 1, 1, 2, 2)],
        "round 2 of 2 nodes, one restart counted"
    );
    // The script then finishes on both: the job ends 0.
    c.ended(1, 2, 0, 1);
    let out = c.ended(2, 2, 0, 1);
    assert_eq!(end(&out), Some((0, None)));
}

#[test]
fn fewer_than_min_or_no_restarts_left_end_the_job_with_1() {
    let t0 = Instant::now();
    let mut c = formed(t0, 3);
    let out = c.lost(2, "no heartbeat for 10 s");
    assert_eq!(stops(&out), vec![1]);
    let (code, cause) = end(&c.ended(1, 0, 143, 1)).unwrap();
    assert_eq!(code, 1);
    assert!(
        cause
            .as_deref()
            .unwrap()
            .contains("1 node(s) remain, fewer than --nnodes 2:3"),
        "{cause:?}"
    );
    let mut c = formed(t0, 0);
    admit(&mut c, 3, hello("c", false), "10.0.0.3", t0);
    c.ended(1, 0, 143, 1);
    c.ended(2, 0, 143, 1);
    c.lost(3, "gone");
    c.ended(1, 1, 143, 1);
    let (code, cause) = end(&c.ended(2, 1, 143, 1)).unwrap();
    assert_eq!(code, 1);
    assert!(
        cause
            .unwrap()
            .contains("no restarts left (--max-restarts 0)")
    );
}

#[test]
fn survivors_that_finished_while_stopping_for_a_newcomer_end_the_job_well() {
    let t0 = Instant::now();
    let mut c = formed(t0, 3);
    admit(&mut c, 3, hello("c", false), "10.0.0.3", t0);
    c.ended(1, 0, 0, 1);
    let out = c.ended(2, 0, 0, 1);
    assert_eq!(end(&out), Some((0, None)));
    assert!(
        out.iter().any(|o| o.conn == 3),
        "the newcomer hears the end too"
    );
}

#[test]
fn a_rank_failure_while_stopping_for_a_newcomer_counts() {
    let t0 = Instant::now();
    let mut c = formed(t0, 0);
    admit(&mut c, 3, hello("c", false), "10.0.0.3", t0);
    // The round was already stopping; a lost node makes its restart count,
    // and with none left the job ends.
    c.lost(2, "gone");
    let (code, cause) = end(&c.ended(1, 0, 143, 1)).unwrap();
    assert_eq!(code, 1);
    assert!(cause.unwrap().contains("node 1 (b) was lost"));
}

#[test]
fn a_different_range_and_a_silent_newcomer() {
    let t0 = Instant::now();
    let mut c = formed(t0, 3);
    let mut h = hello("x", false);
    h.min_nodes = 1;
    let out = c.join(5, h, "10.0.0.5", t0);
    assert!(
        matches!(&out[0].msg, ToAgent::Refused { why } if why.contains("--nnodes 1:3 differs from the rendezvous host's 2:3")),
        "{out:?}"
    );
    // A newcomer that goes silent before the next round is dropped, not lost.
    c.join(3, hello("c", false), "10.0.0.3", t0);
    c.seen(1, t0 + Duration::from_secs(9));
    c.seen(2, t0 + Duration::from_secs(9));
    assert!(c.tick(t0 + Duration::from_secs(11)).is_empty());
    assert!(!c.live().contains(&3));
    c.ended(1, 0, 143, 1);
    let out = c.ended(2, 0, 143, 1);
    assert_eq!(starts(&out).len(), 2, "the round restarts with the two");
}

/// Churn: a member that leaves right after its welcome stops nothing; one
/// that stays is admitted, and the running ranks restart for membership at
/// most once every `MEMBERSHIP_EVERY` (twice a minute), however often nodes
/// come and go.
#[test]
fn churn_restarts_the_running_ranks_at_most_twice_a_minute() {
    let t0 = Instant::now();
    let mut c = formed(t0, 1);
    let mut stops_seen = 0;
    let mut round = 0;
    // The nodes of the round under way, and those that stayed.
    let mut running: Vec<Conn> = vec![1, 2];
    let mut stayed: Vec<Conn> = vec![];
    // Every 100 ms for 60 s a newcomer joins; every other one leaves at once.
    for k in 0..600u32 {
        let t = t0 + Duration::from_secs(2) + Duration::from_millis(100 * k as u64);
        let conn = 100 + k as usize;
        for n in running.iter().chain(&stayed) {
            c.seen(*n, t);
        }
        let mut out = c.join(conn, hello(&format!("n{k}"), false), "10.0.1.1", t);
        if k % 2 == 0 {
            out.extend(c.lost(conn, "left right after its welcome"));
        } else {
            stayed.push(conn);
            c.seen(conn, t);
        }
        out.extend(c.tick(t));
        if !stops(&out).is_empty() {
            stops_seen += 1;
            // The running nodes end; the next round starts with whoever stayed.
            let mut next = vec![];
            for n in &running {
                next = c.ended(*n, round, 143, 1);
            }
            let started: Vec<Conn> = starts(&next).iter().map(|s| s.0).collect();
            assert!(!started.is_empty(), "the next round starts");
            stayed.retain(|n| !started.contains(n));
            running = started;
            round += 1;
        }
    }
    assert!(stops_seen >= 1, "a member that stays is admitted");
    assert!(stops_seen <= 2, "{stops_seen} restarts in 60 s");
}

/// A newcomer that is gone before it has stayed never stops the round.
#[test]
fn a_join_that_ends_at_once_stops_nothing() {
    let t0 = Instant::now();
    let mut c = formed(t0, 1);
    let t = t0 + Duration::from_secs(2);
    assert!(c.join(3, hello("c", false), "10.0.0.3", t).is_empty());
    assert!(c.lost(3, "gone right after its welcome").is_empty());
    assert!(stops(&c.tick(t + ADMIT_AFTER * 2)).is_empty());
}
