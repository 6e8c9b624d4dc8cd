//! Reading what `top` needs from /proc, and nothing else: per thread its
//! state, last CPU and CPU time; per process its context switches, RSS,
//! children, affinity and (less often) the NUMA node of its pages; per CPU its
//! busy time. Buffers are reused so a sample of 16 ranks x 50 threads stays
//! cheap (`cargo bench --bench top`).

use std::collections::BTreeMap;
use std::io::Read;

use crate::cpuset::CpuSet;

/// One thread at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Thread {
    pub tid: i32,
    /// Its name (`comm`, from the stat line).
    pub name: String,
    /// Its affinity mask (empty when it could not be read).
    pub allowed: crate::cpuset::CpuSet,
    /// R running or runnable, S sleeping, D, T, Z ...
    pub state: char,
    /// The CPU it last ran on.
    pub cpu: usize,
    /// User and system time, in clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// Context switches; `UNKNOWN` when this sample did not read them.
    pub voluntary_cs: u64,
    pub involuntary_cs: u64,
}

/// A context-switch count not read in this sample.
pub(crate) const UNKNOWN: u64 = u64::MAX;

/// One process (a rank or one of its children) at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Process {
    pub pid: i32,
    pub comm: String,
    pub threads: Vec<Thread>,
    pub rss_kib: u64,
    pub affinity: CpuSet,
    /// Pages per NUMA node (numa_maps), when read this time.
    pub pages_per_node: Option<BTreeMap<usize, u64>>,
    pub children: Vec<i32>,
}

/// Reads /proc below a root ("/" but for tests), reusing its buffer.
pub(crate) struct ProcReader {
    root: String,
    buf: Vec<u8>,
}

impl ProcReader {
    pub(crate) fn new(root: &str) -> ProcReader {
        ProcReader {
            root: root.trim_end_matches('/').to_string(),
            buf: Vec::with_capacity(4096),
        }
    }

    fn read(&mut self, rel: &str) -> Option<&str> {
        let f = std::fs::File::open(format!("{}/proc/{rel}", self.root)).ok()?;
        self.read_file(f)
    }

    /// `name` below the directory `dir` (an open fd): one lookup instead of
    /// the whole /proc/PID/task/TID path per thread.
    fn read_at(&mut self, dir: &std::fs::File, name: &std::ffi::CStr) -> Option<&str> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: a valid directory fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just opened and is owned by the File from here on.
        let f = unsafe { std::fs::File::from_raw_fd(fd) };
        self.read_file(f)
    }

    fn read_file(&mut self, mut f: std::fs::File) -> Option<&str> {
        // Plain reads into the kept buffer: read_to_end would stat the file
        // first, a syscall per file that procfs answers with size 0 anyway.
        let mut len = 0;
        loop {
            if self.buf.len() < len + 4096 {
                self.buf.resize(len + 4096, 0);
            }
            match f.read(&mut self.buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        std::str::from_utf8(&self.buf[..len]).ok()
    }

    /// A thread's stat line: state, CPU, times; its context switches with `cs`.
    fn thread(&mut self, task: &std::fs::File, tid: i32, cs: bool) -> Option<Thread> {
        let name = std::ffi::CString::new(format!("{tid}/stat")).ok()?;
        let stat = self.read_at(task, &name)?;
        let close = stat.rfind(')')?;
        let comm = stat[..close]
            .split_once('(')
            .map_or("", |(_, c)| c)
            .to_string();
        // Fields after the comm: state is 3, utime 14, stime 15, processor 39
        // (1-based): taken in one pass, nothing collected.
        let (mut state, mut utime, mut stime, mut cpu) = (None, None, None, None);
        for (i, f) in super::process::stat_fields(stat)?.enumerate() {
            match i {
                0 => state = f.chars().next(),
                11 => utime = f.parse().ok(),
                12 => stime = f.parse().ok(),
                36 => {
                    cpu = f.parse().ok();
                    break;
                }
                _ => {}
            }
        }
        let mut t = Thread {
            tid,
            name: comm,
            allowed: crate::os::task_affinity(tid).unwrap_or_default(),
            state: state?,
            utime: utime?,
            stime: stime?,
            cpu: cpu?,
            voluntary_cs: UNKNOWN,
            involuntary_cs: UNKNOWN,
        };
        if !cs {
            return Some(t);
        }
        let name = std::ffi::CString::new(format!("{tid}/status")).ok()?;
        let status = self.read_at(task, &name)?;
        for l in status.lines() {
            if let Some(v) = l.strip_prefix("voluntary_ctxt_switches:") {
                t.voluntary_cs = v.trim().parse().unwrap_or(0);
            } else if let Some(v) = l.strip_prefix("nonvoluntary_ctxt_switches:") {
                t.involuntary_cs = v.trim().parse().unwrap_or(0);
            }
        }
        Some(t)
    }

    /// A process with all its threads (their context switches with `cs`: the
    /// per-thread status files are half the cost); None once it is gone.
    pub(crate) fn process(&mut self, pid: i32, numa: bool, cs: bool) -> Option<Process> {
        let status = self.read(&format!("{pid}/status"))?.to_string();
        let mut p = Process {
            pid,
            ..Default::default()
        };
        for l in status.lines() {
            if let Some(v) = l.strip_prefix("Name:") {
                p.comm = v.trim().to_string();
            } else if let Some(v) = l.strip_prefix("VmRSS:") {
                p.rss_kib = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            } else if let Some(v) = l.strip_prefix("Cpus_allowed_list:") {
                p.affinity = CpuSet::parse_list(v.trim()).unwrap_or_default();
            } else if let Some(v) = l.strip_prefix("State:")
                && v.trim_start().starts_with('Z')
            {
                return None;
            }
        }
        let task_dir = format!("{}/proc/{pid}/task", self.root);
        let tids: Vec<i32> = std::fs::read_dir(&task_dir)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let task = std::fs::File::open(&task_dir).ok()?;
        for tid in tids {
            if let Some(t) = self.thread(&task, tid, cs) {
                p.threads.push(t);
            }
            // Children by process::children's rule: every thread's.
            let name = std::ffi::CString::new(format!("{tid}/children")).ok()?;
            if let Some(c) = self.read_at(&task, &name) {
                super::process::add_children(&mut p.children, c);
            }
        }
        super::process::finish_children(&mut p.children);
        if numa && let Some(maps) = self.read(&format!("{pid}/numa_maps")) {
            p.pages_per_node = Some(own_pages_per_node(maps));
        }
        Some(p)
    }

    /// The whole machine's CPU time so far, from /proc/stat's `cpu` line.
    pub(crate) fn system(&mut self) -> Option<SystemTimes> {
        let stat = self.read("stat")?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest is in user).
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        (v.len() >= 4).then(|| SystemTimes {
            busy_ticks: at(0) + at(1) + at(2) + at(5) + at(6),
            steal_ticks: at(7),
        })
    }

    /// Busy and total ticks per CPU, from /proc/stat.
    pub(crate) fn cpu_times(&mut self) -> BTreeMap<usize, (u64, u64)> {
        let mut out = BTreeMap::new();
        let Some(stat) = self.read("stat") else {
            return out;
        };
        for l in stat.lines() {
            let Some(rest) = l.strip_prefix("cpu") else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let Some(Ok(cpu)) = it.next().map(str::parse::<usize>) else {
                continue; // the "cpu" total line
            };
            let v: Vec<u64> = it.filter_map(|x| x.parse().ok()).collect();
            if v.len() >= 4 {
                let idle = v[3] + v.get(4).copied().unwrap_or(0);
                let total: u64 = v.iter().take(8).sum();
                out.insert(cpu, (total - idle, total));
            }
        }
        out
    }
}

/// The machine's CPU time, in clock ticks (all CPUs together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SystemTimes {
    /// Running anything: user, nice, system, irq, softirq.
    pub busy_ticks: u64,
    /// Taken by the hypervisor for other guests.
    pub steal_ticks: u64,
}

impl SystemTimes {
    /// What happened between `self` and `later`, in seconds: (busy, steal).
    pub(crate) fn since(self, later: SystemTimes) -> (f64, f64) {
        let hz = ticks_per_second();
        (
            later.busy_ticks.saturating_sub(self.busy_ticks) as f64 / hz,
            later.steal_ticks.saturating_sub(self.steal_ticks) as f64 / hz,
        )
    }
}

/// Clock ticks per second (USER_HZ).
pub(crate) fn ticks_per_second() -> f64 {
    // SAFETY: plain query.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// A process's own pages per NUMA node, from its numa_maps: heap, stacks,
/// anonymous and shared-memory mappings (`/dev/shm`, memfd, SysV: where
/// DataLoader workers hand over batches). Not files such as its libraries:
/// the page cache holds one copy, on the node of whoever read it first, so
/// every rank but one would look remote (a Grace guest's rank 1 showed 22%
/// of its pages off its node, all of them the workload's own binary and libc).
pub(crate) fn own_pages_per_node(numa_maps: &str) -> BTreeMap<usize, u64> {
    let mut per: BTreeMap<usize, u64> = BTreeMap::new();
    for line in numa_maps.lines() {
        let file = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("file="));
        if file.is_some_and(|f| {
            !(f.starts_with("/dev/shm/") || f.starts_with("/memfd:") || f.starts_with("/SYSV"))
        }) {
            continue;
        }
        for word in line.split_whitespace() {
            if let Some(rest) = word.strip_prefix('N')
                && let Some((n, pages)) = rest.split_once('=')
                && let (Ok(n), Ok(pages)) = (n.parse::<usize>(), pages.parse::<u64>())
            {
                *per.entry(n).or_default() += pages;
            }
        }
    }
    per
}

#[cfg(test)]
mod numa_maps_tests {
    #[test]
    fn own_pages_leave_out_files_but_keep_shared_memory() {
        // Rank 1 of the Grace guest, bound to node 1: its binary and libc
        // were read into the page cache by rank 0, on node 0.
        let maps = "\
aaaab0000000 default file=/usr/bin/threadwise-workload mapped=120 mapmax=6 N0=120 kernelpagesize_kB=4
aaaab0200000 default file=/usr/bin/threadwise-workload anon=3 dirty=3 mapmax=2 N1=3 kernelpagesize_kB=4
aaaac0000000 default heap anon=900 dirty=900 N1=900 kernelpagesize_kB=4
ffff80000000 default anon=2000 dirty=2000 N1=1990 N0=10 kernelpagesize_kB=4
ffff90000000 default file=/lib/libc.so.6 mapped=300 mapmax=8 N0=300 kernelpagesize_kB=4
ffffa0000000 default file=/dev/shm/torch_123_456 dirty=64 N1=64 kernelpagesize_kB=4
ffffa1000000 default file=/memfd:torch_shm\\040(deleted) dirty=16 N1=16 kernelpagesize_kB=4
ffffd0000000 default stack anon=40 dirty=40 N1=40 kernelpagesize_kB=4
";
        let per = super::own_pages_per_node(maps);
        assert_eq!(per, [(0, 10), (1, 900 + 1990 + 64 + 16 + 40)].into());
    }
}
