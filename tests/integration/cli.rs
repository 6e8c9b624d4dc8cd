//! The command line's contracts: formats, errors that name the input and say
//! what to do, exit codes.

use super::threadwise;

fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let out = threadwise().args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn impossible_requests_name_what_is_short() {
    let s = ["plan", "--synthetic", "package:1 core:4 pu:2"];
    fn with<'a>(s: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [s, extra].concat()
    }
    fails(
        &with(&s, &["-n", "5"]),
        2,
        &[
            "error: 5 ranks need 5 physical cores but only 4 are allowed (0-7)",
            "hint: ",
        ],
    );
    fails(&with(&s, &["-n", "0"]), 2, &["at least 1"]);
    fails(
        &with(&s, &["--gpus", "3"]),
        2,
        &["GPU 3 does not exist: 0 GPUs are visible"],
    );
    fails(&with(&s, &["-n", "gpu"]), 2, &["no GPU is visible"]);
    fails(
        &["plan", "--synthetic", "core:4 gpu:2", "-n", "3"],
        2,
        &["3 ranks but only 2 GPUs"],
    );
    fails(
        &["plan", "--synthetic", "core:4 allowed:9"],
        2,
        &["allowed set is empty"],
    );
    fails(
        &with(&s, &["-n", "x"]),
        2,
        &["\"x\": expected a number, gpu or auto"],
    );
    fails(
        &with(&s, &["--policy", "bogus"]),
        2,
        &["invalid value 'bogus'"],
    );
    fails(
        &with(&s, &["--threads", "0"]),
        2,
        &["0 threads: give at least 1, or auto"],
    );
    fails(
        &["run", "--master-port", "0", "--", "true"],
        2,
        &["--master-port"],
    );
    fails(&["tune", "--work-size", "0"], 2, &["--work-size"]);
    fails(
        &with(&s, &["--format", "env"]),
        2,
        &["--format env needs --local-rank K (0-0)"],
    );
    fails(
        &with(&s, &["--format", "env", "--local-rank", "9"]),
        2,
        &["--local-rank 9 is out of range"],
    );
    fails(
        &["topo", "--root", "/nonexistent"],
        3,
        &["/nonexistent is not a topology root", "hint: "],
    );
    fails(
        &["topo", "--synthetic", "core:0"],
        3,
        &["invalid synthetic topology"],
    );
    fails(
        &["topo", "--topology", "/nonexistent.xml"],
        3,
        &["cannot read /nonexistent.xml"],
    );
}

#[test]
fn oversubscribe_lets_a_user_insist() {
    let out = threadwise()
        .args([
            "plan",
            "--synthetic",
            "core:2",
            "-n",
            "4",
            "--oversubscribe",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpus: Vec<&str> = p["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cpus"].as_str().unwrap())
        .collect();
    assert_eq!(cpus, ["0", "1", "0", "1"]);
}

#[test]
fn cuda_visible_devices_uuid_is_refused_clearly() {
    let out = threadwise()
        .env("CUDA_VISIBLE_DEVICES", "GPU-8f6c1a2b")
        .args(["plan"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU-8f6c1a2b is a UUID"), "{err}");
}

#[test]
fn env_format_is_shell_source() {
    let out = threadwise()
        .args([
            "plan",
            "--synthetic",
            "core:4",
            "-n",
            "2",
            "--format",
            "env",
            "--local-rank",
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("export OMP_NUM_THREADS=2\n"), "{text}");
    assert!(text.contains("export THREADWISE_CPUS=2-3\n"), "{text}");
    // A shell evaluating it gets the values back.
    let sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{text}\necho \"$THREADWISE_CPUS/$MKL_NUM_THREADS/$CUDA_DEVICE_ORDER\""
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sh.stdout).trim(),
        "2-3/2/PCI_BUS_ID"
    );
}

#[test]
fn taskset_lines_run_for_real() {
    let out = threadwise()
        .args([
            "plan",
            "-n",
            "1",
            "--format",
            "taskset",
            "--",
            "sh",
            "-c",
            "grep Cpus_allowed_list /proc/self/status; echo $OMP_NUM_THREADS",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let run = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&run.stdout);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let n = threadwise::cpuset::CpuSet::parse_list(&online)
        .unwrap()
        .len();
    assert!(
        got.contains(&format!("Cpus_allowed_list:\t0-{}", n - 1)) || n == 1,
        "{line}\n{got}"
    );
    assert!(got.trim_end().ends_with(&n.to_string()), "{got}");
}

#[test]
fn topo_human_view_of_this_machine() {
    let out = threadwise().arg("topo").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("machine: "), "{text}");
    assert!(text.contains("numa node 0: cpus "), "{text}");
    assert!(text.contains("allowed: "), "{text}");
}

#[test]
fn plan_json_has_the_contract_fields() {
    let out = threadwise()
        .args(["plan", "--synthetic", "package:2 core:4 gpu:2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["schema"], "threadwise.plan/1");
    assert_eq!(p["request"]["policy"], "exclusive");
    for r in p["ranks"].as_array().unwrap() {
        for f in [
            "local_rank",
            "cpus",
            "mem_nodes",
            "gpu",
            "threads",
            "workers",
            "env",
            "reasons",
        ] {
            assert!(r.get(f).is_some(), "rank lacks {f}: {r}");
        }
    }
    assert_eq!(p["ranks"][1]["gpu"], "0000:02:00.0");
    assert_eq!(p["ranks"][1]["mem_nodes"], serde_json::json!([1]));
}
