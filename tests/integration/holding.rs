//! The holder's rules against threads that choose their own CPUs
//! (`tests/support/pinner`, a rank whose threads pin and re-pin themselves
//! with sched_setaffinity, and an OpenMP team bound by OMP_PLACES): a mask
//! the thread or its runtime chose inside the rank is never touched,
//! `--roles` included; a thread that keeps leaving the rank is a fight, said
//! once and bounded; `--hold off` counts a departure once; bind's holder
//! reports to `top` and is never taken for a rank; `top` and `run --top`
//! without a terminal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use super::roles::{EVENT, holder_pids, holders_of, poll, roles_rank};
use super::run::{bin, text};

/// The pinner, built once (with OpenMP).
fn pinner() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::build_support("pinner/pinner.c", "pinner", &["-fopenmp", "-pthread"]))
}

/// Where a role layout can be drawn here (2 CPUs or more for one rank).
fn roles_here() -> bool {
    let r = roles_rank();
    if r["roles"].is_null() {
        eprintln!("one CPU here: no role layout to test");
        return false;
    }
    true
}

/// `threadwise run ARGS -- pinner MODE [WANT]`, its output.
fn run_pinner(args: &[&str], mode: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin())
        .arg("run")
        .args(args)
        .arg("--")
        .arg(pinner())
        .args(mode)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The pinner's lines (after `pinner: `), each rank's.
fn said(out: &Output) -> Vec<String> {
    text(&out.stdout)
        .lines()
        .filter_map(|l| Some(l.split_once("pinner: ")?.1.to_string()))
        .collect()
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn openmp_bound_threads_are_left_alone_under_roles_in_either_order() {
    if !roles_here() {
        return;
    }
    let rank = roles_rank();
    let (service, team) = (
        rank["roles"]["service"].as_str().unwrap().to_string(),
        rank["roles"]["team"].as_str().unwrap().to_string(),
    );
    for places in [
        format!("{{{team}}},{{{service}}}"),
        format!("{{{service}}},{{{team}}}"),
    ] {
        let out = run_pinner(
            &["-n", "1", "--roles"],
            &["omp"],
            &[("OMP_PROC_BIND", "close"), ("OMP_PLACES", &places)],
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        let lines = said(&out);
        assert_eq!(lines.len(), 2, "{lines:?}\n{err}");
        for l in &lines {
            // OpenMP put each thread on its place at birth; nothing moved it.
            assert!(l.ends_with("changed 0"), "OMP_PLACES={places}: {l}\n{err}");
            let start = l
                .split(" start ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap();
            assert!(start == service || start == team, "{l}");
        }
    }
}

#[test]
fn a_threads_own_pin_to_the_service_core_is_left_alone_under_roles() {
    if !roles_here() {
        return;
    }
    let out = run_pinner(&["-n", "1", "--roles"], &["pin"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines = said(&out);
    assert_eq!(lines.len(), 1, "{lines:?}\n{err}");
    assert!(lines[0].ends_with("moved 0"), "{lines:?}\n{err}");
    assert_eq!(
        count(&err, "inside the rank after threadwise placed it"),
        1,
        "{err}"
    );
}

#[test]
fn a_thread_repinning_itself_to_the_ranks_set_under_roles_is_said_once_and_left() {
    if !roles_here() {
        return;
    }
    let out = run_pinner(&["-n", "1", "--roles"], &["repin"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines = said(&out);
    assert_eq!(lines, ["repin moved-back 0"], "{err}");
    assert_eq!(count(&err, "set its own CPUs"), 1, "{err}");
    assert!(
        err.contains("rank 0: 1 thread(s) set their own CPUs inside the rank"),
        "{err}"
    );
}

/// Two ranks of one CPU each, or None here.
fn two_ranks() -> bool {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        eprintln!("one CPU here: no rank to leave");
    }
    n >= 2
}

#[test]
fn a_fight_under_run_is_said_once_and_bounded_at_three_put_backs() {
    if !two_ranks() {
        return;
    }
    let out = run_pinner(&["-n", "2"], &["wide", "3"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines = said(&out);
    assert_eq!(lines, ["wide put-back 3", "wide put-back 3"], "{err}");
    for r in 0..2 {
        assert_eq!(
            count(&err, &format!("warning: rank {r}: thread ")),
            4,
            "{err}"
        );
        assert!(
            err.contains(&format!("rank {r}: 3 correction(s), 1 fight(s)")),
            "{err}"
        );
    }
    assert_eq!(
        count(&err, "a fight with whatever re-pins it; left there now"),
        2,
        "{err}"
    );
}

#[test]
fn a_fight_under_hold_always_is_said_once_and_held_on() {
    if !two_ranks() {
        return;
    }
    let out = run_pinner(&["-n", "2", "--hold", "always"], &["wide", "5"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    for l in said(&out) {
        let n: u32 = l.trim_start_matches("wide put-back ").parse().unwrap();
        assert!(n >= 5, "{l}\n{err}");
    }
    // Three put-backs said, then the fight, then nothing more.
    assert_eq!(count(&err, "outside the rank's: put back on"), 6, "{err}");
    assert_eq!(count(&err, "held on (--hold always)"), 2, "{err}");
}

#[test]
fn a_fight_under_bind_is_said_once_and_bounded_and_summed_up() {
    if !two_ranks() {
        return;
    }
    let out = Command::new(bin())
        .args(["bind", "--"])
        .arg(pinner())
        .args(["wide", "3"])
        .env("LOCAL_RANK", "1")
        .env("LOCAL_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(said(&out), ["wide put-back 3"], "{err}");
    assert_eq!(count(&err, "warning: rank 1: thread "), 4, "{err}");
    assert_eq!(count(&err, "a fight with whatever re-pins it"), 1, "{err}");
    // The holder's summary at the rank's end, as run's.
    assert!(err.contains("rank 1: 3 correction(s), 1 fight(s)"), "{err}");
}

#[test]
fn hold_off_counts_one_departure_once() {
    if !two_ranks() {
        return;
    }
    let out = run_pinner(&["-n", "2", "--hold", "off"], &["leave"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        said(&out),
        ["leave stayed yes", "leave stayed yes"],
        "{err}"
    );
    assert_eq!(count(&err, "left there (--hold off"), 2, "{err}");
    for r in 0..2 {
        assert!(
            err.contains(&format!("rank {r}: 1 departure(s) seen, nothing set")),
            "{err}"
        );
    }
    assert!(!err.contains("correction(s)"), "{err}");
}

#[test]
fn binds_corrections_reach_top_and_its_holder_is_no_rank() {
    if !two_ranks() {
        return;
    }
    let tmp = super::scratch();
    let done = tmp.path().join("done");
    let mut child = Command::new(bin())
        .args(["bind", "--"])
        .arg(pinner())
        .args(["wide", "1"])
        .env("LOCAL_RANK", "0")
        .env("LOCAL_WORLD_SIZE", "2")
        .env("PINNER_DONE", &done)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let holder = poll(EVENT, || holder_pids(pid).first().copied()).expect("a holder");
    // Its command line names itself, not the rank's command.
    let cmdline = std::fs::read(format!("/proc/{holder}/cmdline")).unwrap();
    let first = cmdline.split(|b| *b == 0).next().unwrap();
    assert_eq!(first, format!("tw-hold {pid}").as_bytes());
    // top sees the correction the holder made.
    let fixed = poll(EVENT, || {
        let out = Command::new(bin())
            .args(["top", "--once", "--json", "--interval", "0.2", "--pid"])
            .arg(pid.to_string())
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let n: u64 = v["ranks"][0]["by_thread"]
            .as_array()?
            .iter()
            .filter_map(|t| t["corrections"].as_u64())
            .sum();
        (n >= 1).then_some(n)
    });
    assert!(fixed.is_some(), "top never saw bind's correction");
    // top --all lists the rank, and never its holder.
    let out = Command::new(bin())
        .args(["top", "--all", "--once", "--json", "--interval", "0.1"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pids: Vec<u64> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    assert!(pids.contains(&u64::from(pid)), "{pids:?}");
    assert!(
        !pids.contains(&u64::from(holder)),
        "the holder listed as a rank: {pids:?}"
    );
    std::fs::write(&done, "").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(poll(EVENT, || (holders_of(pid) == 0).then_some(())).is_some());
}

#[test]
fn run_top_without_a_terminal_shows_every_line_instead() {
    let out = Command::new(bin())
        .args([
            "run",
            "-n",
            "1",
            "--top",
            "--",
            "sh",
            "-c",
            "echo hello; echo world",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (o, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{err}");
    assert!(o.contains("hello") && o.contains("world"), "{o}\n{err}");
    assert!(
        err.contains("--top: standard output is not a terminal"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn top_without_a_terminal_is_a_usage_error_not_a_panic() {
    let out = Command::new(bin())
        .arg("top")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: top's live view needs a terminal"),
        "{err}"
    );
    assert!(err.contains("hint: use --once"), "{err}");
}
