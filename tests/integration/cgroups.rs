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

/// Each rank's cgroup v2 path and CPUs, as it saw them, from `run -n 2`
/// (under `wrapper`, when given), and the dry run's containment line.
fn ranks_cgroups(wrapper: Option<&Path>) -> (String, Vec<String>) {
    let bin = assert_cmd::cargo::cargo_bin("threadwise");
    let cmd = |args: &[&str]| {
        let mut c = match wrapper {
            Some(w) => {
                let mut c = std::process::Command::new(w);
                c.arg(&bin);
                c
            }
            None => std::process::Command::new(&bin),
        };
        c.args(args).output().unwrap()
    };
    let dry = cmd(&["run", "-n", "2", "--dry-run", "--", "true"]);
    let dry = String::from_utf8_lossy(&dry.stdout)
        .lines()
        .find(|l| l.starts_with("containment:"))
        .unwrap_or_default()
        .to_string();
    let out = cmd(&[
        "run",
        "-n",
        "2",
        "-q",
        "--",
        "sh",
        "-c",
        "echo \"$(grep ^0:: /proc/self/cgroup) $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    (dry, lines)
}

#[test]
fn ranks_are_born_in_the_job_cgroup_or_join_it_where_clone3_is_refused() {
    let (dry, ranks) = ranks_cgroups(None);
    if !dry.contains("a cgroup v2 per job") {
        eprintln!("no job cgroup here: {dry}");
        return;
    }
    // Where the kernel allows it (Linux 5.7+), ranks are born in the cgroup.
    assert!(
        dry.contains("ranks are born in it (clone3 CLONE_INTO_CGROUP)"),
        "{dry}"
    );
    let check = |ranks: &[String]| {
        assert_eq!(ranks.len(), 2, "{ranks:?}");
        for (k, l) in ranks.iter().enumerate() {
            // In the job's cgroup, on its own CPU, as before exec.
            assert!(
                l.starts_with(&format!("[rank {k}] 0::/")) && l.contains("/threadwise-"),
                "{l}"
            );
        }
        assert_ne!(
            ranks[0].rsplit(' ').next(),
            ranks[1].rsplit(' ').next(),
            "{ranks:?}"
        );
    };
    check(&ranks);
    // Where clone3 is refused with ENOSYS (today's container profiles, a
    // kernel before 5.3), they join it between fork and exec, as before.
    // (EPERM, the older profiles' answer, stops glibc's own threads:
    // births.rs checks that this is said clearly.)
    let helper = super::births::deny_syscall();
    let wrapper = tempfile::tempdir().unwrap();
    let w = wrapper.path().join("deny");
    std::fs::write(
        &w,
        format!(
            "#!/bin/sh\nexec {} clone3 ENOSYS \"$@\"\n",
            helper.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&w, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (dry, ranks) = ranks_cgroups(Some(&w));
    assert!(
        dry.contains("ranks join it between fork and exec (cgroup.procs; born in it the kernel refuses: Function not implemented"),
        "{dry}"
    );
    check(&ranks);
}
