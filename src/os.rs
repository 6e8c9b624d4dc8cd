//! The syscalls placement needs, in one place: the CPU affinity mask at any
//! width (not only glibc's 1024-bit `cpu_set_t`), the NUMA memory policy, and
//! the process-lifetime knobs a launcher needs. The `*_raw` functions make no
//! allocation, so they are safe between fork and exec.

use crate::cpuset::{CpuSet, MAX_CPU};

/// This process's CPU affinity mask, growing the buffer until the kernel's
/// mask fits (it refuses with EINVAL while the buffer is too small).
pub(crate) fn get_affinity() -> std::io::Result<CpuSet> {
    task_affinity(0)
}

/// Thread `tid`'s CPU affinity mask (0: the calling thread), one syscall
/// where the mask fits 1024 bits.
pub(crate) fn task_affinity(tid: libc::pid_t) -> std::io::Result<CpuSet> {
    let mut words = 16usize; // 1024 bits
    loop {
        let mut buf = vec![0u64; words];
        // SAFETY: buf is valid for words * 8 bytes, which is the size we pass.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_getaffinity,
                tid,
                words * 8,
                buf.as_mut_ptr(),
            )
        };
        if r >= 0 {
            // The kernel wrote r bytes (its mask's size); the rest stays 0.
            return Ok(CpuSet::from_words(buf));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && words * 64 < MAX_CPU {
            words *= 2;
            continue;
        }
        return Err(err);
    }
}

/// Affinity mask words for `cpus`, padded to at least 1024 bits.
pub(crate) fn mask_words(cpus: &CpuSet) -> Vec<u64> {
    let mut buf = cpus.words().to_vec();
    buf.resize(buf.len().max(16), 0);
    buf
}

/// `set_mempolicy` modes (linux/mempolicy.h).
pub(crate) const MPOL_DEFAULT: i32 = 0;
pub(crate) const MPOL_PREFERRED: i32 = 1;
pub(crate) const MPOL_BIND: i32 = 2;
pub(crate) const MPOL_INTERLEAVE: i32 = 3;
pub(crate) const MPOL_LOCAL: i32 = 4;

/// A placement prepared before fork: plain words, nothing to allocate later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Affinity mask words (least significant first), or None to leave it.
    pub cpus: Option<Vec<u64>>,
    /// Memory policy mode and node mask words, or None to leave it.
    pub mem: Option<(i32, Vec<u64>)>,
}

impl Placement {
    /// It asks for the `local` memory policy: the kernel's own default, which
    /// may be given up where the kernel refuses set_mempolicy.
    pub(crate) fn asks_local(&self) -> bool {
        self.mem
            .as_ref()
            .is_some_and(|(mode, _)| *mode == MPOL_LOCAL)
    }

    /// Apply to the calling thread (inherited by fork and kept across exec).
    /// Async-signal-safe: only syscalls on memory prepared beforehand.
    pub(crate) fn apply(&self) -> Result<(), (&'static str, std::io::Error)> {
        if let Some(words) = &self.cpus {
            set_affinity_raw(words).map_err(|e| ("sched_setaffinity", e))?;
        }
        if let Some((mode, nodes)) = &self.mem {
            set_mempolicy_raw(*mode, nodes).map_err(|e| ("set_mempolicy", e))?;
        }
        Ok(())
    }
}

/// sched_setaffinity(0, words): the calling thread.
pub(crate) fn set_affinity_raw(words: &[u64]) -> std::io::Result<()> {
    set_task_affinity(0, words)
}

/// sched_setaffinity(tid, words): thread `tid`'s mask (0: the calling thread).
/// Async-signal-safe: one syscall on memory prepared beforehand.
pub(crate) fn set_task_affinity(tid: libc::pid_t, words: &[u64]) -> std::io::Result<()> {
    if words.iter().all(|w| *w == 0) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: words is valid for words.len() * 8 bytes, which is the size we pass.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setaffinity,
            tid,
            words.len() * 8,
            words.as_ptr(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// set_mempolicy(mode, nodes): the calling thread's NUMA memory policy.
pub(crate) fn set_mempolicy_raw(mode: i32, nodes: &[u64]) -> std::io::Result<()> {
    let (ptr, maxnode) = mempolicy_args(mode, nodes);
    // SAFETY: ptr is null or valid for nodes.len() words; maxnode - 1 bits are read.
    let r = unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, ptr, maxnode) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// set_mempolicy's node mask and its bit count for `mode` and `nodes`:
/// none for the modes that take none.
pub(crate) fn mempolicy_args(mode: i32, nodes: &[u64]) -> (*const u64, usize) {
    if nodes.is_empty() || mode == MPOL_LOCAL || mode == MPOL_DEFAULT {
        (std::ptr::null(), 0)
    } else {
        (nodes.as_ptr(), nodes.len() * 64 + 1)
    }
}

/// Ask for SIGKILL when the parent dies; false when the parent is already gone.
/// Async-signal-safe.
pub(crate) fn die_with_parent(parent: libc::pid_t) -> bool {
    // SAFETY: plain syscalls with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        libc::getppid() == parent
    }
}

/// Become the reaper of orphaned descendants, so none can outlive us unseen.
pub(crate) fn become_subreaper() {
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Send a signal to a whole process group; ESRCH (already gone) is fine.
pub(crate) fn kill_group(pgid: libc::pid_t, sig: i32) {
    if pgid > 0 {
        // SAFETY: plain syscall with integer arguments.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Conventional signal names, for messages.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_is_readable_and_non_empty() {
        let a = get_affinity().unwrap();
        assert!(!a.is_empty());
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let online = CpuSet::parse_list(&online).unwrap();
        assert!(a.is_subset(&online) || online.is_empty());
    }
}

#[cfg(test)]
mod placement_tests {
    use super::*;

    #[test]
    fn placement_applies_in_a_thread() {
        let mine = get_affinity().unwrap();
        let first = mine.first().unwrap();
        let one: CpuSet = std::iter::once(first).collect();
        let p = Placement {
            cpus: Some(mask_words(&one)),
            mem: Some((MPOL_PREFERRED, vec![1])),
        };
        let got = std::thread::spawn(move || {
            match p.apply() {
                Ok(()) => {}
                // qemu-user (the aarch64 unit tests) implements no
                // set_mempolicy; the CPUs are set before it.
                Err(("set_mempolicy", e)) if e.raw_os_error() == Some(libc::ENOSYS) => {}
                Err(e) => panic!("{e:?}"),
            }
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            (get_affinity().unwrap(), status)
        })
        .join()
        .unwrap();
        assert_eq!(got.0, one);
        assert!(got.1.contains(&format!("Cpus_allowed_list:\t{first}\n")));
        let empty = Placement {
            cpus: Some(vec![0; 16]),
            mem: None,
        };
        assert_eq!(empty.apply().unwrap_err().0, "sched_setaffinity");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(63), "signal 63");
    }
}

/// This machine's host name (its UTS namespace's), or "localhost".
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length; gethostname NUL-terminates or fails.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(0);
    match std::str::from_utf8(&buf[..end]) {
        Ok(s) if ok && !s.is_empty() => s.to_string(),
        _ => "localhost".to_string(),
    }
}

/// This process's effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Make /proc/self/cmdline read `title` (what `ps` and `pgrep -f` see): the
/// argument area the kernel gave this process is overwritten in place, as
/// setproctitle does, cut to its length. For a forked copy of ourselves
/// that must not pass for the command it was forked from; nothing reads the
/// arguments afterwards.
pub(crate) fn set_cmdline(title: &str) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // arg_start and arg_end: fields 48 and 49 (1-based).
    let Some(mut f) = crate::measure::process::stat_fields(&stat) else {
        return;
    };
    let num = |v: Option<&str>| v.and_then(|v| v.parse::<usize>().ok());
    let (Some(start), Some(end)) = (num(f.nth(45)), num(f.next())) else {
        return;
    };
    if start == 0 || end <= start {
        return;
    }
    let len = end - start;
    let n = title.len().min(len - 1);
    // SAFETY: [start, end) is this process's own argument area, mapped and
    // writable for its whole life (the kernel copied argv there at exec); the
    // last byte stays NUL, so the kernel reads no further.
    unsafe {
        let p = start as *mut u8;
        std::ptr::write_bytes(p, 0, len);
        std::ptr::copy_nonoverlapping(title.as_ptr(), p, n);
    }
}
