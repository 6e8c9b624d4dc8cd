//! What doctor reads from the machine, behind one trait so every check can be
//! fed fixtures: files by their path inside the machine (below `--root` for a
//! dump), the environment, PATH, resource limits, file system sizes, the
//! first bytes of a library, NVML, and name resolution.

#[cfg(test)]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::topology::fsread;

/// A process resource limit doctor looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Limit {
    OpenFiles,
    LockedMemory,
}

/// What NVML says, when it loads.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Nvml {
    pub loaded: bool,
    /// Why it did not load.
    pub error: Option<String>,
    pub devices: usize,
    /// Devices with persistence mode off.
    pub persistence_off: Vec<usize>,
}

pub(crate) trait Sys {
    /// A file by its path inside the machine ("/proc/sys/vm/swappiness").
    fn read(&self, path: &str) -> Option<String>;
    fn env(&self, key: &str) -> Option<String>;
    /// A program on PATH.
    fn which(&self, name: &str) -> Option<PathBuf>;
    /// (soft, hard); u64::MAX for unlimited.
    fn rlimit(&self, l: Limit) -> Option<(u64, u64)>;
    /// Total bytes of the file system at `path` (inside the machine).
    fn fs_size(&self, path: &str) -> Option<u64>;
    /// The first bytes of a host file (LD_PRELOAD entries), or why not.
    fn head(&self, path: &Path) -> Result<Vec<u8>, String>;
    fn nvml(&self) -> Nvml;
    /// Resolve a host name (bounded in time).
    fn resolve(&self, host: &str, port: u16) -> Result<(), String>;
    /// The network interface the kernel routes `host` through.
    fn route(&self, host: &str) -> Option<String>;
    /// The allocator libraries installed (and those not safe to preload).
    fn allocators(&self) -> crate::host::AllocatorSearch;
}

/// The machine itself, its files read below `root` ("/" unless `--root`).
pub(crate) struct RealSys {
    pub root: PathBuf,
}

impl Sys for RealSys {
    fn read(&self, path: &str) -> Option<String> {
        fsread::read_under(&self.root, path)
    }
    fn env(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        which::which(name).ok()
    }
    fn rlimit(&self, l: Limit) -> Option<(u64, u64)> {
        let res = match l {
            Limit::OpenFiles => libc::RLIMIT_NOFILE,
            Limit::LockedMemory => libc::RLIMIT_MEMLOCK,
        };
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-pointer.
        (unsafe { libc::getrlimit(res, &mut r) } == 0).then_some((r.rlim_cur, r.rlim_max))
    }
    fn fs_size(&self, path: &str) -> Option<u64> {
        let p = fsread::under(&self.root, path)?;
        let c = std::ffi::CString::new(p.to_str()?).ok()?;
        // SAFETY: a zeroed statvfs is a valid out-parameter.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid path and out-pointer.
        (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0)
            .then(|| s.f_blocks.saturating_mul(s.f_frsize))
    }
    fn head(&self, path: &Path) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
        if !f.metadata().map_err(|e| e.to_string())?.is_file() {
            return Err("not a regular file".into());
        }
        let mut b = vec![];
        f.take(64).read_to_end(&mut b).map_err(|e| e.to_string())?;
        Ok(b)
    }
    fn nvml(&self) -> Nvml {
        match crate::nvml::open() {
            Err(e) => Nvml {
                error: Some(e.to_string()),
                ..Default::default()
            },
            Ok(n) => {
                let devices = n.device_count().unwrap_or(0) as usize;
                let persistence_off = (0..devices)
                    .filter(|&i| {
                        n.device_by_index(i as u32)
                            .and_then(|d| d.is_in_persistent_mode())
                            .is_ok_and(|on| !on)
                    })
                    .collect();
                Nvml {
                    loaded: true,
                    error: None,
                    devices,
                    persistence_off,
                }
            }
        }
    }
    fn resolve(&self, host: &str, port: u16) -> Result<(), String> {
        use std::net::ToSocketAddrs;
        let (tx, rx) = std::sync::mpsc::channel();
        let h = host.to_string();
        std::thread::spawn(move || {
            let r = (h.as_str(), port)
                .to_socket_addrs()
                .map(|mut a| a.next().is_some())
                .map_err(|e| e.to_string());
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(3)) {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err("no address".into()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("no answer within 3 s".into()),
        }
    }
    fn allocators(&self) -> crate::host::AllocatorSearch {
        crate::host::find_allocators()
    }
    fn route(&self, host: &str) -> Option<String> {
        crate::netif::route_to(host).map(|(name, _)| name)
    }
}

/// A machine made of maps, for tests.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeSys {
    pub files: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub path: Vec<String>,
    pub limits: BTreeMap<Limit, (u64, u64)>,
    pub fs: BTreeMap<String, u64>,
    pub heads: BTreeMap<PathBuf, Vec<u8>>,
    pub nvml: Nvml,
    pub hosts: Vec<String>,
    pub allocators: Vec<crate::plan::Allocator>,
    /// Host -> the interface that reaches it.
    pub routes: BTreeMap<String, String>,
}

#[cfg(test)]
impl FakeSys {
    pub(crate) fn file(mut self, p: &str, s: &str) -> Self {
        self.files.insert(p.into(), s.into());
        self
    }
    pub(crate) fn var(mut self, k: &str, v: &str) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }
}

#[cfg(test)]
impl Sys for FakeSys {
    fn read(&self, path: &str) -> Option<String> {
        self.files.get(path).cloned()
    }
    fn env(&self, key: &str) -> Option<String> {
        self.env.get(key).cloned()
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        self.path
            .iter()
            .any(|p| p == name)
            .then(|| PathBuf::from(format!("/usr/bin/{name}")))
    }
    fn rlimit(&self, l: Limit) -> Option<(u64, u64)> {
        self.limits.get(&l).copied()
    }
    fn fs_size(&self, path: &str) -> Option<u64> {
        self.fs.get(path).copied()
    }
    fn head(&self, path: &Path) -> Result<Vec<u8>, String> {
        self.heads
            .get(path)
            .cloned()
            .ok_or_else(|| "No such file or directory (os error 2)".into())
    }
    fn nvml(&self) -> Nvml {
        self.nvml.clone()
    }
    fn resolve(&self, host: &str, _: u16) -> Result<(), String> {
        if self.hosts.iter().any(|h| h == host) {
            Ok(())
        } else {
            Err("failed to lookup address information: Name or service not known".into())
        }
    }
    fn allocators(&self) -> crate::host::AllocatorSearch {
        crate::host::AllocatorSearch {
            found: self.allocators.clone(),
            skipped: vec![],
        }
    }
    fn route(&self, host: &str) -> Option<String> {
        self.routes.get(host).cloned()
    }
}
