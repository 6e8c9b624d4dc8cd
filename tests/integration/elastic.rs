//! An elastic job (`--nnodes 2:3`) of real `threadwise run` agents on
//! loopback: two form it, a third joins (the ranks restart in a world of 3),
//! one is SIGKILLed (the survivors go on in a world of 2), the script
//! finishes where its checkpoint says and the survivors exit 0. The same
//! through `PET_NNODES=2:3`, as Kubeflow's elastic PyTorchJob gives it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The training script: every rank notes its start (world, rank, restart
/// count, time); rank 0 logs one line per step to the log, which is also
/// the checkpoint (the steps done are its lines, each written whole by one
/// append), so a restarted round resumes where the last one stopped and no
/// step is logged twice. Every rank exits 0 once STEPS are logged.
const SCRIPT: &str = r#"
import os, sys, time
d = sys.argv[1]; steps = int(sys.argv[2])
log = os.path.join(d, "steps.log")
def done():
    try:
        with open(log) as f: return sum(1 for _ in f)
    except FileNotFoundError: return 0
w, r = os.environ["WORLD_SIZE"], os.environ["RANK"]
with open(os.path.join(d, "starts.log"), "a") as f:
    f.write(f"{time.time():.3f} world {w} rank {r} restart {os.environ['TORCHELASTIC_RESTART_COUNT']} group {os.environ['GROUP_RANK']} of {os.environ['GROUP_WORLD_SIZE']}\n")
while done() < steps:
    time.sleep(0.1)
    if r == "0":
        s = done()
        if s < steps:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"step {s} world {w} loss {1.0 / (s + 1):.4f}\n".encode())
            os.close(fd)
"#;

/// The job's shared secret; the intruder's differs.
const SECRET: &str = "elastic-job-secret-0123456789";

fn agent(dir: &Path, port: u16, name: &str, via_env: bool, steps: usize) -> Child {
    agent_with(dir, port, name, via_env, steps, SECRET)
}

fn agent_with(
    dir: &Path,
    port: u16,
    name: &str,
    via_env: bool,
    steps: usize,
    secret: &str,
) -> Child {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("threadwise"));
    c.arg("run");
    if via_env {
        c.env("PET_NNODES", "2:3")
            .env("PET_MAX_RESTARTS", "3")
            .env("PET_RDZV_ENDPOINT", format!("127.0.0.1:{port}"))
            .env("PET_RDZV_CONF", "last_call_timeout=1.5")
            .env("PET_NPROC_PER_NODE", "1");
    } else {
        c.args(["--nnodes", "2:3", "--max-restarts", "3", "-n", "1"])
            .arg(format!("--rdzv-endpoint=127.0.0.1:{port}"))
            .args(["--rdzv-conf", "last_call_timeout=1.5"]);
    }
    c.args([
        "--rdzv-id",
        "elastic",
        "--grace",
        "3",
        "--heartbeat-timeout",
        "5",
    ])
    .arg("--log-dir")
    .arg(dir.join(format!("logs-{name}")))
    .args(["--", "python3", "-u"])
    .arg(dir.join("train.py"))
    .arg(dir)
    .arg(steps.to_string())
    .env_remove("SLURM_JOB_ID")
    .env("THREADWISE_RDZV_SECRET", secret)
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(dir.join(format!("{name}.stderr"))).unwrap())
    .spawn()
    .unwrap()
}

/// The ranks' starts so far: (time, world size).
fn starts(dir: &Path) -> Vec<(f64, usize)> {
    std::fs::read_to_string(dir.join("starts.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.parse().ok()?, w.get(2)?.parse().ok()?))
        })
        .collect()
}

/// Wait (bounded) for a rank start of a world of `world` after `after`.
fn wait_world(dir: &Path, world: usize, after: f64, limit: Duration) -> Option<f64> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some((t, _)) = starts(dir)
            .into_iter()
            .find(|(t, w)| *w == world && *t >= after)
        {
            return Some(t);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn stderr(dir: &Path) -> String {
    ["a", "b", "c"]
        .iter()
        .map(|n| {
            format!(
                "--- {n}:\n{}",
                std::fs::read_to_string(dir.join(format!("{n}.stderr"))).unwrap_or_default()
            )
        })
        .collect()
}

/// Grow 2 -> 3, lose one (SIGKILL) -> 2, finish; the figures, for the docs.
fn grow_shrink_finish(via_env: bool) {
    let dir = super::scratch();
    let d: PathBuf = dir.path().to_path_buf();
    std::fs::write(d.join("train.py"), SCRIPT).unwrap();
    let port = super::free_port();
    let steps = 60;
    let t_start = now();
    let mut a = agent(&d, port, "a", via_env, steps);
    std::thread::sleep(Duration::from_millis(300));
    let mut b = agent(&d, port, "b", via_env, steps);
    let formed = wait_world(&d, 2, t_start, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no world of 2 formed\n{}", stderr(&d)));
    // A newcomer must prove itself like any node: one without the job's
    // secret is turned away and changes nothing (no round restarts).
    let mut intruder = agent_with(
        &d,
        port,
        "x",
        via_env,
        steps,
        "not-the-job-secret-987654321",
    );
    let (code, _) = super::hosts::finish(&mut intruder, Duration::from_secs(15));
    assert_eq!(
        code,
        3,
        "{}",
        std::fs::read_to_string(d.join("x.stderr")).unwrap()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(starts(&d).len(), 2, "the intruder restarted the round");
    let joined_at = now();
    let mut c = agent(&d, port, "c", via_env, steps);
    let grown = wait_world(&d, 3, joined_at, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no world of 3 after the join\n{}", stderr(&d)));
    std::thread::sleep(Duration::from_millis(800));
    // top follows the job into its new round: every rank of the world of 3
    // (the ranks whose command line runs this test's script).
    let top = Command::new(assert_cmd::cargo::cargo_bin("threadwise"))
        .args(["top", "--all", "--once", "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap_or_default();
    let script = d.join("train.py").display().to_string();
    let ours: Vec<u64> = doc["ranks"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|x| x["pid"].as_u64())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&script))
        })
        .collect();
    assert_eq!(ours.len(), 3, "top saw {doc}");
    let killed_at = now();
    c.kill().unwrap();
    let _ = c.wait();
    let shrunk = wait_world(&d, 2, killed_at, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no world of 2 after the kill\n{}", stderr(&d)));
    let [(ca, _), (cb, _)] =
        super::hosts::finish_all([&mut a, &mut b], Instant::now(), Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "{}", stderr(&d));
    // Every step logged once, in order; worlds as the rounds were.
    let log = std::fs::read_to_string(d.join("steps.log")).unwrap();
    let steps_seen: Vec<usize> = log
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(steps_seen, (0..steps).collect::<Vec<_>>(), "{log}");
    for w in ["world 2", "world 3"] {
        assert!(log.contains(w), "no step in a {w}: {log}");
    }
    // The rounds' starts: 2, then 3, then 2; restart counts 0, 0, 1.
    let text = std::fs::read_to_string(d.join("starts.log")).unwrap();
    assert!(
        text.contains("world 3 rank 2 restart 0 group 2 of 3"),
        "{text}"
    );
    assert!(
        text.contains("world 2 rank 1 restart 1 group 1 of 2"),
        "{text}"
    );
    // Nothing left running: no rank of this job's script.
    std::thread::sleep(Duration::from_millis(300));
    let ps = Command::new("pgrep")
        .args(["-f", &d.join("train.py").display().to_string()])
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "left running: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
    // The join restarted the ranks without counting; the loss counted one.
    let said = std::fs::read_to_string(d.join("a.stderr")).unwrap();
    for round in ["(round 1; restarts 0 of 3)", "(round 2; restarts 1 of 3)"] {
        assert!(said.contains(round), "{round}: {said}");
    }
    eprintln!(
        "elastic (via {}): world 2 formed {:.2} s after the first agent started; a join to the \
         world of 3's first rank start {:.2} s; SIGKILL to the world of 2's first rank start {:.2} s",
        if via_env { "PET_*" } else { "flags" },
        formed - t_start,
        grown - joined_at,
        shrunk - killed_at
    );
}

#[test]
fn an_elastic_job_grows_shrinks_and_finishes() {
    grow_shrink_finish(false);
}

#[test]
fn an_elastic_job_from_kubeflows_environment() {
    grow_shrink_finish(true);
}
