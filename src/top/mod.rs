//! `threadwise top`: the running ranks against what their plan meant them to
//! get. A sampler (`proc.rs`, the only OS part) takes snapshots of each rank's
//! process tree and the CPUs; `view` turns two snapshots into rates, the CPUs
//! threads actually ran on, and alerts with their reasons; `ui.rs` draws it
//! (ratatui), or it is printed as JSON. Ranks are found by `find.rs`: the
//! state file `threadwise run` writes, `--pid`, or every launcher-started rank
//! (`--all`).

pub(crate) mod find;
pub(crate) mod ui;
mod view;
pub(crate) mod watch;

pub(crate) use view::view;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
use crate::measure::proc::{self, ProcReader, Process};

pub(crate) const TOP_SCHEMA: &str = "threadwise.top/1";

/// A rank to watch, with what it was meant to get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub local_rank: usize,
    pub pid: i32,
    /// The CPUs the plan gave it (its affinity when no plan is known).
    pub cpus: CpuSet,
    /// Where its DataLoader workers may run (empty: its own CPUs).
    #[serde(default)]
    pub worker_cpus: CpuSet,
    /// NUMA nodes its memory should be on (empty: unknown).
    #[serde(default)]
    pub mem_nodes: Vec<usize>,
    /// The PCI bus id of the GPU its plan named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Where its roles run (`--roles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<crate::roles::RoleCpus>,
    /// Corrections of its threads so far, by thread id (`run`'s holder).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub corrections: BTreeMap<i32, u32>,
}

/// One rank's process tree at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct RankSnap {
    pub main: Option<Process>,
    pub children: Vec<Process>,
}

/// Everything at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// Seconds since the sampler started.
    pub at: f64,
    /// When the threads' context switches were last read (== `at` when this
    /// snapshot read them; earlier when they were carried forward).
    pub cs_at: f64,
    pub ranks: Vec<RankSnap>,
    pub cpus: BTreeMap<usize, (u64, u64)>,
}

/// Take a snapshot of every target (NUMA pages too when `numa`, context
/// switches when `cs`).
pub(crate) fn snapshot(
    r: &mut ProcReader,
    targets: &[Target],
    at: f64,
    numa: bool,
    cs: bool,
) -> Snapshot {
    let ranks = targets
        .iter()
        .map(|t| {
            let main = r.process(t.pid, numa, cs);
            let children = main
                .as_ref()
                .map(|m| m.children.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| r.process(c, false, cs))
                .collect();
            RankSnap { main, children }
        })
        .collect();
    Snapshot {
        at,
        cs_at: at,
        ranks,
        cpus: r.cpu_times(),
    }
}

/// Give `cur`'s threads the context-switch counts `prev` had (this sample
/// did not read them), and `prev`'s time of reading.
fn carry_cs(prev: &Snapshot, cur: &mut Snapshot) {
    cur.cs_at = prev.cs_at;
    let procs = |s: &Snapshot| -> BTreeMap<i32, Process> {
        s.ranks
            .iter()
            .flat_map(|r| r.main.iter().chain(r.children.iter()))
            .map(|p| (p.pid, p.clone()))
            .collect()
    };
    let old = procs(prev);
    for r in &mut cur.ranks {
        for p in r.main.iter_mut().chain(r.children.iter_mut()) {
            let before = old.get(&p.pid);
            for t in &mut p.threads {
                let o = before.and_then(|b| b.threads.iter().find(|x| x.tid == t.tid));
                t.voluntary_cs = o.map_or(proc::UNKNOWN, |o| o.voluntary_cs);
                t.involuntary_cs = o.map_or(proc::UNKNOWN, |o| o.involuntary_cs);
            }
        }
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum AlertKind ("an alert,") {
        /// More runnable threads than CPUs in the rank's set.
        Oversubscribed => "oversubscribed",
        /// A thread of the rank or its workers ran outside its set.
        OffPlan => "off-plan",
        /// Many involuntary context switches: threads are preempted.
        Preempted => "preempted",
        /// Much of the rank's memory is on other NUMA nodes.
        RemoteMemory => "remote-memory",
        /// The rank is gone.
        Exited => "exited",
        /// The rank runs on a GPU its plan did not name.
        GpuDrift => "gpu-drift",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub local_rank: usize,
    pub kind: AlertKind,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    pub pid: i32,
    pub comm: String,
    pub cpu_pct: f64,
    /// Its affinity mask.
    pub allowed: CpuSet,
    pub ran_on: CpuSet,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankView {
    pub local_rank: usize,
    pub pid: i32,
    pub alive: bool,
    pub comm: String,
    pub cpu_user_pct: f64,
    pub cpu_sys_pct: f64,
    pub threads: usize,
    /// Threads of the rank and its workers in state R.
    pub runnable: usize,
    pub voluntary_cs_per_s: f64,
    pub involuntary_cs_per_s: f64,
    pub planned: CpuSet,
    /// CPUs its own threads ran on during the interval.
    pub ran_on: CpuSet,
    pub rss_mib: f64,
    /// Share of its pages on its memory nodes, when numa_maps was read.
    pub local_pages_pct: Option<f64>,
    pub workers: Vec<WorkerView>,
    /// Its GPU as NVML sees it (null without NVML or a GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuView>,
    /// Each thread of its own process, with its role.
    #[serde(default)]
    pub by_thread: Vec<ThreadView>,
}

/// One thread of a rank: what it is, where it may run, where its role
/// belongs, and how often `run` put it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadView {
    pub tid: i32,
    pub name: String,
    pub role: crate::roles::Role,
    /// Its affinity mask.
    pub cpus: CpuSet,
    /// Where its role belongs: the role layout's CPUs, else the rank's.
    pub role_cpus: CpuSet,
    pub corrections: u32,
}

/// A rank's GPU: the planned GPU's utilisation, the memory the rank's
/// processes hold, and every GPU they were seen on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// The GPU its plan named.
    pub planned: Option<String>,
    /// That GPU's utilisation (every process's).
    pub util_pct: Option<f64>,
    /// Memory the rank's own processes hold, over all GPUs.
    pub mem_mib: f64,
    /// The GPUs its processes hold memory on (NVML's process lists).
    pub on: Vec<String>,
}

/// Each rank's GPU from one NVML reading of every GPU; a drift alert when a
/// rank's processes are on a GPU its plan did not name.
pub(crate) fn gpu_views(
    targets: &[Target],
    now: &[crate::measure::gpu::GpuNow],
    ranks: &mut [RankView],
    alerts: &mut Vec<Alert>,
) {
    for (t, r) in targets.iter().zip(ranks.iter_mut()) {
        let (mut mem, mut on) = (0.0, Vec::<String>::new());
        for g in now {
            for &(pid, mib) in &g.processes {
                if crate::measure::gpu::owner(pid, &[t.pid]).is_some() {
                    mem += mib;
                    if !on.contains(&g.bus_id) {
                        on.push(g.bus_id.clone());
                    }
                }
            }
        }
        let util = t
            .gpu
            .as_ref()
            .and_then(|b| now.iter().find(|g| &g.bus_id == b))
            .and_then(|g| g.util_pct);
        if t.gpu.is_none() && on.is_empty() {
            continue;
        }
        let strays: Vec<&String> = on.iter().filter(|b| Some(*b) != t.gpu.as_ref()).collect();
        if let Some(planned) = &t.gpu
            && !strays.is_empty()
        {
            alerts.push(Alert {
                local_rank: t.local_rank,
                kind: AlertKind::GpuDrift,
                reason: format!(
                    "rank {} runs on GPU {} but its plan named {planned}: check CUDA_VISIBLE_DEVICES and cuda:LOCAL_RANK in the script",
                    t.local_rank,
                    strays.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ),
            });
        }
        r.gpu = Some(GpuView {
            planned: t.gpu.clone(),
            util_pct: util,
            mem_mib: mem,
            on,
        });
    }
}

/// What `top` shows for one interval (`--json`: one of these per line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    pub schema: String,
    pub interval_s: f64,
    pub ranks: Vec<RankView>,
    /// Busy % of each CPU over the interval.
    pub cpu_busy_pct: BTreeMap<usize, f64>,
    pub alerts: Vec<Alert>,
}

/// Involuntary switches per second (per rank and its workers) above which
/// threads are being preempted, not yielding.
pub(crate) const PREEMPTED_PER_S: f64 = 1000.0;
/// Remote pages above this share (with a known memory node) raise an alert.
pub(crate) const REMOTE_PCT: f64 = 20.0;

/// Context switches are read every this many samples (the per-thread
/// status files cost as much as everything else); rates span the readings.
const CS_STRIDE: u64 = 3;
/// numa_maps is read every this many samples: it walks the page tables.
const NUMA_STRIDE: u64 = 10;

/// Samples targets at an interval and yields views.
pub struct Sampler {
    reader: ProcReader,
    targets: Vec<Target>,
    prev: Snapshot,
    start: std::time::Instant,
    hz: f64,
    n: u64,
    /// The last switch rates per rank, and preemption alerts, shown between readings.
    last_cs: Vec<(f64, f64)>,
    last_preempted: Vec<Alert>,
    /// NVML when it loads (GPU columns), else none.
    nvml: Option<nvml_wrapper::Nvml>,
}

impl Sampler {
    pub fn new(targets: Vec<Target>) -> Sampler {
        let mut reader = ProcReader::new("/");
        let prev = snapshot(&mut reader, &targets, 0.0, true, true);
        Sampler {
            reader,
            targets,
            prev,
            start: std::time::Instant::now(),
            hz: proc::ticks_per_second(),
            n: 0,
            last_cs: vec![],
            last_preempted: vec![],
            nvml: crate::nvml::open().ok(),
        }
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// The view since the last call. Between the samples that read them,
    /// NUMA pages and context switches carry forward.
    pub fn sample(&mut self) -> View {
        self.n += 1;
        let at = self.start.elapsed().as_secs_f64();
        let cs = self.n % CS_STRIDE == 1;
        let mut cur = snapshot(
            &mut self.reader,
            &self.targets,
            at,
            self.n % NUMA_STRIDE == 0,
            cs,
        );
        for (s, p) in cur.ranks.iter_mut().zip(&self.prev.ranks) {
            if let (Some(m), Some(old)) = (s.main.as_mut(), p.main.as_ref())
                && m.pages_per_node.is_none()
            {
                m.pages_per_node = old.pages_per_node.clone();
            }
        }
        if !cs {
            carry_cs(&self.prev, &mut cur);
        }
        self.refresh_corrections();
        let mut v = view(&self.targets, &self.prev, &cur, self.hz);
        if cs {
            self.last_cs = v
                .ranks
                .iter()
                .map(|r| (r.voluntary_cs_per_s, r.involuntary_cs_per_s))
                .collect();
            self.last_preempted = v
                .alerts
                .iter()
                .filter(|a| a.kind == AlertKind::Preempted)
                .cloned()
                .collect();
        } else {
            for (r, (vol, inv)) in v.ranks.iter_mut().zip(&self.last_cs) {
                r.voluntary_cs_per_s = *vol;
                r.involuntary_cs_per_s = *inv;
            }
            v.alerts.retain(|a| a.kind != AlertKind::Preempted);
            v.alerts.extend(self.last_preempted.iter().cloned());
        }
        if let Some(n) = &self.nvml {
            let now = crate::measure::gpu::read(n, None);
            gpu_views(&self.targets, &now, &mut v.ranks, &mut v.alerts);
        }
        self.prev = cur;
        v
    }

    /// The corrections `run` has made to each target's threads so far, from
    /// the live runs' state files (a few small files, read once a sample).
    fn refresh_corrections(&mut self) {
        let runs = find::live_states();
        for t in &mut self.targets {
            if let Some(r) = runs.iter().flat_map(|s| &s.ranks).find(|r| r.pid == t.pid) {
                t.corrections = r.corrections.clone();
            }
        }
    }

    /// Wait `interval`, then the view.
    pub fn after(&mut self, interval: Duration) -> View {
        std::thread::sleep(interval);
        self.sample()
    }
}

#[cfg(test)]
mod tests;
