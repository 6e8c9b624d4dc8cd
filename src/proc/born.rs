//! Starting a rank as cheaply as a fork can: `clone3` with fork semantics
//! (`vm.rs`; no `CLONE_VM`, no inline assembly), and where there is a job
//! cgroup `CLONE_INTO_CGROUP` (Linux 5.7+, cgroup v2), so no process ever
//! migrates into it (a migration through `cgroup.procs` waits for the
//! kernel's RCU grace period: 19.6 ms of a 22-30 ms launch right after a
//! torchrun run). The child does what `std::process::Command` would with our
//! options (stdin from /dev/null, stdout and stderr to pipes, its own
//! process group, an empty signal mask, SIGPIPE and our handled signals back
//! to default), asks to die with us, takes its placement and execs, as
//! `execvp` does (a file the kernel will not exec, a script without `#!`,
//! runs under /bin/sh); an exec that fails sends its errno back through a
//! close-on-exec pipe. Everything it needs is prepared before the clone:
//! between clone and exec it makes raw syscalls only (our other threads'
//! locks were copied as they stood), and we go on cloning the next rank
//! meanwhile. Where the kernel refuses clone3, the caller falls back to
//! `std::process::Command` (and `cgroup.procs`).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::RankLaunch;
use super::vm::{self, cstr, pipe};

/// Why a birth in place did not happen.
#[derive(Debug)]
pub(crate) enum BirthError {
    /// The kernel (or a seccomp filter) refuses clone3 or the flag: use the
    /// fork-then-join path for this job.
    Refused(std::io::Error),
    /// The rank could not start (an exec or placement error, a pipe).
    Failed(std::io::Error),
}

/// The errnos that mean "not here": no clone3 (ENOSYS, old kernels and
/// seccomp filters), no CLONE_INTO_CGROUP (EINVAL), not allowed (EPERM,
/// EACCES), not a v2 cgroup or not a domain one (EOPNOTSUPP, EBADF).
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSYS
                | libc::EINVAL
                | libc::EPERM
                | libc::EACCES
                | libc::EOPNOTSUPP
                | libc::EBADF
                | libc::E2BIG
        )
    )
}

/// Our environment, read once for several births.
pub(crate) type BaseEnv = BTreeMap<OsString, OsString>;

/// Our environment as it is now (`Command` reads it at each spawn; a launch
/// reads it once, before its first birth).
pub(crate) fn base_env() -> BaseEnv {
    std::env::vars_os().collect()
}

/// The environment `Command` would give: `base` (ours), less `remove`, with `set`.
fn environment(
    base: &BaseEnv,
    remove: &[String],
    set: &BTreeMap<String, String>,
) -> std::io::Result<Vec<CString>> {
    let mut env = base.clone();
    for k in remove {
        env.remove(OsStr::new(k));
    }
    for (k, v) in set {
        env.insert(k.into(), v.into());
    }
    env.iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            cstr(&kv)
        })
        .collect()
}

/// Can ranks be born in the cgroup whose directory is `cgroup`? A child
/// that exits at once, reaped here (for the dry run, before any rank).
pub(crate) fn probe(cgroup: RawFd) -> Result<(), std::io::Error> {
    // SAFETY: the child's action does nothing; it exits at once.
    unsafe { vm::in_child(Some(cgroup), || 0) }
}

/// Set once clone3 was refused with no cgroup asked for (an old kernel, a
/// seccomp filter): the rest of this process's ranks go through `Command`.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// May ranks still be born here (clone3 not refused so far)?
pub(crate) fn allowed() -> bool {
    !REFUSED.load(Ordering::Relaxed)
}

/// What the child reads, all of it prepared before the clone (the child
/// has its own copy).
struct Child {
    path: CString,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_p: Vec<*const libc::c_char>,
    envp_p: Vec<*const libc::c_char>,
    /// `/bin/sh PATH ARGS...`, for a file the kernel will not exec
    /// (ENOEXEC: a script without `#!`), as execvp does.
    sh_argv_p: Vec<*const libc::c_char>,
    /// stdin, stdout, stderr, and the status pipe's write end.
    fds: [RawFd; 4],
    parent: i32,
    cpus: Option<Vec<u64>>,
    mem: Option<(i32, Vec<u64>)>,
    /// The signals we handle (and SIGPIPE, which we ignore): back to the
    /// default in the child before it unblocks them.
    handled: Vec<i32>,
}

/// The shell a file without `#!` runs under.
const SH: &std::ffi::CStr = c"/bin/sh";

/// The child, forked with every signal blocked: raw syscalls only, on its
/// own copy of what `Child` holds (our other threads' locks, the
/// allocator's among them, were copied as they stood).
fn child_main(c: &Child) -> ! {
    use libc::{
        F_SETFD, PR_SET_PDEATHSIG, SIG_SETMASK, SIGKILL, SYS_dup3, SYS_execve, SYS_exit_group,
        SYS_fcntl, SYS_getppid, SYS_prctl, SYS_rt_sigprocmask, SYS_sched_setaffinity,
        SYS_set_mempolicy, SYS_setpgid, SYS_write,
    };
    // SAFETY: every call is a raw syscall on the child's own copy of `c`,
    // on this stack or on static bytes.
    unsafe {
        let status = c.fds[3] as usize;
        let fail = |errno: isize| -> ! {
            let b = (errno as i32).to_ne_bytes();
            vm::raw(SYS_write, [status, b.as_ptr() as usize, b.len(), 0]);
            loop {
                vm::raw(SYS_exit_group, [127, 0, 0, 0]);
            }
        };
        let check = |r: isize| {
            if r < 0 {
                fail(-r)
            }
        };
        vm::default_handlers(&c.handled);
        for (to, from) in c.fds[..3].iter().enumerate() {
            if *from as usize == to {
                // Already in place: only its close-on-exec flag to clear.
                check(vm::raw(SYS_fcntl, [to, F_SETFD as usize, 0, 0]));
            } else {
                check(vm::raw(SYS_dup3, [*from as usize, to, 0, 0]));
            }
        }
        check(vm::raw(SYS_setpgid, [0, 0, 0, 0]));
        check(vm::raw(
            SYS_prctl,
            [PR_SET_PDEATHSIG as usize, SIGKILL as usize, 0, 0],
        ));
        if vm::raw(SYS_getppid, [0; 4]) != c.parent as isize {
            // threadwise ended during the birth.
            fail(libc::ESRCH as isize);
        }
        if let Some(words) = &c.cpus {
            let a = [0, words.len() * 8, words.as_ptr() as usize, 0];
            check(vm::raw(SYS_sched_setaffinity, a));
        }
        if let Some((mode, nodes)) = &c.mem {
            let (ptr, maxnode) = crate::os::mempolicy_args(*mode, nodes);
            check(vm::raw(
                SYS_set_mempolicy,
                [*mode as usize, ptr as usize, maxnode, 0],
            ));
        }
        let empty = 0u64;
        vm::raw(
            SYS_rt_sigprocmask,
            [SIG_SETMASK as usize, &empty as *const u64 as usize, 0, 8],
        );
        let exec = [
            c.path.as_ptr() as usize,
            c.argv_p.as_ptr() as usize,
            c.envp_p.as_ptr() as usize,
            0,
        ];
        let r = vm::raw(SYS_execve, exec);
        if r == -(libc::ENOEXEC as isize) {
            // No format the kernel knows: a shell script without `#!`.
            let sh = [
                SH.as_ptr() as usize,
                c.sh_argv_p.as_ptr() as usize,
                c.envp_p.as_ptr() as usize,
                0,
            ];
            vm::raw(SYS_execve, sh);
        }
        fail(-r)
    }
}

/// A rank cloned, not yet known to have exec'd.
pub(crate) struct Pending {
    pub pid: i32,
    /// The read ends of its stdout and stderr (taken by `born`).
    pipes: Option<(File, File)>,
    status: File,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("pid", &self.pid).finish()
    }
}

impl Pending {
    /// Wait for the status pipe: EOF once the child has exec'd (or died),
    /// or its errno.
    fn wait_status(&mut self) -> Option<i32> {
        let mut buf = [0u8; 4];
        let mut got = 0;
        loop {
            match self.status.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    if got == buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        (got == buf.len()).then(|| i32::from_ne_bytes(buf))
    }

    /// Wait until the rank has exec'd (its status pipe closes): the read
    /// ends of its stdout and stderr; or why it could not (its errno; it
    /// has exited and is reaped here).
    pub(crate) fn born(mut self) -> Result<(File, File), std::io::Error> {
        let errno = self.wait_status();
        if let Some(errno) = errno {
            let mut st = 0;
            // SAFETY: our own child, which has exited or is about to.
            unsafe { libc::waitpid(self.pid, &mut st, 0) };
            return Err(std::io::Error::from_raw_os_error(errno));
        }
        // EOF: the close-on-exec pipe closed at the exec, or the child is dead.
        self.pipes
            .take()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))
    }
}

/// A birth made ready: everything the child reads, and the pipes, made
/// before any rank is cloned. A launch prepares every rank first, then
/// clones them one after another: each clone makes our memory copy-on-write
/// again, so what we write between two clones (an allocation, a free) costs
/// a page fault per page per rank; prepared beforehand and freed after the
/// last clone, it costs one.
pub(crate) struct Prepared {
    child: Child,
    /// Ours and the child's ends: taken by `start`.
    fds: Option<Fds>,
}

/// /dev/null, and the stdout, stderr and status pipes (read end, write end).
type Fds = (File, [(OwnedFd, OwnedFd); 3]);

/// Make ready the birth of `r`, with `parent` as the process it dies with.
/// `handled`: `handled_signals()`, and `base`: `base_env()`, each asked
/// once for several births.
pub(crate) fn prepare(
    r: &RankLaunch,
    parent: i32,
    handled: &[i32],
    base: &BaseEnv,
) -> std::io::Result<Prepared> {
    let path = cstr(
        r.program
            .as_deref()
            .map_or(r.argv[0].as_os_str(), |p| p.as_os_str()),
    )?;
    let argv: Vec<CString> = r.argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let envp = environment(base, &r.env_remove, &r.env)?;
    let pointers = |v: &[CString]| {
        let mut p: Vec<*const libc::c_char> = v.iter().map(|a| a.as_ptr()).collect();
        p.push(std::ptr::null());
        p
    };
    // execvp's fall-back: `/bin/sh PATH ARGS...` (argv[0] is dropped).
    let mut sh_argv_p = vec![SH.as_ptr(), path.as_ptr()];
    sh_argv_p.extend(argv.iter().skip(1).map(|a| a.as_ptr()));
    sh_argv_p.push(std::ptr::null());
    let null = File::open("/dev/null")?;
    let pipes = [pipe()?, pipe()?, pipe()?];
    let child = Child {
        path,
        argv_p: pointers(&argv),
        envp_p: pointers(&envp),
        sh_argv_p,
        _argv: argv,
        _envp: envp,
        fds: [
            null.as_raw_fd(),
            pipes[0].1.as_raw_fd(),
            pipes[1].1.as_raw_fd(),
            pipes[2].1.as_raw_fd(),
        ],
        parent,
        cpus: r.placement.cpus.clone(),
        mem: r.placement.mem.clone(),
        handled: handled.to_vec(),
    };
    Ok(Prepared {
        child,
        fds: Some((null, pipes)),
    })
}

impl Prepared {
    /// Fork the prepared rank (into the cgroup whose directory is `cgroup`,
    /// if any). The fork returns at once; `Pending::born` waits for its
    /// exec, so that several ranks' births overlap. Allocates nothing: the
    /// caller keeps `self` until every rank is cloned, then drops them all.
    pub(crate) fn start(&mut self, cgroup: Option<RawFd>) -> Result<Pending, BirthError> {
        let Some((null, [out, err, status])) = self.fds.take() else {
            return Err(BirthError::Failed(std::io::Error::from_raw_os_error(
                libc::EALREADY,
            )));
        };
        // SAFETY: the child runs `child_main`: raw syscalls on what was
        // prepared before the fork, then exec or exit_group.
        let pid = match unsafe { vm::fork(cgroup) } {
            Ok(0) => child_main(&self.child),
            Ok(p) => p,
            Err(e) if refused(&e) => {
                if cgroup.is_none() {
                    REFUSED.store(true, Ordering::Relaxed);
                }
                // Ready again for the fall-back to find nothing half-used.
                self.fds = Some((null, [out, err, status]));
                return Err(BirthError::Refused(e));
            }
            Err(e) => return Err(BirthError::Failed(e)),
        };
        // The parent: the child's ends close here (the child has its own
        // copies); the status pipe says whether exec happened (EOF) or why
        // not (an errno), in `Pending::born`.
        drop((null, out.1, err.1, status.1));
        Ok(Pending {
            pid,
            pipes: Some((File::from(out.0), File::from(err.0))),
            status: File::from(status.0),
        })
    }
}

/// Prepare and fork one rank at once (where one rank starts alone).
#[cfg(test)]
fn start(
    r: &RankLaunch,
    parent: i32,
    cgroup: Option<RawFd>,
    handled: &[i32],
) -> Result<Pending, BirthError> {
    let mut p = prepare(r, parent, handled, &base_env()).map_err(BirthError::Failed)?;
    p.start(cgroup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn launch(argv: &[&str], cpus: Option<Vec<u64>>) -> RankLaunch {
        RankLaunch {
            local_rank: 0,
            argv: argv.iter().map(OsString::from).collect(),
            program: None,
            env: [("TW_BORN_TEST".to_string(), "set".to_string())].into(),
            env_remove: vec!["HOME".into()],
            placement: crate::os::Placement { cpus, mem: None },
            cpus: String::new(),
            mem: String::new(),
            worker_mask: None,
            hold: None,
        }
    }

    fn me() -> i32 {
        std::process::id() as i32
    }

    fn reap(pid: i32) -> i32 {
        let mut st = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        st
    }

    #[test]
    fn a_birth_runs_the_program_with_its_placement_environment_and_default_signals() {
        if !allowed() {
            return; // another architecture: Command starts the ranks
        }
        let cpu = crate::os::get_affinity().unwrap().first().unwrap();
        let words = crate::os::mask_words(&std::iter::once(cpu).collect());
        let handled = vm::handled_signals();
        // Something of ours the child must not keep: our SIGPIPE is ignored.
        assert!(handled.contains(&libc::SIGPIPE));
        let script = "grep -E '^(SigBlk|SigIgn|SigCgt|Cpus_allowed_list)' /proc/self/status; \
                      echo env=$TW_BORN_TEST home=${HOME-unset}";
        let r = launch(&["/bin/sh", "-c", script], Some(words));
        let p = start(&r, me(), None, &handled).unwrap();
        let pid = p.pid;
        let (mut out, _err) = p.born().unwrap();
        let mut text = String::new();
        out.read_to_string(&mut text).unwrap();
        assert_eq!(reap(pid), 0, "{text}");
        let field = |k: &str| {
            text.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(field("Cpus_allowed_list:"), cpu.to_string(), "{text}");
        assert_eq!(field("SigBlk:"), "0000000000000000", "{text}");
        // SIGPIPE is not ignored in the child (a launcher's parent may have
        // left others ignored; those the child inherits, as with Command).
        let ignored = u64::from_str_radix(&field("SigIgn:"), 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
        assert!(text.contains("env=set home=unset"), "{text}");
    }

    #[test]
    fn a_failed_exec_or_placement_comes_back_as_its_errno() {
        if !allowed() {
            return;
        }
        let handled = vm::handled_signals();
        let errno = |r: &RankLaunch| {
            let p = start(r, me(), None, &handled).unwrap();
            p.born().unwrap_err().raw_os_error()
        };
        assert_eq!(
            errno(&launch(&["/nonexistent/x"], None)),
            Some(libc::ENOENT)
        );
        let d = tempfile::tempdir().unwrap();
        let plain = d.path().join("plain");
        std::fs::write(&plain, "not a program").unwrap();
        let plain = plain.to_str().unwrap();
        assert_eq!(errno(&launch(&[plain], None)), Some(libc::EACCES));
        // CPU 4095 is nobody's: the kernel refuses the mask before the exec.
        let mut words = vec![0u64; 64];
        words[63] = 1 << 63;
        assert_eq!(
            errno(&launch(&["/bin/true"], Some(words))),
            Some(libc::EINVAL)
        );
        // The parent the child must die with is not its parent: it says so.
        let p = start(&launch(&["/bin/true"], None), 1, None, &handled).unwrap();
        assert_eq!(p.born().unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }
}
