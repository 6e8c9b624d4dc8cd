//! Bounded reads of the files topology comes from, shared by the sysfs and
//! cgroup readers, the hwloc XML loader and plan files. Real sysfs and procfs
//! files are small and regular; a dump or a path a user gives may hold
//! anything: a FIFO (opening it would block forever), `/dev/zero` (endless),
//! a 10 MB cpulist, or a `..` that leads outside the root. Each read opens
//! without blocking, takes regular files only and stops at a size limit.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// A sysfs or procfs file: `/proc/cpuinfo` of a 4096-CPU machine is ~6 MiB.
pub(crate) const MAX_SYSFS_FILE: u64 = 16 << 20;
/// An hwloc XML export: a few MiB for the largest machines hwloc ships.
pub(crate) const MAX_XML_FILE: u64 = 64 << 20;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file")]
    NotRegular,
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    #[error("not UTF-8 text")]
    NotText,
}

/// Read a regular file of at most `max` bytes as text.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<String, ReadError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(ReadError::NotRegular);
    }
    read_text(f, max)
}

/// The rest of `f` as text, at most `max` bytes (sysfs files report size
/// 4096 whatever they hold: the limit is on what is read).
fn read_text(f: std::fs::File, max: u64) -> Result<String, ReadError> {
    let mut buf = Vec::with_capacity(4096);
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    String::from_utf8(buf).map_err(|_| ReadError::NotText)
}

/// `root` + a path from inside the machine (`/sys/...` or `sys/...`), or None
/// when it would leave the root (`..`).
pub(crate) fn under(root: &Path, inside: &str) -> Option<PathBuf> {
    let rel = Path::new(inside.trim_start_matches('/'));
    rel.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        .then(|| root.join(rel))
}

/// A sysfs/procfs file below `root`, bounded; None when absent, odd or too big.
pub(crate) fn read_under(root: &Path, inside: &str) -> Option<String> {
    read_kernel_file(&under(root, inside)?, MAX_SYSFS_FILE).ok()
}

/// A sysfs or procfs file (or its copy in a dump), with the fewest syscalls:
/// a topology reads dozens per CPU. Opened without blocking, read to its end
/// (at most `max` bytes) into a buffer a sysfs file fills in one read; no
/// fstat: a FIFO reads as empty or refuses (EAGAIN), a directory refuses
/// (EISDIR), a device stops at `max`.
pub(crate) fn read_kernel_file(path: &Path, max: u64) -> Result<String, ReadError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    read_text(f, max)
}

/// `MemTotal` in bytes from `/proc/meminfo` ("MemTotal: 123 kB") or a node's
/// `meminfo` ("Node 0 MemTotal: 123 kB").
pub(crate) fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.contains("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().rev().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A directory holding `files` (path below it, content): a fake root for tests.
#[cfg(test)]
pub(crate) fn fake_root(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (p, s) in files {
        let p = dir.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_files_are_refused_in_bounded_time() {
        assert!(matches!(
            read_bounded(Path::new("/dev/zero"), 1024),
            Err(ReadError::NotRegular)
        ));
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_bounded(&fifo, 1024),
            Err(ReadError::NotRegular)
        ));
        let big = d.path().join("big");
        std::fs::write(&big, vec![b'0'; 2048]).unwrap();
        assert!(matches!(
            read_bounded(&big, 1024),
            Err(ReadError::TooLarge(1024))
        ));
        assert_eq!(read_bounded(&big, 2048).unwrap().len(), 2048);
    }

    #[test]
    fn paths_stay_under_the_root() {
        let r = Path::new("/dump");
        assert_eq!(under(r, "/sys/fs/cgroup").unwrap(), r.join("sys/fs/cgroup"));
        assert_eq!(under(r, "proc/mounts").unwrap(), r.join("proc/mounts"));
        assert!(under(r, "/sys/../../etc/shadow").is_none());
    }

    #[test]
    fn mem_total_in_both_shapes() {
        assert_eq!(
            mem_total_bytes("MemTotal:       16 kB\nMemFree: 1 kB"),
            Some(16384)
        );
        assert_eq!(mem_total_bytes("Node 1 MemTotal:  2 kB"), Some(2048));
        assert_eq!(mem_total_bytes("MemTotal: 18446744073709551615 kB"), None);
        assert_eq!(mem_total_bytes("nothing"), None);
    }
}
