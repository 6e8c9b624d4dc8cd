//! Faults across the test hosts, as `run` must survive them: a rank killed,
//! an agent killed, a link taken down, a rendezvous host that never comes;
//! and restarts on every host. Each checks the exit codes, the time to end
//! and that nothing of the job is left on any host.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{
    agent, finish, finish_all, hosts, leftovers, on, rank_script, read, start, strs, until,
};

/// Start the two agents on `port`, their ranks sleeping `port` seconds (a
/// mark to find what is left); wait for all four ranks.
fn job(d: &Path, port: u16, extra: &[&str]) -> (Child, Child, String) {
    let s = rank_script(d, &format!("sleep {port}"));
    let endpoint = format!("host0:{port}");
    let a = agent(&endpoint, &s, extra);
    let c0 = start("host0", &strs(&a), d, "host0");
    let c1 = start("host1", &strs(&a), d, "host1");
    until("four ranks", || {
        (0..4).all(|r| d.join(format!("pid-{r}")).exists())
    });
    (c0, c1, format!("sleep {port}"))
}

fn pid_of(d: &Path, rank: u32) -> i32 {
    std::fs::read_to_string(d.join(format!("pid-{rank}")))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_rank_killed_on_host1_ends_both_hosts_with_its_code() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let (mut c0, mut c1, s) = job(d.path(), 29504, &[]);
    let t = Instant::now();
    unsafe { libc::kill(pid_of(d.path(), 3), libc::SIGKILL) };
    let [(code0, t0), (code1, t1)] = finish_all([&mut c0, &mut c1], t, Duration::from_secs(30));
    eprintln!(
        "rank killed on host1: host0 ended in {t0:?} (code {code0}), host1 in {t1:?} (code {code1})"
    );
    assert_eq!((code0, code1), (137, 137));
    assert!(t0 < Duration::from_secs(5) && t1 < Duration::from_secs(5));
    let h0 = read(d.path(), "host0");
    assert!(
        h0.contains("the job ended: host1: rank 3 (local rank 1, pid"),
        "{h0}"
    );
    assert!(h0.contains("killed by signal 9 (SIGKILL)"), "{h0}");
    assert!(read(d.path(), "host1").contains("host1: error: local rank 1 (pid"));
    until("no rank left", || leftovers(&s).is_empty());
}

#[test]
fn host1s_agent_killed_ends_host0_and_leaves_no_orphan() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let (mut c0, mut c1, s) = job(d.path(), 29505, &[]);
    unsafe { libc::kill(c1.id() as i32, libc::SIGKILL) };
    let _ = c1.wait();
    let (code0, t0) = finish(&mut c0, Duration::from_secs(30));
    eprintln!("host1's agent SIGKILLed: host0 ended in {t0:?} (code {code0})");
    assert_eq!(code0, 1);
    assert!(t0 < Duration::from_secs(5), "{t0:?}");
    let h0 = read(d.path(), "host0");
    assert!(
        h0.contains("the job ended: node 1 (host1) was lost: its agent's connection closed"),
        "{h0}"
    );
    // host1's ranks died with their agent: nothing keeps training.
    until("host1's ranks gone", || leftovers(&s).is_empty());
}

/// A host's link taken down, and brought back up however the test ends (a
/// failed assertion must not leave host1 off the network for the others).
struct LinkDown(&'static str);

impl LinkDown {
    fn new(veth: &'static str) -> LinkDown {
        let down = Command::new("ip")
            .args(["link", "set", veth, "down"])
            .status()
            .unwrap();
        assert!(down.success());
        LinkDown(veth)
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", self.0, "up"])
            .status();
        // Slurm may have noticed too: resume the node for the other tests.
        let _ = on(
            "host0",
            &["scontrol", "update", "nodename=host1", "state=resume"],
        )
        .output();
    }
}

/// Whether `log` says `what` followed by 10-19 seconds.
fn silent_for(log: &str, what: &str) -> bool {
    log.split(what).skip(1).any(|rest| {
        rest.split_once(" s")
            .and_then(|(n, _)| n.parse::<u64>().ok())
            .is_some_and(|n| (10..20).contains(&n))
    })
}

#[test]
fn host1s_link_down_ends_both_hosts_within_the_heartbeat_timeout() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let (mut c0, mut c1, s) = job(d.path(), 29506, &[]);
    let t = Instant::now();
    let link = LinkDown::new("twv1");
    let [r0, r1] = finish_all([&mut c0, &mut c1], t, Duration::from_secs(40));
    drop(link);
    eprintln!(
        "host1's link down: host0 ended in {:?} (code {}), host1 in {:?} (code {})",
        r0.1, r0.0, r1.1, r1.0
    );
    let h1 = read(d.path(), "host1");
    assert_eq!((r0.0, r1.0), (1, 1), "{h1}");
    for t in [r0.1, r1.1] {
        assert!(
            t >= Duration::from_secs(9) && t < Duration::from_secs(20),
            "{t:?}: {h1}"
        );
    }
    // Each side says how long it really heard nothing: the timeout, or a
    // second more where the check ran late on a loaded machine (CI once
    // read "for 11 s").
    let h0 = read(d.path(), "host0");
    assert!(
        silent_for(&h0, "node 1 (host1) was lost: no heartbeat for "),
        "{h0}"
    );
    assert!(
        silent_for(
            &h1,
            "error: no heartbeat from the rendezvous host host0:29506 for "
        ),
        "{h1}"
    );
    until("no rank left", || leftovers(&s).is_empty());
}

#[test]
fn a_rendezvous_host_that_never_comes_ends_the_others_at_the_timeout() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "sleep 300");
    let a = agent("host0:29507", &s, &["--rdzv-timeout", "4"]);
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    let (code, t) = finish(&mut c1, Duration::from_secs(20));
    eprintln!("rendezvous host never came: host1 ended in {t:?} (code {code})");
    assert_eq!(code, 3);
    assert!(
        t >= Duration::from_secs(4) && t < Duration::from_secs(8),
        "{t:?}"
    );
    assert!(
        read(d.path(), "host1")
            .contains("error: the rendezvous host host0:29507 did not answer in 4 s")
    );
    // The host came and went before host1 joined: the same.
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(c0.id() as i32, libc::SIGKILL) };
    let _ = c0.wait();
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    let (code, t) = finish(&mut c1, Duration::from_secs(20));
    assert_eq!(code, 3, "{}", read(d.path(), "host1"));
    assert!(t < Duration::from_secs(8));
    // And the host alone gives up naming who came.
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    assert_eq!(finish(&mut c0, Duration::from_secs(20)).0, 3);
    assert!(
        read(d.path(), "host0")
            .contains("error: the job did not form: only 1 of 2 node(s) joined in 4 s (host0)")
    );
    assert!(leftovers(&s).is_empty());
}

#[test]
fn max_restarts_restarts_every_hosts_ranks() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    // Rank 3 fails on the first attempt only.
    let tail = "sleep 1\n[ \"$RANK$TORCHELASTIC_RESTART_COUNT\" = 30 ] && exit 7\nsleep 1";
    let s = rank_script(d.path(), tail);
    let a = agent("host0:29508", &s, &["--max-restarts", "1"]);
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    let (code0, _) = finish(&mut c0, Duration::from_secs(40));
    let (code1, _) = finish(&mut c1, Duration::from_secs(40));
    let (h0, h1) = (read(d.path(), "host0"), read(d.path(), "host1"));
    assert_eq!((code0, code1), (0, 0), "{h0}{h1}");
    for (h, out) in [("host0", &h0), ("host1", &h1)] {
        assert!(out.contains("(round 1; restarts 1 of 1)"), "{out}");
        assert_eq!(
            out.matches(&format!("] {h} RANK=")).count(),
            4,
            "two rounds of two ranks: {out}"
        );
        assert!(out.contains("RESTART=1"), "{out}");
    }
    assert!(h1.contains("exited with code 7"));
    // Out of restarts, the job ends with the rank's own code.
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "[ $RANK = 3 ] && exit 7\nsleep 2");
    let a = agent("host0:29509", &s, &["--max-restarts", "1"]);
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    assert_eq!(finish(&mut c0, Duration::from_secs(40)).0, 7);
    assert_eq!(finish(&mut c1, Duration::from_secs(40)).0, 7);
}

#[test]
fn sigterm_to_a_node_whose_ranks_are_done_still_stops_the_job() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    // host0's ranks (0, 1) finish at once; host1's (2, 3) run on.
    let s = rank_script(d.path(), "[ $RANK -ge 2 ] && sleep 29510\nexit 0");
    let a = agent("host0:29510", &s, &[]);
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    until("host0's ranks done", || {
        read(d.path(), "host0").contains("threadwise: 2 rank(s) in")
    });
    let t = Instant::now();
    unsafe { libc::kill(c0.id() as i32, libc::SIGTERM) };
    let [(code0, _), (code1, t1)] = finish_all([&mut c0, &mut c1], t, Duration::from_secs(30));
    let h1 = read(d.path(), "host1");
    assert_eq!((code0, code1), (143, 143), "{h1}");
    assert!(t1 < Duration::from_secs(5), "{t1:?}");
    assert!(
        h1.contains("the job ended: host0: threadwise was stopped by SIGTERM"),
        "{h1}"
    );
    until("no rank left", || leftovers("sleep 29510").is_empty());
}
