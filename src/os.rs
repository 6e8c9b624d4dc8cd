//! The syscalls placement needs, in one place: reading and setting the CPU
//! affinity mask at any width (not only glibc's 1024-bit `cpu_set_t`).

use crate::cpuset::{CpuSet, MAX_CPU};

/// This process's CPU affinity mask, growing the buffer until the kernel's
/// mask fits (it refuses with EINVAL while the buffer is too small).
pub fn get_affinity() -> std::io::Result<CpuSet> {
    let mut words = 16usize; // 1024 bits
    loop {
        let mut buf = vec![0u64; words];
        // SAFETY: buf is valid for words * 8 bytes, which is the size we pass.
        let r =
            unsafe { libc::syscall(libc::SYS_sched_getaffinity, 0, words * 8, buf.as_mut_ptr()) };
        if r >= 0 {
            let mut set = CpuSet::new();
            for (i, w) in buf.iter().enumerate() {
                for b in 0..64 {
                    if w & (1u64 << b) != 0 {
                        set.insert(i * 64 + b);
                    }
                }
            }
            return Ok(set);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && words * 64 < MAX_CPU {
            words *= 2;
            continue;
        }
        return Err(err);
    }
}

/// Set the affinity of the calling thread (pid 0) to `cpus`, at any width.
pub fn set_affinity(cpus: &CpuSet) -> std::io::Result<()> {
    let mut buf = cpus.words().to_vec();
    if buf.is_empty() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    buf.resize(buf.len().max(16), 0);
    // SAFETY: buf is valid for buf.len() * 8 bytes, which is the size we pass.
    let r = unsafe { libc::syscall(libc::SYS_sched_setaffinity, 0, buf.len() * 8, buf.as_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
