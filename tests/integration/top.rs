//! `threadwise top` on real ranks: the built-in workload under `run`, checked
//! against its plan; ranks made to misbehave so each alert fires; and `--all`
//! finding ranks of a torchrun-style launcher with `threadwise bind` and of a
//! real `srun`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::run::{bin, text};
use super::wait_for;

/// Threads of a live process.
fn threads_of(pid: &Value) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Children of a process's main thread.
fn children_of(pid: i64) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map_or(0, |s| s.split_whitespace().count())
}

/// The CPU a process last ran on (field 39 of /proc/PID/stat).
fn last_cpu(pid: i64) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis start at field 3.
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(39 - 3)
        .map(str::to_string)
}

fn top(args: &[&str]) -> Value {
    let out = Command::new(bin())
        .args(["top", "--once", "--json", "--interval", "0.5"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `threadwise run` that is stopped (SIGTERM, which stops its ranks) when
/// dropped, so a failing assertion leaves no busy rank behind.
struct Run(Child);

impl Run {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // SAFETY: plain syscall.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn start(args: &[&str]) -> Run {
    Run(Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap())
}

fn stop(r: Run) {
    drop(r);
}

/// The run's state file names its ranks (`top` without arguments finds them).
fn wait_for_run(pid: u32) -> Value {
    let t = Instant::now();
    loop {
        let f = std::path::PathBuf::from(format!("/tmp/threadwise-0/run-{pid}.json"));
        let xdg = std::env::var("XDG_RUNTIME_DIR")
            .map(|d| std::path::PathBuf::from(d).join(format!("threadwise/run-{pid}.json")));
        // (run falls back to /tmp when XDG_RUNTIME_DIR is no directory.)
        for f in [Some(f), xdg.ok()].into_iter().flatten() {
            if let Ok(s) = std::fs::read_to_string(&f) {
                return serde_json::from_str(&s).unwrap();
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no state file for run {pid}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn top_of_the_builtin_workload_matches_its_plan() {
    let workload = assert_cmd::cargo::cargo_bin("threadwise-workload");
    let run = start(&[
        "run",
        "-n",
        "2",
        "-q",
        "--",
        workload.to_str().unwrap(),
        "--seconds",
        "8",
    ]);
    let state = wait_for_run(run.id());
    let plan: Value = serde_json::from_slice(
        &super::threadwise()
            .args(["plan", "-n", "2", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    // The ranks' OpenMP threads have started (top counts them).
    wait_for("the ranks' OpenMP threads", Duration::from_secs(10), || {
        (0..2).all(|i| {
            threads_of(&state["ranks"][i]["pid"])
                >= plan["ranks"][i]["threads"].as_u64().unwrap() as usize
        })
    });
    // Other tests' runs may be newer: name this run's ranks (their
    // THREADWISE_* variables give top the plan).
    let pids = |s: &Value| -> Vec<String> {
        s["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["pid"].to_string())
            .collect()
    };
    let p = pids(&state);
    let v = top(&["--pid", &p[0], &p[1]]);
    assert_eq!(v["schema"], "threadwise.top/1");
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["pid"], state["ranks"][i]["pid"], "pid of rank {i}");
        assert_eq!(r["planned"], plan["ranks"][i]["cpus"], "rank {i}");
        assert!(r["alive"].as_bool().unwrap());
        // OpenMP threads: OMP_NUM_THREADS compute threads (the main one included).
        assert!(
            r["threads"].as_u64().unwrap() >= plan["ranks"][i]["threads"].as_u64().unwrap(),
            "{r}"
        );
        let ran: String = r["ran_on"].as_str().unwrap().to_string();
        assert!(
            ran.is_empty() || ran == r["planned"].as_str().unwrap(),
            "rank {i} ran on {ran}"
        );
    }
    assert!(
        v["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["kind"] != "off-plan"),
        "{}",
        v["alerts"]
    );
    stop(run);
}

#[test]
fn misbehaving_ranks_raise_their_alerts() {
    // Four busy processes (the rank's shell and three busy children) on a set of one CPU.
    let busy = "for i in 1 2 3; do (while :; do :; done) & done; while :; do :; done";
    // --hold off: run would otherwise put the moved rank back (roles.rs).
    let run = start(&[
        "run", "-n", "2", "-q", "--hold", "off", "--", "sh", "-c", busy,
    ]);
    let state = wait_for_run(run.id());
    let pid = state["ranks"][1]["pid"].as_i64().unwrap();
    wait_for(
        "rank 1's three busy children",
        Duration::from_secs(5),
        || children_of(pid) >= 3,
    );
    // Move rank 1 off its planned CPU, as a stray taskset or launcher would.
    let other = if state["ranks"][1]["cpus"] == "0" {
        "1"
    } else {
        "0"
    };
    let ok = Command::new("taskset")
        .args(["-p", "-c", other, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    wait_for(
        "rank 1 running on the other CPU",
        Duration::from_secs(5),
        || last_cpu(pid).as_deref() == Some(other),
    );
    let p0 = state["ranks"][0]["pid"].to_string();
    let v = top(&["--pid", &p0, &pid.to_string()]);
    let kinds: Vec<(i64, String)> = v["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["local_rank"].as_i64().unwrap(),
                a["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(kinds.contains(&(0, "oversubscribed".into())), "{kinds:?}");
    assert!(kinds.contains(&(1, "off-plan".into())), "{kinds:?}");
    stop(run);
}

#[test]
fn a_rank_that_exits_is_said_in_the_stream() {
    use std::io::BufRead;
    // Rank 1 ends (exit 0 stops nobody), rank 0 goes on.
    let run = start(&[
        "run",
        "-n",
        "2",
        "-q",
        "--",
        "sh",
        "-c",
        "[ $RANK = 1 ] && sleep 1 || sleep 6",
    ]);
    let state = wait_for_run(run.id());
    let p: Vec<String> = state["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].to_string())
        .collect();
    let mut watch = Command::new(bin())
        .args(["top", "--json", "--interval", "0.3", "--pid", &p[0], &p[1]])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = false;
    for l in lines.take(30) {
        let v: Value = serde_json::from_str(&l.unwrap()).unwrap();
        if v["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["kind"] == "exited" && a["local_rank"] == 1)
        {
            assert_eq!(v["ranks"][0]["alive"], true);
            seen = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    stop(run);
    assert!(seen, "an exited alert for rank 1");
}

#[test]
fn all_finds_torchrun_style_and_srun_ranks() {
    let marker = "tw-top-all-5531";
    // What torchrun gives a rank (its variables), here around threadwise bind.
    let bound = Command::new("env")
        .args([
            "LOCAL_RANK=0",
            "LOCAL_WORLD_SIZE=1",
            "RANK=0",
            "WORLD_SIZE=1",
            "TORCHELASTIC_RUN_ID=x",
        ])
        .arg(bin())
        .args(["bind", "--", "sh", "-c", &format!("sleep 30; : {marker}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let srun = Command::new("srun")
        .args(["-n", "1", "sh", "-c", &format!("sleep 30; : {marker}-srun")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("srun (the test command starts a one-node Slurm)");
    let t = Instant::now();
    let mut found = (false, false);
    while t.elapsed() < Duration::from_secs(20) && !(found.0 && found.1) {
        std::thread::sleep(Duration::from_millis(300));
        let out = Command::new(bin())
            .args(["top", "--all", "--once", "--json", "--interval", "0.2"])
            .output()
            .unwrap();
        let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
            continue;
        };
        for r in v["ranks"].as_array().unwrap() {
            let pid = r["pid"].as_i64().unwrap();
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.contains(&format!("{marker}-srun")) {
                found.1 = true;
            } else if cmd.contains(marker) {
                found.0 = true;
                // bind set THREADWISE_CPUS: the plan's CPUs, not just a mask.
                assert!(!r["planned"].as_str().unwrap().is_empty());
            }
        }
    }
    for mut c in [bound, srun] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = Command::new("pkill").args(["-f", marker]).status();
    assert!(found.0, "the torchrun-style rank under threadwise bind");
    assert!(found.1, "the srun task");
}
