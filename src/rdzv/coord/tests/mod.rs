//! The coordinator driven with made-up nodes and instants.

mod elastic;

use super::*;

fn hello(host: &str, nproc: usize, hosting: bool, port: u16) -> Hello {
    Hello {
        host: host.into(),
        nproc,
        nnodes: 2,
        min_nodes: 0,
        node_rank: None,
        run_id: "job".into(),
        hosting,
        port,
        auth: "none".into(),
        nonce: String::new(),
        addr: None,
        ticket: String::new(),
    }
}

fn coord(t0: Instant, restarts: u32) -> Coordinator {
    Coordinator::new(
        2,
        "job",
        restarts,
        None,
        Duration::from_secs(30),
        Duration::from_secs(10),
        t0,
    )
}

fn starts(out: &[Out]) -> Vec<(Conn, usize, usize, String, u16)> {
    out.iter()
        .filter_map(|o| match &o.msg {
            ToAgent::Start(s) => Some((
                o.conn,
                s.node_rank,
                s.rank_offset,
                s.master_addr.clone(),
                s.master_port,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn the_hosting_node_is_node_0_and_ranks_follow_the_nproc_of_each() {
    let t0 = Instant::now();
    let mut c = coord(t0, 0);
    assert!(
        c.join(7, hello("host1", 3, false, 111), "10.0.0.11", t0)
            .is_empty()
    );
    let out = c.join(3, hello("host0", 2, true, 222), "10.0.0.10", t0);
    assert_eq!(
        starts(&out),
        vec![
            (3, 0, 0, "10.0.0.10".into(), 222),
            (7, 1, 2, "10.0.0.10".into(), 222)
        ]
    );
    let ToAgent::Start(s) = &out[1].msg else {
        panic!()
    };
    assert_eq!(
        (s.world_size, s.hosts.clone()),
        (5, vec!["host0".into(), "host1".into()])
    );
    // Both end well: the job ends 0 everywhere.
    assert!(c.ended(3, 0, 0, 1).is_empty());
    let end = c.ended(7, 0, 0, 1);
    assert_eq!(end.len(), 2);
    assert!(end.iter().all(|o| o.close
        && o.msg
            == ToAgent::End {
                code: 0,
                cause: None
            }));
    assert!(c.over());
}

#[test]
fn asked_node_ranks_are_kept_and_bad_ones_refused() {
    let t0 = Instant::now();
    let mut c = coord(t0, 0);
    let mut h = hello("a", 1, false, 1);
    h.node_rank = Some(1);
    assert!(c.join(1, h.clone(), "10.0.0.1", t0).is_empty());
    let refused = c.join(2, h, "10.0.0.2", t0);
    assert!(matches!(&refused[0].msg, ToAgent::Refused { why } if why.contains("taken by a")));
    let mut other = hello("b", 1, true, 5);
    other.run_id = "other".into();
    assert!(
        matches!(&c.join(3, other, "x", t0)[0].msg, ToAgent::Refused { why } if why.contains("--rdzv-id"))
    );
    let out = c.join(4, hello("b", 1, true, 5), "10.0.0.2", t0);
    // Node 0 is b, whatever joined first: MASTER_ADDR is b's address.
    assert_eq!(
        starts(&out),
        vec![
            (4, 0, 0, "10.0.0.2".into(), 5),
            (1, 1, 1, "10.0.0.2".into(), 5)
        ]
    );
}

fn running(t0: Instant, restarts: u32) -> Coordinator {
    let mut c = coord(t0, restarts);
    c.join(0, hello("host0", 1, true, 10), "10.0.0.10", t0);
    c.join(1, hello("host1", 1, false, 11), "10.0.0.11", t0);
    c
}

fn failure(round: u32, code: i32) -> Failure {
    Failure {
        round,
        cause: "host1: rank 1 (pid 9) killed by signal 9 (SIGKILL)".into(),
        code,
        restartable: true,
    }
}

#[test]
fn a_failure_stops_the_others_and_the_job_ends_with_its_code() {
    let t0 = Instant::now();
    let mut c = running(t0, 0);
    let stop = c.failed(1, failure(0, 137));
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0].conn, 0);
    assert!(matches!(&stop[0].msg, ToAgent::Stop { round: 0, cause } if cause.contains("host1")));
    assert!(c.ended(1, 0, 137, 12).is_empty());
    let end = c.ended(0, 0, 143, 13);
    assert_eq!(end.len(), 2);
    assert!(
        matches!(&end[0].msg, ToAgent::End { code: 137, cause: Some(c) } if c.contains("SIGKILL"))
    );
}

#[test]
fn restarts_start_a_new_round_on_fresh_ports_until_none_are_left() {
    let t0 = Instant::now();
    let mut c = running(t0, 1);
    c.failed(1, failure(0, 1));
    c.ended(1, 0, 1, 21);
    let again = c.ended(0, 0, 143, 20);
    assert_eq!(
        starts(&again),
        vec![
            (0, 0, 0, "10.0.0.10".into(), 20),
            (1, 1, 1, "10.0.0.10".into(), 20)
        ]
    );
    // A stale message of round 0 changes nothing.
    assert!(c.failed(1, failure(0, 1)).is_empty());
    c.failed(1, failure(1, 1));
    c.ended(1, 1, 1, 23);
    let end = c.ended(0, 1, 143, 22);
    assert!(matches!(&end[0].msg, ToAgent::End { code: 1, .. }));
}

#[test]
fn a_silent_node_is_lost_within_the_heartbeat_timeout_and_never_restarted() {
    let t0 = Instant::now();
    let mut c = running(t0, 3);
    c.seen(0, t0 + Duration::from_secs(9));
    assert!(c.tick(t0 + Duration::from_secs(9)).is_empty());
    let stop = c.tick(t0 + Duration::from_secs(10));
    assert_eq!(stop.len(), 1);
    assert!(
        matches!(&stop[0].msg, ToAgent::Stop { cause, .. } if cause == "node 1 (host1) was lost: no heartbeat for 10 s")
    );
    assert_eq!(c.live(), vec![0]);
    let end = c.ended(0, 0, 143, 1);
    assert!(matches!(
        &end[0].msg,
        ToAgent::End {
            code: 1,
            cause: Some(_)
        }
    ));
    assert!(c.over());
}

#[test]
fn a_node_lost_while_stopping_forbids_the_restart() {
    let t0 = Instant::now();
    let mut c = running(t0, 3);
    c.failed(0, failure(0, 2));
    c.ended(0, 0, 2, 1);
    let end = c.lost(1, "connection closed");
    assert!(matches!(&end[0].msg, ToAgent::End { code: 2, .. }));
}

#[test]
fn a_rendezvous_short_of_nodes_gives_up_naming_who_came() {
    let t0 = Instant::now();
    let mut c = coord(t0, 0);
    c.join(0, hello("host0", 1, true, 1), "10.0.0.10", t0);
    assert!(c.tick(t0 + Duration::from_secs(29)).is_empty());
    let out = c.tick(t0 + Duration::from_secs(30));
    assert!(
        matches!(&out[0].msg, ToAgent::Incomplete { why } if why == "only 1 of 2 node(s) joined in 30 s (host0)")
    );
    // One that leaves before the start does not count.
    let mut c = coord(t0, 0);
    c.join(0, hello("host0", 1, true, 1), "a", t0);
    c.lost(0, "closed");
    assert!(c.join(1, hello("host1", 1, false, 1), "b", t0).is_empty());
}

#[test]
fn node_0_on_loopback_is_the_master_at_the_address_the_others_reached() {
    // TorchX gives node 0 the endpoint localhost:PORT: its agent connects
    // over loopback, and the others must not be told MASTER_ADDR=127.0.0.1.
    let t0 = Instant::now();
    let mut c = coord(t0, 0);
    c.join(0, hello("host0", 1, true, 10), "127.0.0.1", t0);
    c.reached_at("10.77.0.10");
    let out = c.join(1, hello("host1", 1, false, 11), "10.77.0.11", t0);
    let masters: Vec<String> = starts(&out).into_iter().map(|s| s.3).collect();
    assert_eq!(masters, ["10.77.0.10", "10.77.0.10"]);
    // Every node on one machine: loopback is right for all of them.
    let mut c = coord(t0, 0);
    c.join(0, hello("a", 1, true, 10), "127.0.0.1", t0);
    let out = c.join(1, hello("b", 1, false, 11), "127.0.0.1", t0);
    assert_eq!(starts(&out)[0].3, "127.0.0.1");
    // Node 0 seen at its own address stays at it, whatever else is known.
    let mut c = coord(t0, 0);
    c.reached_at("10.0.0.99");
    c.join(0, hello("host0", 1, true, 10), "10.0.0.10", t0);
    let out = c.join(1, hello("host1", 1, false, 11), "10.0.0.11", t0);
    assert_eq!(starts(&out)[1].3, "10.0.0.10");
}

/// A member's counts are bounded before they are summed: a hello with
/// nproc 2^64-1 (which would wrap the world to 0) or 0 is refused, and no
/// round starts with WORLD_SIZE 0.
#[test]
fn a_hello_with_an_impossible_rank_count_is_refused() {
    let t0 = Instant::now();
    for nproc in [usize::MAX, 0, crate::cpuset::MAX_CPU + 1] {
        let mut c = coord(t0, 0);
        let out = c.join(1, hello("evil", nproc, false, 1), "10.0.0.9", t0);
        assert!(
            matches!(&out[0].msg, ToAgent::Refused { why } if why.contains("ranks: a node runs 1 to")),
            "{nproc}: {out:?}"
        );
        let out = c.join(2, hello("host0", 1, true, 2), "10.0.0.10", t0);
        let out2 = c.join(3, hello("host1", 1, false, 3), "10.0.0.11", t0);
        for o in out.iter().chain(&out2) {
            if let ToAgent::Start(s) = &o.msg {
                assert_eq!(s.world_size, 2, "{nproc}");
            }
        }
    }
}
