//! `bind`'s holder: `bind` execs the rank and leaves nothing of itself, so a
//! small process of ours holds the rank's threads in place from outside (and
//! under `--roles` moves its DataLoader workers), as `run`'s supervisor does
//! (`proc::hold`, `proc::workers`): this binary's hidden `__hold`,
//! started just before the exec. It forks itself away at once (so the rank
//! never has a child of ours to reap or to count), says each correction on
//! the rank's stderr, and ends within a tick of the rank.

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cpuset::CpuSet;
use crate::proc::hold::{HoldSpec, Holder};
use crate::roles::RoleCpus;

/// The hidden subcommand the holder runs as.
pub(crate) const HOLD: &str = "__hold";

/// The holder's tick: a look every `hold::EVERY`, an ended rank seen within
/// 100 ms.
const TICK: Duration = Duration::from_millis(100);

/// The arguments of `__hold` for this process as rank `local_rank`, its
/// DataLoader workers to be moved to `workers` (where `run` would move them).
pub(crate) fn args(
    local_rank: usize,
    spec: &HoldSpec,
    workers: Option<&CpuSet>,
    hold: bool,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![
        HOLD.into(),
        std::process::id().to_string().into(),
        local_rank.to_string().into(),
        spec.cpus.to_string().into(),
    ];
    if let Some(l) = &spec.roles {
        a.push(format!("--service={}", l.service).into());
        a.push(format!("--team={}", l.team).into());
    }
    if let Some(w) = workers {
        a.push(format!("--workers={w}").into());
    }
    if !hold {
        a.push("--off".into());
    }
    a
}

/// Start the holder of this process (about to exec as rank `local_rank`):
/// returns once it has forked itself away. Its failure is a warning: the
/// rank runs placed, only unheld. Where this process has one thread (bind's
/// usual case) a double fork of it holds, with no exec (0.3 ms); else this
/// binary's `__hold` does (2-3 ms).
pub(crate) fn start(
    local_rank: usize,
    spec: &HoldSpec,
    workers: Option<&CpuSet>,
    hold: bool,
) -> Result<(), String> {
    let pid = std::process::id() as i32;
    if crate::measure::process::tasks(pid).len() == 1
        && let Some(birth) = started(pid)
    {
        // SAFETY: this process has one thread, so the child may run any
        // code; the middle child only forks and exits.
        match unsafe { libc::fork() } {
            -1 => {}
            0 => {
                // SAFETY: as above.
                if unsafe { libc::fork() } == 0 {
                    away(pid);
                    let (spec, workers) = (spec.clone(), workers.cloned());
                    hold_loop(pid, &birth, local_rank, spec, workers, hold);
                }
                // SAFETY: no destructor or atexit handler of bind's runs
                // twice: the copies leave at once.
                unsafe { libc::_exit(0) }
            }
            child => {
                let mut status = 0;
                // SAFETY: our own child, waited for once.
                unsafe { libc::waitpid(child, &mut status, 0) };
                return Ok(());
            }
        }
    }
    let me = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let status = Command::new(me)
        .args(args(local_rank, spec, workers, hold))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("it ended with {status}")),
    }
}

/// The process's start time (field 22 of /proc/PID/stat) while it runs: a
/// pid reused by another process has another; an ended one (a zombie its
/// launcher has not reaped yet, maybe because it waits for the end of the
/// output we share) has none.
fn started(pid: i32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = s[s.rfind(')')? + 2..].split_whitespace();
    match f.next()? {
        "Z" | "X" => None,
        _ => f.nth(18).map(str::to_string),
    }
}

/// `threadwise __hold PID LOCAL_RANK CPUS [--service=S --team=T]
/// [--workers=W] [--off]`: fork away, then hold PID's threads (and move its
/// DataLoader workers to W, as `run` does) until it ends.
pub(crate) fn hold_main(
    pid: i32,
    local_rank: usize,
    cpus: CpuSet,
    roles: Option<RoleCpus>,
    workers: Option<CpuSet>,
    hold: bool,
) -> i32 {
    let Some(birth) = started(pid) else {
        return 0; // already gone
    };
    // SAFETY: this process has one thread (nothing started any yet); the
    // parent only exits.
    match unsafe { libc::fork() } {
        -1 => return 1,
        0 => {}
        _ => return 0,
    }
    away(pid);
    hold_loop(
        pid,
        &birth,
        local_rank,
        HoldSpec { cpus, roles },
        workers,
        hold,
    )
}

/// Named `tw-hold PID` (what `ps` shows), out of the rank's session (its
/// terminal's Ctrl-C is for the rank), off its stdin and stdout (a launcher
/// waiting for their end waits for the rank's only); stderr stays, for the
/// corrections.
fn away(pid: i32) {
    let name = std::ffi::CString::new(format!("tw-hold {pid}")).unwrap_or_default();
    // SAFETY: plain syscalls on our own descriptors and a NUL-terminated
    // name (the kernel keeps its first 15 bytes).
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// Hold `pid`'s threads (and move its workers) until it ends, then exit.
fn hold_loop(
    pid: i32,
    birth: &str,
    local_rank: usize,
    spec: HoldSpec,
    workers: Option<CpuSet>,
    hold: bool,
) -> ! {
    let mut h = Holder::new(spec, hold);
    let mut mover = workers.map(|w| crate::proc::workers::Mover::new(crate::os::mask_words(&w)));
    while started(pid).as_deref() == Some(birth) {
        if let Some(m) = &mut mover {
            m.tick(pid);
        }
        for c in h.tick(pid) {
            crate::say!(
                "threadwise: warning: {}",
                crate::proc::hold::said(local_rank, &c)
            );
        }
        std::thread::sleep(TICK);
    }
    // SAFETY: a copy of bind or of `__hold`: nothing of theirs to run at exit.
    unsafe { libc::_exit(0) }
}
