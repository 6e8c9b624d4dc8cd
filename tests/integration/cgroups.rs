//! Real cgroups on this machine (we are root): `threadwise topo --json` run
//! inside a cgroup with a 0.5-CPU quota, and inside one with a one-CPU cpuset,
//! reports that budget and that allowed set. Works with cgroup v1 (this
//! machine) and v2.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn mounts() -> String {
    std::fs::read_to_string("/proc/mounts").unwrap()
}

/// The v1 mount point of a controller, if mounted.
fn v1_mount(ctrl: &str) -> Option<PathBuf> {
    mounts().lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == ctrl))
            .then(|| PathBuf::from(f[1]))
    })
}

fn v2_mount() -> Option<PathBuf> {
    mounts().lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    })
}

/// A cgroup directory removed on drop (after the process in it has exited).
struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn make(parent: &Path, tag: &str) -> Cgroup {
    let dir = parent.join(format!("threadwise-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {} (root needed): {e}", dir.display()));
    Cgroup(dir)
}

fn write(dir: &Path, file: &str, value: &str) {
    std::fs::write(dir.join(file), value)
        .unwrap_or_else(|e| panic!("write {value} to {}/{file}: {e}", dir.display()));
}

/// Run `threadwise topo --json` with its process moved into `procs` files first.
fn topo_inside(procs: &[PathBuf]) -> Value {
    let bin = assert_cmd::cargo::cargo_bin("threadwise");
    let mut script = String::new();
    for p in procs {
        script.push_str(&format!("echo $$ > '{}' && ", p.display()));
    }
    script.push_str("exec \"$0\" topo --json");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(bin)
        .output()
        .unwrap();
    serde_json::from_str(&super::stdout_ok(out)).unwrap()
}

fn online() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    threadwise::CpuSet::parse_list(&text).unwrap().len()
}

#[test]
fn cpu_quota_sets_the_budget() {
    let (cg, procs, version) = if let Some(m) = v1_mount("cpu") {
        let cg = make(&m, "quota");
        write(&cg.0, "cpu.cfs_period_us", "100000");
        write(&cg.0, "cpu.cfs_quota_us", "50000");
        let procs = cg.0.join("cgroup.procs");
        (cg, procs, "v1")
    } else {
        let m = v2_mount().expect("a cgroup v1 cpu controller or cgroup v2");
        let _ = std::fs::write(m.join("cgroup.subtree_control"), "+cpu");
        let cg = make(&m, "quota");
        write(&cg.0, "cpu.max", "50000 100000");
        let procs = cg.0.join("cgroup.procs");
        (cg, procs, "v2")
    };
    let t = topo_inside(&[procs]);
    assert_eq!(t["cpu_budget"], 0.5, "{t}");
    assert_eq!(t["limits"]["cpu_quota"], 0.5);
    assert_eq!(t["limits"]["cgroup_version"], version);
    assert!(!t["allowed_cpus"].as_str().unwrap().is_empty());
    drop(cg);
}

#[test]
fn one_cpu_cpuset_sets_the_allowed_set() {
    let last = online() - 1;
    let (cg, procs) = if let Some(m) = v1_mount("cpuset") {
        let cg = make(&m, "cpuset");
        write(
            &cg.0,
            "cpuset.mems",
            &std::fs::read_to_string(m.join("cpuset.mems")).unwrap(),
        );
        write(&cg.0, "cpuset.cpus", &last.to_string());
        let procs = cg.0.join("cgroup.procs");
        (cg, procs)
    } else {
        let m = v2_mount().expect("a cgroup v1 cpuset controller or cgroup v2");
        let _ = std::fs::write(m.join("cgroup.subtree_control"), "+cpuset");
        let cg = make(&m, "cpuset");
        write(&cg.0, "cpuset.cpus", &last.to_string());
        let procs = cg.0.join("cgroup.procs");
        (cg, procs)
    };
    let t = topo_inside(&[procs]);
    assert_eq!(t["allowed_cpus"], last.to_string(), "{t}");
    assert_eq!(t["limits"]["cgroup_cpuset"], last.to_string());
    assert_eq!(t["cpu_budget"], 1.0);
    // The plan follows: one rank on that CPU, and two ranks do not fit.
    let bin = assert_cmd::cargo::cargo_bin("threadwise");
    let run = |n: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > '{}' && exec \"$0\" plan --json -n {n}",
                cg.0.join("cgroup.procs").display()
            ))
            .arg(&bin)
            .output()
            .unwrap()
    };
    let one = run("1");
    assert!(one.status.success());
    let p: Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(p["ranks"][0]["cpus"], last.to_string());
    if online() > 1 {
        let two = run("2");
        assert_eq!(two.status.code(), Some(2));
        let err = String::from_utf8_lossy(&two.stderr);
        assert!(
            err.contains("2 ranks need 2 physical cores but only 1 are allowed"),
            "{err}"
        );
    }
    drop(cg);
}
