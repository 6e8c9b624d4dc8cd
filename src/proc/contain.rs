//! Keeping a job's processes where they can all be found and killed, even
//! when threadwise itself is SIGKILLed or OOM-killed. Where the machine lets
//! us (cgroup v2 writable, kernel 5.14+ for `cgroup.kill`), every rank is born
//! in a cgroup of its own job (`born.rs`), or joins it between fork and exec,
//! before anything else runs in it, so whatever it starts (DataLoader
//! workers, `setsid` daemons) is in it too; where neither is allowed, a line
//! says so. A small watchdog (a fork of ours that makes raw syscalls only, no
//! exec, outside the cgroup, every signal blocked and none with a handler of
//! ours; this binary's `__watchdog DIR` where no such fork can be made) waits
//! on a pipe from us; when the pipe closes, because we ended normally or
//! were killed, it kills the cgroup as a whole and removes it. Elsewhere the
//! process groups, PR_SET_PDEATHSIG and the child subreaper are what contains
//! the ranks (the ranks die with us, but their own children may not).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::vm;

/// The hidden subcommand the watchdog runs as.
pub(crate) const WATCHDOG: &str = "__watchdog";

/// A job's cgroup: its directory open for ranks to be born in
/// (`born.rs`), its `cgroup.procs` open for ranks to join where the kernel
/// refuses that, and its watchdog.
pub(crate) struct JobCgroup {
    dir: PathBuf,
    dir_fd: File,
    procs: File,
    /// How ranks get into it: `BORN` until the kernel refuses a birth,
    /// then `JOINS` if a process can be moved into it, else `NONE`.
    entry: AtomicU8,
    watchdog: Option<Watchdog>,
}

/// How a launch keeps its processes together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Containment {
    /// The job's cgroup, and how ranks get into it.
    Cgroup(PathBuf, Entry),
    /// Why no cgroup: process groups, PDEATHSIG and the subreaper only.
    Fallback(String),
}

/// How a rank gets into the job's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Born in it: clone3 with CLONE_INTO_CGROUP.
    Born,
    /// Forked, then moved through cgroup.procs before exec (why not born).
    Joins(String),
}

impl std::fmt::Display for Containment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Containment::Cgroup(d, entry) => write!(
                f,
                "a cgroup v2 per job ({}), killed as a whole when the job ends or threadwise dies; \
                 {}",
                d.display(),
                match entry {
                    Entry::Born => "ranks are born in it (clone3 CLONE_INTO_CGROUP)".to_string(),
                    Entry::Joins(why) => format!(
                        "ranks join it between fork and exec (cgroup.procs; born in it the \
                         kernel refuses: {why})"
                    ),
                }
            ),
            Containment::Fallback(why) => write!(
                f,
                "process groups, PR_SET_PDEATHSIG and a child subreaper (no job cgroup: {why}); \
                 children of ranks may outlive a SIGKILLed threadwise"
            ),
        }
    }
}

/// The cgroup v2 directory this process is in.
fn own_cgroup() -> Result<PathBuf, String> {
    crate::topology::cgroup::own_v2_dir(Path::new("/"))
}

static JOBS: AtomicUsize = AtomicUsize::new(0);

const BORN: u8 = 0;
const JOINS: u8 = 1;
const NONE: u8 = 2;

/// Can a process be moved into the cgroup whose `cgroup.procs` is `procs`?
/// A child of ours tries.
fn join_probe(procs: RawFd) -> std::io::Result<()> {
    // SAFETY: the child's action is one raw write of static bytes.
    unsafe {
        vm::in_child(None, || {
            vm::raw(
                libc::SYS_write,
                [procs as usize, b"0".as_ptr() as usize, 1, 0],
            )
        })
    }
}

impl JobCgroup {
    /// Create the job cgroup and start its watchdog, or say why not.
    pub(crate) fn create() -> Result<JobCgroup, String> {
        let parent = own_cgroup()?;
        let dir = parent.join(format!(
            "threadwise-{}-{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let fail = |why: String| {
            let _ = std::fs::remove_dir(&dir);
            why
        };
        if !dir.join("cgroup.kill").exists() {
            return Err(fail("the kernel has no cgroup.kill (Linux 5.14+)".into()));
        }
        let procs = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| fail(format!("cannot open cgroup.procs: {e}")))?;
        let dir_fd =
            open_dir(&dir).map_err(|e| fail(format!("cannot open {}: {e}", dir.display())))?;
        let watchdog = Watchdog::start(&dir).map_err(fail)?;
        Ok(JobCgroup {
            dir,
            dir_fd,
            procs,
            entry: AtomicU8::new(BORN),
            watchdog: Some(watchdog),
        })
    }

    /// What `create` would give, for `--dry-run` (creates and removes nothing
    /// but an empty directory).
    pub(crate) fn probe() -> Containment {
        match own_cgroup().and_then(|p| {
            let d = p.join(format!("threadwise-probe-{}", std::process::id()));
            std::fs::create_dir(&d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            let kill = d.join("cgroup.kill").exists();
            // A child born in the probe cgroup that exits at once; else one
            // moved into it.
            let entry = match open_dir(&d).and_then(|f| super::born::probe(f.as_raw_fd())) {
                Ok(()) => Ok(Entry::Born),
                Err(born) => OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .and_then(|f| join_probe(f.as_raw_fd()))
                    .map(|()| Entry::Joins(born.to_string()))
                    .map_err(|e| refused_entry(&p, &born, &e)),
            };
            let _ = std::fs::remove_dir(&d);
            if !kill {
                return Err("the kernel has no cgroup.kill (Linux 5.14+)".to_string());
            }
            Ok((p.join("threadwise-PID-N"), entry?))
        }) {
            Ok((d, entry)) => Containment::Cgroup(d, entry),
            Err(why) => Containment::Fallback(why),
        }
    }

    /// The fd a child writes "0" to, between fork and exec, to join; None
    /// where no process can be moved into the cgroup.
    pub(crate) fn procs_fd(&self) -> Option<i32> {
        (self.entry.load(Ordering::Relaxed) == JOINS).then(|| self.procs.as_raw_fd())
    }

    /// The cgroup's directory, for ranks born in it; None once the kernel
    /// refused that for this job.
    pub(crate) fn birth_fd(&self) -> Option<i32> {
        (self.entry.load(Ordering::Relaxed) == BORN).then(|| self.dir_fd.as_raw_fd())
    }

    /// The kernel refused a birth in the cgroup (`why`): the rest of the
    /// job joins it between fork and exec, where a process can be moved
    /// into it (tried once, here); where not, the ranks run outside it, and
    /// a line on stderr says so (never silently).
    pub(crate) fn no_births(&self, why: &std::io::Error) {
        if self
            .entry
            .compare_exchange(BORN, JOINS, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        if let Err(e) = join_probe(self.procs.as_raw_fd()) {
            self.entry.store(NONE, Ordering::Relaxed);
            let parent = self.dir.parent().unwrap_or(&self.dir);
            crate::say!(
                "threadwise: warning: {}; the ranks run outside it, contained by process groups, \
                 PR_SET_PDEATHSIG and a child subreaper only",
                refused_entry(parent, why, &e)
            );
        }
    }

    /// The watchdog's pid (not ours to kill as an orphan).
    pub(crate) fn watchdog_pid(&self) -> Option<i32> {
        self.watchdog.as_ref().map(Watchdog::pid)
    }

    /// Kill everything in the cgroup and wait (briefly) until it is empty.
    pub(crate) fn kill(&self) {
        kill_dir(&self.dir);
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        kill_dir(&self.dir);
        let _ = std::fs::remove_dir(&self.dir);
        // The watchdog finds the cgroup gone and exits; it is reaped with
        // the next wait4 (or by init once we are gone), not waited for.
        if let Some(Watchdog::Exec(mut w)) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.try_wait();
        }
    }
}

/// The process that kills the job's cgroup once our end of its pipe closes
/// (we ended, or were killed).
enum Watchdog {
    /// A fork of ours that runs `watch_main` (no exec): a process of its own,
    /// with its own memory, so it outlives a SIGKILL, a crash or the OOM
    /// killer's choice of us (which takes every process sharing our memory,
    /// and so would a clone with CLONE_VM, cheaper as it is). It holds only
    /// the pipe's read end; our write end closes with us.
    Forked { pid: i32, _pipe: OwnedFd },
    /// This binary's `__watchdog DIR`, where the build cannot fork so.
    Exec(Child),
}

/// What the forked watchdog reads (its own copy).
struct WatchArgs {
    pipe: RawFd,
    kill: CString,
    dir: CString,
    /// Our handlers' signals, set back to the default in the watchdog.
    handled: Vec<i32>,
    /// One past the highest descriptor we may hold (RLIMIT_NOFILE), for
    /// closing them one by one where close_range(2) is refused.
    fd_limit: usize,
}

/// One past the highest descriptor this process may open (at most 2^20).
fn fd_limit() -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a query into `rl`.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    if ok {
        (rl.rlim_cur as usize).min(1 << 20)
    } else {
        1 << 20
    }
}

impl Watchdog {
    fn start(dir: &Path) -> Result<Watchdog, String> {
        if let Ok(w) = Watchdog::forked(dir) {
            return Ok(w);
        }
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        Command::new(me)
            .arg(WATCHDOG)
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map(Watchdog::Exec)
            .map_err(|e| format!("cannot start the watchdog: {e}"))
    }

    fn forked(dir: &Path) -> std::io::Result<Watchdog> {
        let (read, write) = vm::pipe()?;
        let args = WatchArgs {
            pipe: read.as_raw_fd(),
            kill: vm::cstr(dir.join("cgroup.kill").as_os_str())?,
            dir: vm::cstr(dir.as_os_str())?,
            handled: vm::handled_signals(),
            fd_limit: fd_limit(),
        };
        // SAFETY: the child runs `watch_main`, raw syscalls only, and exits.
        let pid = unsafe { vm::fork(None) }?;
        if pid == 0 {
            // The child: its own copy of `args`, every signal blocked; raw
            // syscalls only.
            watch_main(&args);
        }
        drop(read);
        Ok(Watchdog::Forked { pid, _pipe: write })
    }

    fn pid(&self) -> i32 {
        match self {
            Watchdog::Forked { pid, .. } => *pid,
            Watchdog::Exec(c) => c.id() as i32,
        }
    }
}

/// Every descriptor but `keep` closed: close_range(2), or where that is
/// refused (a kernel before 5.9, a seccomp filter) one by one below `limit`.
/// Raw syscalls only.
fn close_all_but(keep: usize, limit: usize) {
    use libc::{SYS_close, SYS_close_range};
    // SAFETY: closing descriptors of this (forked) process.
    unsafe {
        let low = keep == 0 || vm::raw(SYS_close_range, [0, keep - 1, 0, 0]) == 0;
        let high = vm::raw(SYS_close_range, [keep + 1, u32::MAX as usize, 0, 0]) == 0;
        if !low {
            for fd in 0..keep {
                vm::raw(SYS_close, [fd, 0, 0, 0]);
            }
        }
        if !high {
            for fd in keep + 1..limit.max(keep + 1) {
                vm::raw(SYS_close, [fd, 0, 0, 0]);
            }
        }
    }
}

/// The forked watchdog: in its own process group, every signal blocked and
/// none with a handler of ours, every descriptor closed but its pipe; when
/// the pipe says EOF, kill the cgroup and remove it (retrying while it
/// empties). Raw syscalls only: it is forked from a process that may have
/// other threads (whose locks, the allocator's among them, it must not touch).
fn watch_main(w: &WatchArgs) -> ! {
    use libc::{
        AT_FDCWD, AT_REMOVEDIR, EINTR, ENOENT, O_CLOEXEC, O_WRONLY, SYS_close, SYS_exit,
        SYS_nanosleep, SYS_openat, SYS_read, SYS_setpgid, SYS_unlinkat, SYS_write,
    };
    // SAFETY: each call is a plain syscall on this process's own copy of
    // `w`, on this stack or on static bytes.
    unsafe {
        let pipe = w.pipe as usize;
        vm::default_handlers(&w.handled);
        vm::raw(SYS_setpgid, [0, 0, 0, 0]);
        close_all_but(pipe, w.fd_limit);
        let mut buf = [0u8; 64];
        loop {
            let n = vm::raw(SYS_read, [pipe, buf.as_mut_ptr() as usize, buf.len(), 0]);
            if n != -(EINTR as isize) && n <= 0 {
                break;
            }
        }
        let open = [
            AT_FDCWD as usize,
            w.kill.as_ptr() as usize,
            (O_WRONLY | O_CLOEXEC) as usize,
            0,
        ];
        let fd = vm::raw(SYS_openat, open);
        if fd >= 0 {
            vm::raw(SYS_write, [fd as usize, b"1".as_ptr() as usize, 1, 0]);
            vm::raw(SYS_close, [fd as usize, 0, 0, 0]);
        }
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        for _ in 0..300 {
            let r = vm::raw(
                SYS_unlinkat,
                [
                    AT_FDCWD as usize,
                    w.dir.as_ptr() as usize,
                    AT_REMOVEDIR as usize,
                    0,
                ],
            );
            if r == 0 || r == -(ENOENT as isize) {
                break;
            }
            vm::raw(SYS_nanosleep, [&pause as *const _ as usize, 0, 0, 0]);
        }
        loop {
            vm::raw(SYS_exit, [0, 0, 0, 0]);
        }
    }
}

/// Why ranks cannot get into a job cgroup under `parent`.
fn refused_entry(parent: &Path, born: &std::io::Error, moved: &std::io::Error) -> String {
    format!(
        "ranks can neither be born in a job cgroup under {} ({born}) nor moved into it \
         (cgroup.procs: {moved})",
        parent.display()
    )
}

/// A cgroup's directory, open for clone3's CLONE_INTO_CGROUP.
fn open_dir(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
}

fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|e| e.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

fn kill_dir(dir: &Path) {
    if !populated(dir) {
        return;
    }
    if let Ok(mut f) = OpenOptions::new().write(true).open(dir.join("cgroup.kill")) {
        let _ = f.write_all(b"1");
    }
    let t = Instant::now();
    while populated(dir) && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `threadwise __watchdog DIR`: wait until stdin closes, then kill and remove
/// the cgroup. Terminal signals are ignored: Ctrl-C is for threadwise.
pub(crate) fn watchdog(dir: &Path) -> i32 {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
    ] {
        // SAFETY: setting a signal to SIG_IGN.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kill_dir(dir);
    for _ in 0..100 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    0
}
