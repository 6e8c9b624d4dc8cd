//! Every signal a user or a batch system sends `threadwise run`, with real
//! processes: what the ranks receive, our exit code, and that nothing is left.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::run::{bin, spawn_run, survivors, text};
use super::wait_for;

fn kill(child: &std::process::Child, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Ranks that note the signals they get in DIR/rank-$RANK.
fn noting_ranks(dir: &std::path::Path, marker: &str) -> String {
    format!(
        "f={}/r$RANK; for s in USR1 USR2 TERM CONT; do trap \"echo $s >> $f\" $s; done; \
         trap 'echo TERM >> $f; exit 0' TERM; echo up >> $f; \
         while :; do sleep 0.02; done # {marker}",
        dir.display()
    )
}

fn noted(dir: &std::path::Path, rank: usize) -> String {
    std::fs::read_to_string(dir.join(format!("r{rank}"))).unwrap_or_default()
}

#[test]
fn usr1_and_usr2_reach_every_rank_and_the_run_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let marker = "tw-usr-5521";
    let child = spawn_run(
        &["-n", "2", "-q"],
        &noting_ranks(d.path(), marker),
        Stdio::piped(),
    );
    wait_for("ranks up", Duration::from_secs(5), || {
        (0..2).all(|r| noted(d.path(), r).contains("up"))
    });
    kill(&child, libc::SIGUSR1);
    kill(&child, libc::SIGUSR2);
    wait_for("USR1 and USR2 noted", Duration::from_secs(5), || {
        (0..2).all(|r| noted(d.path(), r).contains("USR1") && noted(d.path(), r).contains("USR2"))
    });
    assert!(
        survivors(marker).len() >= 2,
        "the ranks go on after USR1/USR2"
    );
    kill(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        text(&out.stderr)
    );
    assert!(survivors(marker).is_empty());
}

#[test]
fn sigquit_stops_like_sigterm_with_grace_and_summary() {
    let d = tempfile::tempdir().unwrap();
    let marker = "tw-quit-5522";
    let child = spawn_run(
        &["-n", "2"],
        &noting_ranks(d.path(), marker),
        Stdio::piped(),
    );
    wait_for("ranks up", Duration::from_secs(5), || {
        (0..2).all(|r| noted(d.path(), r).contains("up"))
    });
    kill(&child, libc::SIGQUIT);
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGQUIT), "{err}");
    assert!(err.contains("stopped by SIGQUIT"), "{err}");
    assert!(err.contains("rank(s) in"), "the summary is printed: {err}");
    for r in 0..2 {
        assert!(noted(d.path(), r).contains("TERM"), "rank {r} got SIGTERM");
    }
    assert!(survivors(marker).is_empty());
}

/// Process state letter of every process whose command line holds `marker`.
fn states(marker: &str) -> Vec<char> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(cmd) = std::fs::read(format!("/proc/{name}/cmdline")) else {
            continue;
        };
        let argv0 = text(cmd.split(|b| *b == 0).next().unwrap_or_default());
        if name.parse::<u32>().is_err()
            || argv0.ends_with("threadwise")
            || !text(&cmd).contains(marker)
        {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).unwrap_or_default();
        if let Some(s) = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.trim_start().chars().next())
        {
            out.push(s);
        }
    }
    out
}

#[test]
fn ctrl_z_stops_the_ranks_and_fg_continues_them() {
    let marker = "tw-tstp-5523";
    let child = spawn_run(
        &["-n", "2", "-q"],
        &format!("while :; do sleep 0.02; done # {marker}"),
        Stdio::null(),
    );
    wait_for("ranks up", Duration::from_secs(5), || {
        states(marker).len() >= 2
    });
    kill(&child, libc::SIGTSTP);
    wait_for("ranks stopped", Duration::from_secs(5), || {
        let s = states(marker);
        !s.is_empty() && s.iter().all(|c| *c == 'T')
    });
    // threadwise stops itself once it has stopped the ranks: a moment later.
    wait_for("threadwise stopped too", Duration::from_secs(5), || {
        let me = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        me.rsplit(')').next().unwrap().trim_start().starts_with('T')
    });
    kill(&child, libc::SIGCONT);
    wait_for("ranks running again", Duration::from_secs(5), || {
        let s = states(marker);
        !s.is_empty() && s.iter().all(|c| *c != 'T')
    });
    kill(&child, libc::SIGTERM);
    let mut child = child;
    assert_eq!(child.wait().unwrap().code(), Some(128 + libc::SIGTERM));
    assert!(survivors(marker).is_empty());
}

#[test]
fn nohup_keeps_sighup_ignored_for_us_and_the_ranks() {
    let d = tempfile::tempdir().unwrap();
    let marker = "tw-nohup-5524";
    // The ranks write their ignored-signal mask (SigIgn, hex) to DIR/r$RANK,
    // and note SIGUSR1 in DIR/u$RANK.
    let script = format!(
        "trap 'echo USR1 >> {0}/u$RANK' USR1; \
         awk '/^SigIgn/ {{print $2}}' /proc/$$/status > {0}/r$RANK; \
         while :; do sleep 0.02; done # {marker}",
        d.path().display()
    );
    let child = Command::new("nohup")
        .arg(bin())
        .args(["run", "-n", "2", "-q", "--", "bash", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("ranks up", Duration::from_secs(5), || {
        (0..2).all(|r| !noted(d.path(), r).trim().is_empty())
    });
    kill(&child, libc::SIGHUP);
    // A later signal reaching the ranks shows the SIGHUP was handled first
    // (a pending SIGHUP, the lower number, is delivered before SIGUSR1).
    kill(&child, libc::SIGUSR1);
    wait_for(
        "SIGUSR1 forwarded after the SIGHUP",
        Duration::from_secs(5),
        || (0..2).all(|r| d.path().join(format!("u{r}")).exists()),
    );
    assert!(
        survivors(marker).len() >= 2,
        "SIGHUP under nohup stops nothing"
    );
    for r in 0..2 {
        let mask = u64::from_str_radix(noted(d.path(), r).trim(), 16).unwrap();
        assert!(
            mask & (1 << (libc::SIGHUP - 1)) != 0,
            "rank {r} ignores SIGHUP: {mask:x}"
        );
    }
    kill(&child, libc::SIGTERM);
    let mut child = child;
    assert_eq!(child.wait().unwrap().code(), Some(128 + libc::SIGTERM));
    assert!(survivors(marker).is_empty());
}
