//! Processes that share our memory: `clone3` with `CLONE_VM`, as
//! `posix_spawn` and Go's `forkExec` do, so that no copy of our address
//! space is made. A fork of the supervisor (tens of MB mapped, some threads)
//! costs more than the rest of a launch; a clone that shares the memory
//! costs a stack. The child runs one function on its own stack (a guard page
//! below it) and must touch nothing of ours but what it is given: no
//! allocation, no thread-local state (its `errno` is the cloning thread's),
//! no handler of ours (all signals stay blocked until it execs or for good).
//! x86_64 and aarch64 only: elsewhere `clone3_vm` says ENOSYS and the
//! callers use their older paths.

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

/// Can this build clone with CLONE_VM at all?
pub(crate) const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// A child's stack: a private mapping with a guard page at its low end.
pub(crate) struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

const GUARD_BYTES: usize = 4 << 10;

impl Stack {
    pub(crate) fn new(bytes: usize) -> std::io::Result<Stack> {
        let len = bytes + GUARD_BYTES;
        // SAFETY: a fresh private mapping, ours until munmap in drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping above.
        if unsafe { libc::mprotect(base, GUARD_BYTES, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our mapping; whoever ran on it has exec'd or exited.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Clone with `flags` (CLONE_VM among them) and `cgroup` (with
/// CLONE_INTO_CGROUP), the child running `f(arg)` on `stack`, every signal
/// blocked in it (and in this thread until the clone returns). Returns the
/// child's pid.
///
/// # Safety
/// `f` must never return, and touch only `arg` and its own stack, both kept
/// valid until it has exec'd or exited (with CLONE_VFORK, until this
/// returns; else for as long as the child may run).
pub(crate) unsafe fn spawn(
    flags: u64,
    cgroup: Option<RawFd>,
    stack: &Stack,
    f: extern "C" fn(*mut libc::c_void) -> !,
    arg: *mut libc::c_void,
) -> std::io::Result<i32> {
    let args = CloneArgs {
        flags: flags
            | if cgroup.is_some() {
                CLONE_INTO_CGROUP
            } else {
                0
            },
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.base as u64 + GUARD_BYTES as u64,
        stack_size: (stack.len - GUARD_BYTES) as u64,
        cgroup: cgroup.unwrap_or(0) as u64,
        ..Default::default()
    };
    // SAFETY: the caller's promise.
    let ret = blocked(|| unsafe { clone3_vm(&args, f, arg) });
    if ret < 0 {
        return Err(std::io::Error::from_raw_os_error(-ret as i32));
    }
    Ok(ret as i32)
}

/// `f` with every signal blocked in this thread, so that a child cloned in
/// it starts with none of our handlers able to run.
fn blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: masks are plain values.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

/// A fork through clone3 (into `cgroup` with CLONE_INTO_CGROUP, if given),
/// every signal blocked in the child: Ok(0) in the child, which has its own
/// copy of our memory and, our threads' locks being copied as they stood,
/// must make raw syscalls only before exec or exit.
pub(crate) fn fork(cgroup: Option<RawFd>) -> std::io::Result<i32> {
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
    // SAFETY: clone3 without CLONE_VM is fork with arguments.
    let pid = blocked(|| unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    });
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid as i32)
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

/// clone3 whose child starts on `args`' stack and calls `f(arg)`, which
/// never returns. Returns the child's pid or -errno.
///
/// # Safety
/// `args` must give a valid stack; `f` must exec or exit without returning.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_vm(
    args: &CloneArgs,
    f: extern "C" fn(*mut libc::c_void) -> !,
    arg: *mut libc::c_void,
) -> isize {
    let ret: isize;
    // SAFETY: the parent side is a plain syscall (rcx and r11 clobbered);
    // the child side (rax 0, on its own stack, 16-byte aligned) calls
    // f(arg), which never comes back into this function.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 as isize => ret,
            in("rdi") args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") f,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret
}

/// clone3 with the child calling `f(arg)` (see the x86_64 version).
///
/// # Safety
/// As for the x86_64 version.
#[cfg(target_arch = "aarch64")]
unsafe fn clone3_vm(
    args: &CloneArgs,
    f: extern "C" fn(*mut libc::c_void) -> !,
    arg: *mut libc::c_void,
) -> isize {
    let ret: isize;
    // SAFETY: as for x86_64; the syscall keeps every register but x0.
    unsafe {
        std::arch::asm!(
            "svc 0",
            "cbnz x0, 2f",
            "mov x0, x10",
            "blr x9",
            "brk #1",
            "2:",
            inlateout("x0") args as *const CloneArgs as isize => ret,
            in("x1") std::mem::size_of::<CloneArgs>(),
            in("x8") libc::SYS_clone3,
            in("x9") f,
            in("x10") arg,
        );
    }
    ret
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn clone3_vm(
    _: &CloneArgs,
    _: extern "C" fn(*mut libc::c_void) -> !,
    _: *mut libc::c_void,
) -> isize {
    -(libc::ENOSYS as isize)
}

/// A system call that leaves errno alone (a child sharing our memory must
/// not write the cloning thread's errno while that thread runs): the result
/// or -errno.
///
/// # Safety
/// As for the system call `nr` with these arguments.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn raw(nr: libc::c_long, a: [usize; 4]) -> isize {
    let ret: isize;
    // SAFETY: the caller's; the kernel clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// A system call that leaves errno alone (see the x86_64 version).
///
/// # Safety
/// As for the system call `nr` with these arguments.
#[cfg(target_arch = "aarch64")]
pub(crate) unsafe fn raw(nr: libc::c_long, a: [usize; 4]) -> isize {
    let ret: isize;
    // SAFETY: the caller's.
    unsafe {
        std::arch::asm!(
            "svc 0",
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x8") nr,
            options(nostack),
        );
    }
    ret
}

/// Never called where CLONE_VM children are not made.
///
/// # Safety
/// None needed.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) unsafe fn raw(_: libc::c_long, _: [usize; 4]) -> isize {
    -(libc::ENOSYS as isize)
}
