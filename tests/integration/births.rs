//! How ranks and the watchdog are born, on every path the kernel may force:
//! clone3 refused (ENOSYS, EPERM) by a real seccomp filter, close_range
//! refused, a cgroup the user may create but not move processes into (a real
//! one, as the user nobody), and a script with no `#!` line on each path.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::run::{bin, survivors, text};
use super::wait_for;

/// `deny-syscall` (tests/support), built once: `deny-syscall NAME ERRNO CMD...`.
pub fn deny_syscall() -> &'static Path {
    static HELPER: OnceLock<PathBuf> = OnceLock::new();
    HELPER.get_or_init(|| super::build_support("deny-syscall/deny-syscall.c", "deny-syscall", &[]))
}

/// `threadwise ARGS` under `deny-syscall CALL ERRNO`, or plainly.
fn threadwise_under(deny: Option<(&str, &str)>) -> Command {
    match deny {
        Some((call, errno)) => {
            let mut c = Command::new(deny_syscall());
            c.args([call, errno]).arg(bin());
            c
        }
        None => Command::new(bin()),
    }
}

/// Does the dry run make a job cgroup here?
fn job_cgroup() -> bool {
    let dry = Command::new(bin())
        .args(["run", "-n", "1", "--dry-run", "--", "true"])
        .output()
        .unwrap();
    text(&dry.stdout).contains("containment: a cgroup v2 per job")
}

#[test]
fn a_script_without_a_shebang_runs_under_sh_on_every_path() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("noshebang");
    std::fs::write(&script, "echo \"ran under sh: $1 $RANK\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Born (clone3), and forked by Command where clone3 is refused.
    for deny in [None, Some(("clone3", "ENOSYS"))] {
        let out = threadwise_under(deny)
            .args(["run", "-n", "2", "-q", "--"])
            .arg(&script)
            .arg("arg1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{deny:?}: {}", text(&out.stderr));
        let s = text(&out.stdout);
        for r in 0..2 {
            assert!(
                s.contains(&format!("[rank {r}] ran under sh: arg1 {r}")),
                "{deny:?}: {s}"
            );
        }
    }
}

/// Where clone3 is refused with EPERM (Docker's profile before 20.10.10),
/// glibc 2.34+ cannot start threads at all: `run` and its dry run say so,
/// with what to do, before anything starts; never a panic.
#[test]
fn clone3_refused_with_eperm_is_said_before_anything_starts() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("started");
    for dry in [true, false] {
        let mut c = threadwise_under(Some(("clone3", "EPERM")));
        c.args(["run", "-n", "2"]);
        if dry {
            c.arg("--dry-run");
        }
        let out = c.args(["--", "touch"]).arg(&marker).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(
            err.contains("error: cannot start a thread: Operation not permitted")
                && err.contains("hint: the container's seccomp profile refuses clone3 with EPERM")
                && !err.contains("panicked"),
            "{err}"
        );
    }
    assert!(!marker.exists(), "nothing started");
}

/// threadwise's children as the kernel lists them.
fn children(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

/// The watchdog: the child of `tw` that is a fork of it (same command line).
fn watchdog_of(tw: u32) -> Option<u32> {
    let cmdline = |p: u32| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
    let me = cmdline(tw);
    children(tw).into_iter().find(|c| cmdline(*c) == me)
}

fn status_field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

/// Start `run -n 2` of ranks that leave a background child and a `setsid`
/// one, under `deny`; check the watchdog (every signal blocked, no handler,
/// only its pipe open); SIGKILL threadwise; nothing of the job may remain.
fn watchdog_cleans_up(deny: Option<(&str, &str)>, marker: &str) {
    let script = format!(
        "bash -c 'sleep 391; : {marker}' & setsid bash -c 'sleep 392; : {marker}' & \
         while :; do sleep 0.05; done # {marker}"
    );
    let mut tw = threadwise_under(deny)
        .args(["run", "-n", "2", "-q", "--", "bash", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "ranks and their children up",
        Duration::from_secs(10),
        || survivors(marker).len() >= 6,
    );
    // Under the wrapper, threadwise is the wrapper's pid (it execs).
    let wd = watchdog_of(tw.id()).expect("a watchdog among threadwise's children");
    // Every signal blocked but the two the kernel never blocks, no handler.
    assert_eq!(status_field(wd, "SigBlk:"), "fffffffffffbfeff", "{deny:?}");
    assert_eq!(status_field(wd, "SigCgt:"), "0000000000000000", "{deny:?}");
    let fds: Vec<_> = std::fs::read_dir(format!("/proc/{wd}/fd"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(fds.len(), 1, "{deny:?}: the watchdog holds its pipe only");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(tw.id() as i32, libc::SIGKILL) };
    tw.wait().unwrap();
    wait_for("nothing left of the run", Duration::from_secs(5), || {
        survivors(marker).is_empty()
    });
    wait_for("the watchdog gone", Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{wd}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    });
}

#[test]
fn the_watchdog_blocks_every_signal_holds_only_its_pipe_and_fires() {
    if !job_cgroup() {
        eprintln!("no job cgroup here: no watchdog");
        return;
    }
    watchdog_cleans_up(None, "tw-wd-plain-4411");
    // close_range refused (a kernel before 5.9, a seccomp filter): the
    // watchdog closes its descriptors one by one, and still fires.
    watchdog_cleans_up(Some(("close_range", "ENOSYS")), "tw-wd-norange-4412");
    watchdog_cleans_up(Some(("close_range", "EPERM")), "tw-wd-norange-4413");
}

fn v2_mount() -> Option<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
}

/// A cgroup the user nobody may create cgroups under (it owns the
/// directory) but not move processes into (root owns its cgroup.procs, which
/// a move needs, as does a birth into it): the unprivileged user.
#[test]
fn ranks_that_cannot_get_into_the_job_cgroup_say_so_and_run_outside_it() {
    if !job_cgroup() || unsafe { libc::geteuid() } != 0 {
        eprintln!("no job cgroup here, or not root");
        return;
    }
    let Some(v2) = v2_mount() else { return };
    let cg = v2.join(format!("tw-test-deleg-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    std::os::unix::fs::chown(&cg, Some(65534), Some(65534)).unwrap();
    // A copy of the binary nobody can run (the checkout may be mode 700).
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tw = d.path().join("threadwise");
    std::fs::copy(bin(), &tw).unwrap();
    let as_nobody = |args: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 \
                 --clear-groups {} {args}",
                cg.display(),
                tw.display()
            ))
            .current_dir(d.path())
            .output()
            .unwrap()
    };
    let dry = as_nobody("run -n 2 --dry-run -- true");
    let dry = text(&dry.stdout);
    let line = dry
        .lines()
        .find(|l| l.starts_with("containment:"))
        .unwrap_or_default();
    assert!(
        line.contains("no job cgroup: ranks can neither be born in a job cgroup under")
            && line.contains("nor moved into it (cgroup.procs: Permission denied"),
        "{dry}"
    );
    let out = as_nobody("run -n 2 -q -- sh -c 'grep ^0:: /proc/self/cgroup'");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ranks can neither be born in a job cgroup")
            && stderr.contains("the ranks run outside it"),
        "{stderr}"
    );
    let name = cg.file_name().unwrap().to_string_lossy().into_owned();
    for r in 0..2 {
        assert!(
            stdout.contains(&format!("[rank {r}] 0::/")) && !stdout.contains("threadwise-"),
            "{stdout}"
        );
        assert!(stdout.contains(&name), "{stdout}");
    }
    // Nothing left: the job cgroup threadwise made was removed.
    let left: Vec<_> = std::fs::read_dir(&cg)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    wait_for("the test cgroup empties", Duration::from_secs(5), || {
        std::fs::remove_dir(&cg).is_ok()
    });
}

/// Where set_mempolicy is refused (Docker's default seccomp profile without
/// CAP_SYS_NICE: EPERM; a kernel without NUMA: ENOSYS), `run` and `bind` go on
/// without the `local` policy (the kernel's default allocates where a thread
/// runs too), keep the CPU binding and say so; an explicit `--mem bind` still
/// stops with the error and the hint.
#[test]
fn a_refused_local_memory_policy_is_given_up_and_said_not_fatal() {
    for errno in ["EPERM", "ENOSYS"] {
        let out = threadwise_under(Some(("set_mempolicy", errno)))
            .args(["run", "-n", "2", "--"])
            .args(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"])
            .output()
            .unwrap();
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{errno}: {o}{e}");
        assert!(
            e.contains("memory policy local not set (set_mempolicy refused:"),
            "{errno}: {e}"
        );
        // Still bound: the two ranks' CPU lists differ (on one CPU, both are it).
        let lists: std::collections::BTreeSet<&str> = o
            .lines()
            .filter_map(|l| l.split_once("Cpus_allowed_list:"))
            .map(|(_, v)| v.trim())
            .collect();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(lists.len(), cpus.min(2), "{errno}: {o}");
        let bind = threadwise_under(Some(("set_mempolicy", errno)))
            .args([
                "bind",
                "--local-rank",
                "0",
                "--local-world-size",
                "2",
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(bind.status.code(), Some(0), "{}", text(&bind.stderr));
        assert!(
            text(&bind.stderr).contains("rank 0: memory policy local not set"),
            "{}",
            text(&bind.stderr)
        );
    }
    let strict = threadwise_under(Some(("set_mempolicy", "EPERM")))
        .args(["run", "-n", "2", "--mem", "bind", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(strict.status.code(), Some(3));
    let e = text(&strict.stderr);
    assert!(
        e.contains("set_mempolicy refused") && e.contains("--allow-unbound"),
        "{e}"
    );
}
