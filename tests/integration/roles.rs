//! Threads held in place and placed by role, against a stand-in for a
//! communication library (`tests/support/comm-standin`, LD_PRELOADed into
//! each rank) that re-pins the caller's threads with sched_setaffinity as
//! NCCL 2.29 did (leaking its GPU's wider mask) and as 2.30 does (restoring
//! the caller's). The stand-in measures from inside how long each of its
//! threads spent outside the rank's CPUs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::run::{bin, text};

/// How long a test waits for an event (a thread placed, a holder gone):
/// a bound against a hang, not a time the event must beat, so a loaded
/// machine only makes the test slower (issue 60: a 2 s bound failed at load
/// 5-8).
pub(super) const EVENT: Duration = Duration::from_secs(30);

/// `f`'s first answer within `limit` (tried every 20 ms).
pub(super) fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rank 0 of `plan -n 1 --roles --json` on this machine.
pub(super) fn roles_rank() -> Value {
    let out = Command::new(bin())
        .args(["plan", "-n", "1", "--roles", "--json"])
        .output()
        .unwrap();
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    p["ranks"][0].clone()
}

/// A process's (or thread's, `PID/task/TID`) affinity as /proc shows it.
fn mask_of(proc_path: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{proc_path}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// `top --once --json` of the run whose pid is `sup`, over 0.2 s.
fn top_of(sup: &str) -> Option<Value> {
    let out = Command::new(bin())
        .args(["top", "--once", "--json", "--interval", "0.2", "--pid", sup])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The stand-in library, built once.
fn standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        super::build_support(
            "comm-standin/comm-standin.c",
            "comm-standin.so",
            &["-shared", "-fPIC", "-pthread"],
        )
    })
}

/// `threadwise run ARGS -- env LD_PRELOAD=standin sleep SECS+0.5`, the
/// stand-in in `style` reporting after `secs`.
fn run_standin(args: &[&str], style: &str, secs: f64) -> Command {
    let mut c = Command::new(bin());
    c.arg("run")
        .args(args)
        .arg("--")
        .arg("env")
        .arg(format!("LD_PRELOAD={}", standin().display()))
        .args(["sleep", &format!("{}", secs + 0.5)])
        .env("STANDIN_STYLE", style)
        .env("STANDIN_SECONDS", secs.to_string());
    c
}

/// The stand-in's report of one thread: (rank, name, its longest time
/// outside in seconds, how many times it was outside, back, mask now).
#[derive(Debug)]
#[allow(dead_code)] // `name` is for the failure messages
struct Report {
    rank: String,
    name: String,
    outside: f64,
    times: u32,
    back: bool,
    mask: String,
}

/// One report line, after "standin: tid ", of rank `rank`.
fn report(rank: &str, rest: &str) -> Option<Report> {
    Some(Report {
        rank: rank.to_string(),
        name: rest.split('\'').nth(1)?.to_string(),
        outside: rest
            .split("outside for ")
            .nth(1)?
            .split(' ')
            .next()?
            .parse()
            .ok()?,
        times: rest
            .split(" time(s)")
            .next()?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()?,
        back: rest.contains("(back: yes)"),
        mask: rest.rsplit("mask now ").next()?.to_string(),
    })
}

/// Every report in `run`'s output (each line prefixed with its rank).
fn reports(out: &Output) -> Vec<Report> {
    text(&out.stdout)
        .lines()
        .chain(text(&out.stderr).lines())
        .filter_map(|l| {
            let (rank, rest) = l.split_once("] standin: tid ")?;
            report(rank.trim_start_matches("[rank "), rest)
        })
        .collect()
}

#[test]
fn a_library_leaking_its_wider_mask_has_every_thread_put_back_within_a_second() {
    let out = run_standin(&["-n", "2"], "2.29", 2.0).output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = reports(&out);
    assert_eq!(r.len(), 8, "four threads per rank: {r:?}\n{err}");
    for x in &r {
        // Seen outside on two looks 200 ms apart, then put back: 0.2-0.4 s
        // each time (the service thread leaves twice).
        assert!(x.back && x.outside < 1.0, "{x:?}\n{err}");
        assert_eq!(x.mask, x.rank, "rank N is on CPU N: {x:?}");
    }
    for rank in ["0", "1"] {
        assert!(
            err.contains(&format!("warning: rank {rank}: thread "))
                && err.contains("(comm) was on CPUs"),
            "{err}"
        );
        // One correction per time the stand-in saw a thread outside: 5
        // (main, service twice, progress, helper), or 4 where the service
        // thread re-pinned itself (at 0.3 s) before its first put-back.
        let times: u32 = r.iter().filter(|x| x.rank == rank).map(|x| x.times).sum();
        assert!((4..=5).contains(&times), "{r:?}");
        assert!(
            err.contains(&format!(
                "threadwise: rank {rank}: {times} correction(s) of thread(s)"
            )),
            "as many as the stand-in saw ({times}): {err}"
        );
    }
    assert!(err.contains("'NCCL Service  0' (comm)"), "{err}");
}

#[test]
fn a_library_that_restores_the_callers_mask_is_left_alone() {
    let out = run_standin(&["-n", "2"], "2.30", 1.5).output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = reports(&out);
    assert_eq!(r.len(), 8, "{r:?}\n{err}");
    for x in &r {
        assert!(x.back, "{x:?}");
        // Only the caller's 30 ms of init outside (longer on a loaded
        // machine, never as long as the holder's two looks).
        assert!(x.outside < 0.4, "{x:?}");
    }
    assert!(
        !err.contains("outside the rank's"),
        "nothing put back: {err}"
    );
    assert!(!err.contains("correction(s)"), "{err}");
}

#[test]
fn hold_off_only_watches_and_says() {
    let out = run_standin(&["-n", "2", "--hold", "off"], "2.29", 1.0)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = reports(&out);
    assert!(r.iter().all(|x| !x.back), "nothing moved back: {r:?}");
    assert!(err.contains("left there (--hold off"), "{err}");
}

/// Each thread's mask, by name, of process `pid`.
fn masks(pid: u32) -> Vec<(i32, String, String)> {
    let mut out = vec![];
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid: i32 = e.file_name().to_str().unwrap().parse().unwrap();
        let dir = e.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let mask = mask_of(&format!("{pid}/task/{tid}")).unwrap_or_default();
        out.push((tid, name.trim().to_string(), mask));
    }
    out
}

#[test]
fn roles_put_the_service_threads_on_their_core_and_top_lists_them() {
    // One rank over every CPU: main and the NCCL threads on the first core,
    // the unnamed helper on the rest.
    let rank = roles_rank();
    let Some(roles) = rank.get("roles").cloned() else {
        eprintln!("one CPU here: no role layout ({})", rank["reasons"]);
        return;
    };
    let (service, team) = (
        roles["service"].as_str().unwrap().to_string(),
        roles["team"].as_str().unwrap().to_string(),
    );
    // Long enough to outlast any slow look; the test ends it (`end_run`).
    let child = run_standin(&["-n", "1", "--roles"], "2.29", 60.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sup = child.id();
    // The rank: the supervisor's child running sleep with its five threads.
    let rank = poll(EVENT, || {
        // Children are listed under the thread that started them.
        let pid: u32 = std::fs::read_dir(format!("/proc/{sup}/task"))
            .ok()?
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|k| {
                k.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            })?;
        (masks(pid).len() >= 5).then_some(pid)
    })
    .expect("the rank and the stand-in's threads");
    let placed = poll(EVENT, || {
        let m = masks(rank);
        let on = |n: &str| m.iter().find(|x| x.1 == n).map(|x| x.2.clone());
        (on("NCCL Service  0")? == service
            && on("NCCL Progress 0")? == service
            && m.iter().find(|x| x.0 == rank as i32)?.2 == service
            && m.iter()
                .filter(|x| x.1 == "sleep" && x.0 != rank as i32)
                .all(|x| x.2 == team))
        .then_some(m)
    });
    let now = masks(rank);
    assert!(placed.is_some(), "service {service}, team {team}: {now:?}");
    // top, given the run's pid, lists each thread's role and CPUs (the
    // stand-in's service thread re-pins itself at 0.3 s: until the holder's
    // next look it is on the rank's whole set).
    let mut last = Value::Null;
    let settled = poll(EVENT, || {
        let v = top_of(&sup.to_string())?;
        let threads = v["ranks"][0]["by_thread"].as_array()?.clone();
        last = v.clone();
        let n = |role: &str| threads.iter().filter(|t| t["role"] == role).count();
        (n("main") == 1 && n("comm") == 2 && threads.iter().all(|t| t["cpus"] == t["role_cpus"]))
            .then_some(())
    });
    assert!(settled.is_some(), "each thread on its role's CPUs: {last}");
    end_run(child);
}

#[test]
fn top_counts_the_corrections_run_made() {
    let child = run_standin(&["-n", "2"], "2.29", 60.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sup = child.id().to_string();
    let v = poll(EVENT, || {
        let v = top_of(&sup)?;
        let n: u64 = v["ranks"]
            .as_array()?
            .iter()
            .flat_map(|r| r["by_thread"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t["corrections"].as_u64())
            .sum();
        (n >= 8).then_some(v)
    })
    .expect("top sees the corrections");
    let comm = v["ranks"][0]["by_thread"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "NCCL Service  0")
        .cloned()
        .unwrap();
    assert_eq!(comm["role"], "comm");
    assert!(comm["corrections"].as_u64().unwrap() >= 1, "{comm}");
    // Given the ranks' own pids (as `--all` or a live view finds them), top
    // reads the corrections from the run's state file each sample too.
    let pids: Vec<String> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].to_string())
        .collect();
    let out = Command::new(bin())
        .args(["top", "--once", "--json", "--interval", "0.2", "--pid"])
        .args(&pids)
        .output()
        .unwrap();
    let by_pid: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n: u64 = by_pid["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["by_thread"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["corrections"].as_u64())
        .sum();
    assert!(n >= 8, "{by_pid}");
    end_run(child);
}

/// Stops a run the test let live as long as it needed (a fixed lifetime
/// raced the test's own looks on a loaded machine): SIGTERM, then the run
/// must end within its grace and say so.
fn end_run(child: std::process::Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(t.elapsed() < Duration::from_secs(20), "{err}");
    assert!(err.contains("SIGTERM"), "{err}");
}

/// Holders of `pid`: processes named `tw-hold PID` (bind's fork and the
/// hidden `__hold` both name themselves so).
pub(super) fn holders_of(pid: u32) -> usize {
    holder_pids(pid).len()
}

/// The pids of `pid`'s holders.
pub(super) fn holder_pids(pid: u32) -> Vec<u32> {
    let name = format!("tw-hold {pid}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn under_bind_a_holder_of_its_own_puts_the_threads_back_and_ends_with_the_rank() {
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            Command::new(bin())
                .args(["bind", "--"])
                .arg("env")
                .arg(format!("LD_PRELOAD={}", standin().display()))
                .args(["sleep", "2.3"])
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", "2")
                .env("STANDIN_STYLE", "2.29")
                .env("STANDIN_SECONDS", "1.8")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = ranks.iter().map(|c| c.id()).collect();
    // One holder per rank, and no child of the rank's (it forked away).
    let seen = poll(EVENT, || {
        pids.iter().all(|p| holders_of(*p) == 1).then_some(())
    });
    assert!(seen.is_some(), "a holder per rank");
    for p in &pids {
        // (A rank already gone on a slow machine has no children either.)
        let kids: String = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .collect();
        assert!(kids.trim().is_empty(), "rank {p} has children {kids:?}");
    }
    for (r, c) in ranks.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        let reps: Vec<Report> = err
            .lines()
            .filter_map(|l| report(&r.to_string(), l.strip_prefix("standin: tid ")?))
            .collect();
        assert_eq!(reps.len(), 4, "{err}");
        for x in &reps {
            assert!(x.back && x.outside < 1.0, "{x:?}\n{err}");
            assert_eq!(x.mask, x.rank, "{x:?}");
        }
        assert!(
            err.contains(&format!("threadwise: warning: rank {r}: thread ")),
            "{err}"
        );
    }
    // The holders end with their ranks (a tick later).
    let gone = poll(EVENT, || {
        pids.iter().all(|p| holders_of(*p) == 0).then_some(())
    });
    assert!(gone.is_some(), "holders left behind");
}

#[test]
fn the_builtin_workload_under_roles_has_each_named_thread_and_its_workers_placed() {
    let rank = roles_rank();
    let Some(roles) = rank.get("roles").cloned() else {
        eprintln!("one CPU here: no role layout");
        return;
    };
    let (service, team, workers) = (
        roles["service"].as_str().unwrap().to_string(),
        roles["team"].as_str().unwrap().to_string(),
        rank["worker_cpus"].as_str().unwrap().to_string(),
    );
    let child = Command::new(bin())
        .args(["run", "-n", "1", "--roles", "-q", "--"])
        .arg(env!("CARGO_BIN_EXE_threadwise-workload"))
        .args(["--seconds", "4", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sup = child.id().to_string();
    let mut last = Value::Null;
    let placed = poll(EVENT, || {
        let v = top_of(&sup)?;
        last = v.clone();
        let r = &v["ranks"][0];
        let threads = r["by_thread"].as_array()?;
        let on = |name: &str| {
            threads
                .iter()
                .find(|t| t["name"] == name)
                .map(|t| (t["role"].clone(), t["cpus"].clone()))
        };
        let team_ok = threads
            .iter()
            .filter(|t| t["name"] == "tw_intra_op")
            .all(|t| t["role"] == "intra-op" && t["cpus"] == team.as_str());
        let workers_ok = r["workers"]
            .as_array()?
            .iter()
            .all(|w| w["allowed"] == workers.as_str());
        (on("tw_feeder")? == ("main".into(), service.as_str().into())
            && on("tw_comm")? == ("comm".into(), service.as_str().into())
            && team_ok
            && !r["workers"].as_array()?.is_empty()
            && workers_ok)
            .then_some(())
    });
    assert!(
        placed.is_some(),
        "service {service}, team {team}, workers {workers}: {last}"
    );
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("threadwise: figure feeder_p99_us="),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn under_bind_with_roles_the_holder_moves_workers_off_the_service_core() {
    let rank = roles_rank();
    let Some(service) = rank["roles"]["service"].as_str().map(str::to_string) else {
        eprintln!("one CPU here: no role layout");
        return;
    };
    let workers = rank["worker_cpus"].as_str().unwrap().to_string();
    // The rank (bash) waits until the holder has put it on the service
    // core, then forks a worker (a subshell: the same program) and starts
    // sleep (another program, the rank's own work): both inherit the
    // service core, and only the worker is moved.
    // The rank lives until the test is done looking (the file `done`), at
    // most 60 s.
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let mut child = Command::new(bin())
        .args(["bind", "--roles", "--", "bash", "-c"])
        .arg(
            "sleep 0.6; ( while :; do sleep 0.05; done ) & \
             for i in $(seq 1200); do [ -e \"$1\" ] && break; sleep 0.05; done; kill $!",
        )
        .arg("rank")
        .arg(&done)
        .env("LOCAL_RANK", "0")
        .env("LOCAL_WORLD_SIZE", "1")
        .spawn()
        .unwrap();
    let pid = child.id();
    let mask = |p: u32| mask_of(&p.to_string());
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    let mut seen = String::new();
    let moved = poll(EVENT, || {
        let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        let kids: Vec<u32> = kids
            .split_whitespace()
            .filter_map(|k| k.parse().ok())
            .collect();
        let worker = kids.iter().find(|k| exe(**k) == exe(pid))?;
        let other = kids.iter().find(|k| exe(**k) != exe(pid))?;
        seen = format!("worker {:?}, other {:?}", mask(*worker), mask(*other));
        (mask(*worker)? == workers && mask(*other)? == service).then_some(())
    });
    assert!(
        moved.is_some(),
        "the worker on {workers}, sleep on the service core {service}: {seen}"
    );
    assert_eq!(mask(pid).unwrap(), service, "the rank's main thread serves");
    std::fs::write(&done, "").unwrap();
    assert!(child.wait().unwrap().success());
}

/// `__hold` as bind starts it where bind has more than one thread: it forks
/// away at once and holds the process it is given until that ends.
#[test]
fn the_hidden_holder_holds_a_given_process_until_it_ends() {
    let cpus = mask_of("self").unwrap();
    let Some(first) = cpus.split([',', '-']).next().map(str::to_string) else {
        return;
    };
    if first == cpus {
        eprintln!("one CPU here: no wider mask to correct");
        return;
    }
    // The target lives until the test ends it, so "at once" means "before
    // its process ended", not a time a loaded machine may miss.
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = target.id().to_string();
    let st = Command::new(bin())
        .args(["__hold", &pid, "0", &first])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        target.try_wait().unwrap().is_none(),
        "it forked away while its process runs"
    );
    // sleep's mask is all of ours: outside "rank" `first`, put back.
    let back = poll(EVENT, || (mask_of(&pid)? == first).then_some(()));
    assert!(back.is_some(), "put back on {first}");
    assert_eq!(holders_of(target.id()), 1, "holding while it runs");
    target.kill().unwrap();
    target.wait().unwrap();
    let gone = poll(EVENT, || (holders_of(target.id()) == 0).then_some(()));
    assert!(gone.is_some(), "the holder ended with its process");
}
