//! Two and three real agents over loopback, in this process, with no root
//! and no test hosts: the rendezvous host, the sockets, the threads and the
//! heartbeat are the real ones; only the ranks are stand-ins (the `round`
//! closure), which say what a supervisor would.

mod attacks;
mod door;
mod fuzz;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::Auth;
use super::proto::{Hello, PROTOCOL, Start, ToHost};
use super::{AgentConfig, ClusterError, JobEnd, run};
use crate::launch::machine::Exit;
use crate::launch::supervise::{LocalFailure, Peer};

fn free_port() -> u16 {
    crate::launch::env::free_port().unwrap()
}

pub(super) fn config(
    port: u16,
    nnodes: usize,
    host: &str,
    node_rank: Option<usize>,
) -> AgentConfig {
    AgentConfig {
        endpoint: crate::netif::Endpoint::new("127.0.0.1", port),
        nnodes,
        min_nodes: nnodes,
        last_call: Duration::ZERO,
        node_rank,
        run_id: "loopback".into(),
        nproc: 1,
        max_restarts: 0,
        master_port: None,
        join_timeout: Duration::from_secs(20),
        heartbeat_timeout: Duration::from_secs(5),
        host: host.into(),
        local_addr: None,
        linger: Duration::from_secs(2),
        auth: Auth::Open,
    }
}

/// Wait (bounded) until the rendezvous tells this round's ranks to stop.
fn wait_for_stop(peer: &Arc<dyn Peer>) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if peer.stop_requested() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

type Round = Box<dyn FnMut(&Start, Arc<dyn Peer>) -> i32 + Send>;

/// Run every agent on its own thread; each one's end and the starts it saw.
fn agents(cfgs: Vec<(AgentConfig, Round)>) -> Vec<(Result<JobEnd, ClusterError>, Vec<Start>)> {
    let threads: Vec<_> = cfgs
        .into_iter()
        .enumerate()
        .map(|(i, (cfg, mut round))| {
            // The first one hosts: the others start a little later.
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 50 }));
            std::thread::spawn(move || {
                let seen = Arc::new(Mutex::new(vec![]));
                let s = seen.clone();
                let end = run(&cfg, move |st, peer| {
                    s.lock().unwrap().push(st.clone());
                    round(st, peer).into()
                });
                let seen = seen.lock().unwrap().clone();
                (end, seen)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn ok(r: &Result<JobEnd, ClusterError>) -> &JobEnd {
    r.as_ref().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn three_agents_form_one_job_with_distinct_ranks() {
    let port = free_port();
    let succeed = || -> Round { Box::new(|_: &Start, _: Arc<dyn Peer>| 0) };
    let out = agents(vec![
        (config(port, 3, "a", None), succeed()),
        (config(port, 3, "b", None), succeed()),
        (config(port, 3, "c", None), succeed()),
    ]);
    let mut ranks = vec![];
    for (end, seen) in &out {
        assert_eq!(ok(end).code, 0);
        assert_eq!(ok(end).cause, None);
        let [s] = &seen[..] else {
            panic!("one round each: {seen:?}")
        };
        assert_eq!((s.nnodes, s.world_size, s.round), (3, 3, 0));
        assert_eq!(s.master_addr, "127.0.0.1");
        assert_eq!(s.hosts.len(), 3);
        ranks.push((s.node_rank, s.rank_offset));
    }
    // The endpoint's own node (the host) is node 0; every node its own rank.
    assert_eq!(ranks[0], (0, 0));
    ranks.sort();
    assert_eq!(ranks, vec![(0, 0), (1, 1), (2, 2)]);
    // Every node heard the same MASTER_PORT.
    let ports: Vec<u16> = out.iter().map(|(_, s)| s[0].master_port).collect();
    assert!(ports.iter().all(|p| *p == ports[0] && *p > 0), "{ports:?}");
}

#[test]
fn a_rank_failure_on_one_node_stops_the_other_with_its_cause_and_code() {
    let port = free_port();
    let waiter: Round = Box::new(|_, peer| if wait_for_stop(&peer) { 143 } else { 99 });
    let failer: Round = Box::new(|_, peer| {
        peer.local_failure(LocalFailure::Rank(0, 4242, Exit::Code(7)));
        7
    });
    let out = agents(vec![
        (config(port, 2, "a", None), waiter),
        (config(port, 2, "b", Some(1)), failer),
    ]);
    for (end, seen) in &out {
        let end = ok(end);
        assert_eq!(end.code, 7, "{end:?}");
        let cause = end.cause.as_deref().unwrap_or_default();
        assert!(
            cause.contains("b: rank 1 (local rank 0, pid 4242) exited with code 7"),
            "{cause}"
        );
        assert_eq!(seen.len(), 1);
    }
}

#[test]
fn a_restart_runs_every_nodes_ranks_again() {
    let port = free_port();
    let mut cfgs = vec![];
    for (host, rank) in [("a", None), ("b", Some(1))] {
        let mut c = config(port, 2, host, rank);
        c.max_restarts = 1;
        let round: Round = Box::new(move |st, peer| {
            if st.round == 0 && host == "b" {
                peer.local_failure(LocalFailure::Rank(0, 1, Exit::Signal(9)));
                137
            } else if st.round == 0 {
                if wait_for_stop(&peer) { 143 } else { 99 }
            } else {
                0
            }
        });
        cfgs.push((c, round));
    }
    let out = agents(cfgs);
    for (end, seen) in &out {
        assert_eq!(ok(end).code, 0, "{end:?}");
        let rounds: Vec<u32> = seen.iter().map(|s| s.round).collect();
        assert_eq!(rounds, vec![0, 1]);
        // The restart has a fresh MASTER_PORT.
        assert_ne!(seen[0].master_port, seen[1].master_port);
    }
}

/// A node that joins and then goes away without a word.
fn vanishing_node(port: u16) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no rendezvous host");
            std::thread::sleep(Duration::from_millis(50));
        };
        let hello = ToHost::Hello {
            protocol: PROTOCOL.into(),
            hello: Hello {
                host: "ghost".into(),
                nproc: 1,
                nnodes: 2,
                min_nodes: 0,
                node_rank: Some(1),
                run_id: "loopback".into(),
                hosting: false,
                port: 1,
                auth: "none".into(),
                nonce: String::new(),
                addr: None,
                ticket: String::new(),
            },
        };
        let mut line = serde_json::to_vec(&hello).unwrap();
        line.push(b'\n');
        s.write_all(&line).unwrap();
        // Wait for the job's start, then vanish.
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut l = String::new();
        while r.read_line(&mut l).unwrap() > 0 && !l.contains("\"start\"") {
            l.clear();
        }
        drop(r);
        drop(s);
    })
}

#[test]
fn a_lost_peer_ends_the_job_on_the_node_left_with_code_1() {
    let port = free_port();
    let ghost = vanishing_node(port);
    let stopped = Arc::new(Mutex::new(false));
    let st = stopped.clone();
    let waiter: Round = Box::new(move |_, peer| {
        *st.lock().unwrap() = wait_for_stop(&peer);
        143
    });
    let t0 = Instant::now();
    let out = agents(vec![(config(port, 2, "a", Some(0)), waiter)]);
    ghost.join().unwrap();
    assert!(
        *stopped.lock().unwrap(),
        "the ranks were never told to stop"
    );
    let end = ok(&out[0].0);
    assert_eq!(end.code, 1, "{end:?}");
    let cause = end.cause.as_deref().unwrap_or_default();
    assert!(cause.contains("node 1 (ghost) was lost"), "{cause}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn a_node_with_another_run_id_is_refused_and_the_job_still_forms() {
    let port = free_port();
    let mut other = config(port, 2, "x", None);
    other.run_id = "someone-else".into();
    let succeed = || -> Round { Box::new(|_: &Start, _: Arc<dyn Peer>| 0) };
    let out = agents(vec![
        (config(port, 2, "a", None), succeed()),
        (other, succeed()),
        (config(port, 2, "b", None), succeed()),
    ]);
    assert!(matches!(&out[1].0, Err(ClusterError::Refused(w)) if w.contains("run id")));
    assert_eq!(ok(&out[0].0).code, 0);
    assert_eq!(ok(&out[2].0).code, 0);
}
