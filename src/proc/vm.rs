//! Forks that are safe in a process with threads: `clone3` with fork
//! semantics (no `CLONE_VM`: the child has its own copy of our memory), into
//! a cgroup where one is given (`CLONE_INTO_CGROUP`, Linux 5.7+, so nothing
//! ever migrates), with every signal blocked in the child from its first
//! instruction. The child must make raw system calls only until it execs or
//! exits: our other threads' locks (the allocator's among them) were copied
//! as they stood. No inline assembly and no shared memory: a child that
//! crashes before its exec takes nobody with it, on any kernel, and tools
//! that interpose on libc (LD_PRELOAD) see the same calls as a fork's.

use std::os::fd::RawFd;

/// `struct clone_args` as far as `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
pub(crate) struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

pub(crate) const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Every signal blocked in this thread (through the kernel, so glibc's own
/// two are blocked too, which pthread_sigmask leaves out); the old mask.
fn block_all() -> u64 {
    let (all, mut old) = (!0u64, 0u64);
    // SAFETY: a mask of the kernel's size, in and out.
    unsafe {
        raw(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as usize,
                &all as *const u64 as usize,
                &mut old as *mut u64 as usize,
                8,
            ],
        )
    };
    old
}

fn restore(old: &u64) {
    // SAFETY: a mask saved by block_all.
    unsafe {
        raw(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as usize, old as *const u64 as usize, 0, 8],
        )
    };
}

/// A fork through clone3 (into `cgroup` with CLONE_INTO_CGROUP, if given):
/// Ok(0) in the child, which starts and stays with every signal blocked (no
/// handler of ours can run in it: it unblocks them itself, if ever, once it
/// has reset them), has its own copy of our memory and must make raw
/// syscalls only before exec or exit; the child's pid in the parent, whose
/// mask is as it was.
///
/// # Safety
///
/// Where this returns Ok(0) the caller is the forked child of a process that
/// may have other threads: it must make raw syscalls only (`raw`; no
/// allocation, no lock, no std I/O, no unwinding) and end in exec or
/// `exit_group`, never returning into code that was not written for it.
pub(crate) unsafe fn fork(cgroup: Option<RawFd>) -> std::io::Result<i32> {
    let args = CloneArgs {
        flags: if cgroup.is_some() {
            CLONE_INTO_CGROUP
        } else {
            0
        },
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.unwrap_or(0) as u64,
        ..Default::default()
    };
    let old = block_all();
    // SAFETY: clone3 without CLONE_VM is fork with arguments.
    let mut pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0
        && cgroup.is_none()
        && matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOSYS | libc::EPERM)
        )
    {
        // No clone3 here (a kernel before 5.3, a seccomp filter): the plain
        // clone that fork(2) is, without glibc's atfork handlers. Its
        // other arguments (stack, tids, tls) are all zero on every
        // architecture's argument order.
        // SAFETY: as above.
        pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
    }
    if pid == 0 {
        // The child keeps every signal blocked.
        return Ok(0);
    }
    let err = std::io::Error::last_os_error();
    restore(&old);
    if pid < 0 {
        return Err(err);
    }
    Ok(pid as i32)
}

/// fork(2) of a process that has one thread: Ok(0) in the child, which may
/// run any code (it is a copy of the only thread, so no lock is held by a
/// thread that does not exist there), the child's pid in the parent.
///
/// # Safety
///
/// The calling process must have exactly one thread: with more, the child
/// may find a lock (the allocator's, stdio's) held forever by a thread it
/// does not have. The child must leave by `libc::_exit` (or exec), never by
/// returning into code that would run the parent's destructors twice.
pub(crate) unsafe fn fork_single_threaded() -> std::io::Result<i32> {
    // SAFETY: the caller's: one thread, so the child is a whole process.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// Does `action` succeed in a child of ours (in `cgroup` from birth, if
/// given)? The child runs it (a raw syscall: its result or -errno) and exits
/// with the errno; the parent reaps it and says. For probes, before any rank.
///
/// # Safety
///
/// `action` runs in the forked child (see `fork`): it must make raw
/// syscalls only, with no allocation, lock or unwinding.
pub(crate) unsafe fn in_child(
    cgroup: Option<RawFd>,
    action: impl FnOnce() -> isize,
) -> std::io::Result<()> {
    // SAFETY: the child runs `action`, raw syscalls only by this function's
    // contract, then exit_group.
    match unsafe { fork(cgroup) }? {
        0 => {
            let r = action();
            let code = if r < 0 { -r as usize } else { 0 };
            loop {
                // SAFETY: leaving the forked child without running anything of ours.
                unsafe { raw(libc::SYS_exit_group, [code, 0, 0, 0]) };
            }
        }
        pid => {
            let mut st = 0;
            // SAFETY: our own child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            match libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st)) {
                Some(0) => Ok(()),
                Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
                None => Err(std::io::Error::other("the probe child died")),
            }
        }
    }
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened for us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `s` as a C string; a NUL byte in it is an error that names it.
pub(crate) fn cstr(s: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(s.as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} holds a NUL byte", s.to_string_lossy()),
        )
    })
}

/// A system call through libc's `syscall(2)` (async-signal-safe, so fit
/// for a forked child, whose errno is its own copy): the result or -errno.
///
/// # Safety
/// As for the system call `nr` with these arguments.
pub(crate) unsafe fn raw(nr: libc::c_long, a: [usize; 4]) -> isize {
    // SAFETY: the caller's.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3]) };
    if r == -1 {
        // SAFETY: this thread's errno.
        -(unsafe { *libc::__errno_location() } as isize)
    } else {
        r as isize
    }
}

/// The signals with a handler of ours (glibc's own among them, which its
/// sigaction will not show), and SIGPIPE (which we ignore and a rank must
/// not: `Command` restores it the same way), as the kernel has them.
pub(crate) fn handled_signals() -> Vec<i32> {
    // Asked once: the watchdog and every birth of the process see the same
    // handlers (ours are set before the first launch and never change).
    static HANDLED: std::sync::OnceLock<Vec<i32>> = std::sync::OnceLock::new();
    HANDLED.get_or_init(ask_handled).clone()
}

fn ask_handled() -> Vec<i32> {
    let mut out = vec![libc::SIGPIPE];
    for sig in 1..=64 {
        if matches!(sig, libc::SIGKILL | libc::SIGSTOP | libc::SIGPIPE) {
            continue;
        }
        let mut old = KernelSigaction([0; 4]);
        // SAFETY: a query into `old`, the kernel's layout and size.
        let r = unsafe {
            let a = [sig as usize, 0, &mut old as *mut _ as usize, 8];
            raw(libc::SYS_rt_sigaction, a)
        };
        // The handler comes first: 0 is SIG_DFL, 1 SIG_IGN.
        if r == 0 && old.0[0] > 1 {
            out.push(sig);
        }
    }
    out
}

/// The kernel's `struct sigaction` all zero: SIG_DFL, no flags, no mask.
#[repr(C)]
struct KernelSigaction([u64; 4]);

/// Every signal in `handled` back to SIG_DFL, through raw syscalls (fit
/// for a forked child, before it unblocks them).
pub(crate) fn default_handlers(handled: &[i32]) {
    let dfl = KernelSigaction([0; 4]);
    for sig in handled {
        // SAFETY: setting a signal's action to the kernel's default.
        unsafe {
            raw(
                libc::SYS_rt_sigaction,
                [*sig as usize, &dfl as *const _ as usize, 0, 8],
            )
        };
    }
}
