//! `bind`'s holder: `bind` execs the rank and leaves nothing of itself, so a
//! small process of ours holds the rank's threads in place from outside (and
//! under `--roles` moves its DataLoader workers), as `run`'s supervisor does
//! (`proc::hold`, `proc::workers`): this binary's hidden `__hold`, or a fork
//! of bind, started just before the exec. It forks itself away at once (so
//! the rank never has a child of ours to reap or to count), names itself
//! `tw-hold PID` (its command line too), says on the rank's stderr what it
//! finds with run's words and limit, keeps a state file `top` reads, and at
//! the rank's end says its summary and ends within a tick.

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cpuset::CpuSet;
use crate::proc::hold::{Hold, HoldSpec, Holder, Loud, Tally};

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
    mode: Hold,
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
    if spec.runtime_binds {
        a.push("--binds".into());
    }
    a.push(format!("--hold={mode}").into());
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
    mode: Hold,
) -> Result<(), String> {
    let pid = std::process::id() as i32;
    if crate::measure::process::tasks(pid).len() == 1
        && let Some(birth) = started(pid)
    {
        // SAFETY: this process has one thread (just counted); the middle
        // child only forks and leaves by _exit.
        match unsafe { crate::proc::vm::fork_single_threaded() } {
            Err(_) => {}
            Ok(0) => {
                // SAFETY: the middle child has one thread too; the holder
                // leaves by _exit (hold_loop) or falls through to it below.
                if matches!(unsafe { crate::proc::vm::fork_single_threaded() }, Ok(0)) {
                    away(pid);
                    let (spec, workers) = (spec.clone(), workers.cloned());
                    hold_loop(pid, &birth, local_rank, spec, workers, mode);
                }
                // SAFETY: no destructor or atexit handler of bind's runs
                // twice: the copies leave at once.
                unsafe { libc::_exit(0) }
            }
            Ok(child) => {
                let mut status = 0;
                // SAFETY: our own child, waited for once.
                unsafe { libc::waitpid(child, &mut status, 0) };
                return Ok(());
            }
        }
    }
    let me = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let status = Command::new(me)
        .args(args(local_rank, spec, workers, mode))
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
    let mut f = crate::measure::process::stat_fields(&s)?;
    match f.next()? {
        "Z" | "X" => None,
        _ => f.nth(18).map(str::to_string),
    }
}

/// `threadwise __hold PID LOCAL_RANK CPUS [--service=S --team=T]
/// [--workers=W] [--binds] [--hold=MODE]`: fork away, then hold PID's
/// threads (and move its DataLoader workers to W, as `run` does) until it
/// ends.
pub(crate) fn hold_main(
    pid: i32,
    local_rank: usize,
    spec: HoldSpec,
    workers: Option<CpuSet>,
    mode: Hold,
) -> i32 {
    let Some(birth) = started(pid) else {
        return 0; // already gone
    };
    // SAFETY: this process has one thread (nothing started any yet); the
    // parent only returns to exit.
    match unsafe { crate::proc::vm::fork_single_threaded() } {
        Err(_) => return 1,
        Ok(0) => {}
        Ok(_) => return 0,
    }
    away(pid);
    hold_loop(pid, &birth, local_rank, spec, workers, mode)
}

/// Named `tw-hold PID` (what `ps` shows), out of the rank's session (its
/// terminal's Ctrl-C is for the rank), off its stdin and stdout (a launcher
/// waiting for their end waits for the rank's only); stderr stays, for the
/// corrections.
fn away(pid: i32) {
    let title = format!("tw-hold {pid}");
    // Its command line too: `ps` and `pgrep -f` must not take it for the rank.
    crate::os::set_cmdline(&title);
    let name = std::ffi::CString::new(title).unwrap_or_default();
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

/// Hold `pid`'s threads (and move its workers) until it ends, then say the
/// summary and exit.
fn hold_loop(
    pid: i32,
    birth: &str,
    local_rank: usize,
    spec: HoldSpec,
    workers: Option<CpuSet>,
    mode: Hold,
) -> ! {
    let mut state = State::new(pid, local_rank, &spec, workers.as_ref());
    let mut h = Holder::new(spec, mode);
    let mut tally = Tally::default();
    let mut mover = workers.map(|w| crate::proc::workers::Mover::new(crate::os::mask_words(&w)));
    while started(pid).as_deref() == Some(birth) {
        if let Some(m) = &mut mover {
            m.tick(pid);
        }
        for c in h.tick(pid) {
            state.found(&c);
            match tally.add(local_rank, &c) {
                Some((Loud::Warning, line)) => crate::say!("threadwise: warning: {line}"),
                Some((Loud::Note, line)) => crate::say!("threadwise: {line}"),
                None => {}
            }
        }
        std::thread::sleep(TICK);
    }
    for line in tally.summary() {
        crate::say!("threadwise: {line}");
    }
    state.remove();
    // SAFETY: a copy of bind or of `__hold`: nothing of theirs to run at exit.
    unsafe { libc::_exit(0) }
}

/// The holder's state file, for `top`: the rank and its corrections so far.
struct State {
    file: Option<std::path::PathBuf>,
    run: crate::top::find::RunState,
}

impl State {
    fn new(pid: i32, local_rank: usize, spec: &HoldSpec, workers: Option<&CpuSet>) -> State {
        let run = crate::top::find::RunState {
            schema: crate::top::find::STATE_SCHEMA.into(),
            pid: std::process::id() as i32,
            command: vec![format!("tw-hold {pid}")],
            ranks: vec![crate::top::Target {
                local_rank,
                pid,
                cpus: spec.cpus.clone(),
                worker_cpus: workers.cloned().unwrap_or_default(),
                mem_nodes: vec![],
                gpu: None,
                roles: spec.roles.clone(),
                corrections: Default::default(),
            }],
            log_dir: None,
            holder: true,
        };
        // Written at the first correction: most ranks never need one.
        State { file: None, run }
    }

    fn found(&mut self, c: &crate::proc::hold::Correction) {
        if !c.counts() {
            return;
        }
        *self.run.ranks[0].corrections.entry(c.tid).or_default() += 1;
        if let Ok(f) = crate::top::find::write_state(&self.run) {
            self.file = Some(f);
        }
    }

    fn remove(&self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}
