//! A real one-node Slurm (scripts/slurm-single-node.sh, started by the
//! test command): under `srun -n 2` each task arrives already bound to its own
//! CPU by task/affinity; `threadwise bind` must still compute the one node plan
//! every sibling computes and give each task its planned CPUs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn srun(args: &[&str]) -> String {
    let mut child = Command::new("srun")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("srun from Debian's slurm-wlm (the test command starts a one-node Slurm)");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("srun {args:?} did not finish in 90 s (is slurmctld running? sinfo)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "srun {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn srun_tasks_get_their_planned_cpus() {
    let bin = assert_cmd::cargo::cargo_bin("threadwise");
    let bin = bin.to_str().unwrap();
    let show = "echo $SLURM_LOCALID $(grep Cpus_allowed_list /proc/self/status | cut -f2) $OMP_NUM_THREADS $RANK/$WORLD_SIZE";
    // What Slurm alone does: every task on its own CPU, threads unset.
    let plain = srun(&["-n", "2", "sh", "-c", show]);
    assert_eq!(plain.lines().count(), 2, "{plain}");
    let out = srun(&["-n", "2", bin, "bind", "--", "sh", "-c", show]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    // The plan the two tasks share: computed over the step's CPUs.
    let plan = super::threadwise()
        .args(["plan", "-n", "2", "--json"])
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let want: Vec<String> = (0..2)
        .map(|r| {
            let rank = &plan["ranks"][r];
            format!(
                "{r} {} {} {r}/2",
                rank["cpus"].as_str().unwrap(),
                rank["threads"]
            )
        })
        .collect();
    assert_eq!(lines, want);
}

/// `plan --format slurm` with jemalloc: MALLOC_CONF holds commas, which srun's
/// --export would split; the printed line must still give every task the whole
/// value and its planned CPU.
#[test]
fn printed_srun_line_runs_under_real_srun() {
    let out = super::threadwise()
        .args(["plan", "-n", "2", "--allocator", "jemalloc", "--format", "slurm"])
        .args(["--", "sh", "-c"])
        .arg("echo $SLURM_LOCALID $MALLOC_CONF $(grep Cpus_allowed_list /proc/self/status | cut -f2)")
        .output()
        .unwrap();
    let text = super::stdout_ok(out);
    let words = shell_words::split(text.lines().next().unwrap()).unwrap();
    assert_eq!(words[0], "srun");
    let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    let got = srun(&args);
    let mut lines: Vec<&str> = got.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "0 metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1 0",
            "1 metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1 1"
        ],
        "{text}"
    );
}
