//! Starting a rank already inside the job's cgroup: `clone3` with
//! `CLONE_INTO_CGROUP` (Linux 5.7+, cgroup v2), so no process ever migrates
//! into it. A migration through `cgroup.procs` waits for the kernel's RCU
//! grace period (measured: 19.6 ms of a 22-30 ms launch right after a
//! torchrun run); a birth in place waits for nothing. The child does what
//! `std::process::Command` would with our options (stdin from /dev/null,
//! stdout and stderr to pipes, its own process group, an empty signal mask,
//! SIGPIPE back to default), asks to die with us, takes its placement and
//! execs; an exec that fails sends its errno back through a close-on-exec
//! pipe. Everything it needs is prepared before the clone: between clone and
//! exec it only makes syscalls. Where the kernel refuses the flag, the
//! caller falls back to `std::process::Command` and `cgroup.procs`.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use super::RankLaunch;

/// `struct clone_args` as far as `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Why a birth in place did not happen.
#[derive(Debug)]
pub(crate) enum BirthError {
    /// The kernel (or a seccomp filter) refuses clone3 or the flag: use the
    /// fork-then-join path for this job.
    Refused,
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

fn cstr(s: &OsStr) -> std::io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} holds a NUL byte", s.to_string_lossy()),
        )
    })
}

/// The environment `Command` would give: ours, less `remove`, with `set`.
fn environment(remove: &[String], set: &BTreeMap<String, String>) -> std::io::Result<Vec<CString>> {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
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

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened for us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn clone3_into(cgroup: RawFd) -> std::io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM is fork with arguments: the child gets
    // a copy of this address space and runs only syscalls before exec/_exit.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid as i32)
}

/// Can ranks be born in the cgroup whose directory is `cgroup`? A child
/// that exits at once, reaped here (for the dry run, before any rank).
pub(crate) fn probe(cgroup: RawFd) -> Result<(), std::io::Error> {
    match clone3_into(cgroup)? {
        0 => {
            // SAFETY: the child leaves at once without running destructors.
            unsafe { libc::_exit(0) }
        }
        pid => {
            let mut st = 0;
            // SAFETY: our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            Ok(())
        }
    }
}

/// A rank cloned, not yet known to have exec'd.
#[derive(Debug)]
pub(crate) struct Pending {
    pub pid: i32,
    stdout: File,
    stderr: File,
    status: File,
}

impl Pending {
    /// Wait until the rank has exec'd (its status pipe closes): the read
    /// ends of its stdout and stderr; or why it could not (its errno; it
    /// has exited and is reaped here).
    pub(crate) fn born(self) -> Result<(File, File), std::io::Error> {
        let mut status = self.status;
        let mut buf = [0u8; 4];
        let mut got = 0;
        loop {
            match status.read(&mut buf[got..]) {
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
        if got == buf.len() {
            let mut st = 0;
            // SAFETY: our own child, which has exited or is about to.
            unsafe { libc::waitpid(self.pid, &mut st, 0) };
            return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
        }
        Ok((self.stdout, self.stderr))
    }
}

/// Clone `r` into the cgroup whose directory is `cgroup`, with `parent` as
/// the process it dies with; `Pending::born` waits for its exec, so that
/// several ranks' births overlap.
pub(crate) fn start(r: &RankLaunch, parent: i32, cgroup: RawFd) -> Result<Pending, BirthError> {
    let failed = BirthError::Failed;
    // Everything the child touches, made before the clone.
    let path = cstr(
        r.program
            .as_deref()
            .map_or(r.argv[0].as_os_str(), |p| p.as_os_str()),
    )
    .map_err(failed)?;
    let argv: Vec<CString> = r
        .argv
        .iter()
        .map(|a| cstr(a))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
    let envp = environment(&r.env_remove, &r.env).map_err(failed)?;
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    let null = File::open("/dev/null").map_err(failed)?;
    let (out_r, out_w) = pipe().map_err(failed)?;
    let (err_r, err_w) = pipe().map_err(failed)?;
    let (status_r, status_w) = pipe().map_err(failed)?;
    let placement = &r.placement;
    let fds = (
        null.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        status_w.as_raw_fd(),
    );
    let pid = match clone3_into(cgroup) {
        Ok(p) => p,
        Err(e) if refused(&e) => return Err(BirthError::Refused),
        Err(e) => return Err(failed(e)),
    };
    if pid == 0 {
        // The child: syscalls only, then exec or _exit.
        // SAFETY: every pointer was prepared above and stays valid in this copy.
        unsafe {
            let fail = |status: RawFd| -> ! {
                let e = *libc::__errno_location();
                let b = e.to_ne_bytes();
                libc::write(status, b.as_ptr().cast(), b.len());
                libc::_exit(127)
            };
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if libc::dup2(fds.0, 0) < 0 || libc::dup2(fds.1, 1) < 0 || libc::dup2(fds.2, 2) < 0 {
                fail(fds.3);
            }
            if libc::setpgid(0, 0) != 0 {
                fail(fds.3);
            }
            if !crate::os::die_with_parent(parent) {
                *libc::__errno_location() = libc::ESRCH;
                fail(fds.3);
            }
            if let Err((_, e)) = placement.apply() {
                *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EINVAL);
                fail(fds.3);
            }
            libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr());
            fail(fds.3)
        }
    }
    // The parent: the child's ends close here; the status pipe says whether
    // exec happened (EOF) or why not (an errno), in `Pending::born`.
    drop((null, out_w, err_w, status_w));
    Ok(Pending {
        pid,
        stdout: File::from(out_r),
        stderr: File::from(err_r),
        status: File::from(status_r),
    })
}
