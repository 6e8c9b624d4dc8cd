//! `threadwise top`: the running ranks against what their plan meant them to
//! get. A sampler (`proc.rs`, the only OS part) takes snapshots of each rank's
//! process tree and the CPUs; `view` turns two snapshots into rates, the CPUs
//! threads actually ran on, and alerts with their reasons; `ui.rs` draws it
//! (ratatui), or it is printed as JSON. Ranks are found by `find.rs`: the
//! state file `threadwise run` writes, `--pid`, or every launcher-started rank
//! (`--all`).

pub(crate) mod find;
pub(crate) mod watch;

pub(crate) mod ui;

use std::collections::{BTreeMap, BTreeSet};
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

fn ticks(p: &Process) -> BTreeMap<i32, (u64, u64, u64, u64)> {
    p.threads
        .iter()
        .map(|t| (t.tid, (t.utime, t.stime, t.voluntary_cs, t.involuntary_cs)))
        .collect()
}

/// Per-process deltas: (user ticks, sys ticks, vol cs, invol cs, CPUs run on).
fn delta(prev: Option<&Process>, cur: &Process) -> (u64, u64, u64, u64, CpuSet) {
    let before = prev.map(ticks).unwrap_or_default();
    let (mut u, mut s, mut v, mut iv) = (0, 0, 0, 0);
    let mut ran = CpuSet::new();
    for t in &cur.threads {
        let (pu, ps, pv, piv) = before.get(&t.tid).copied().unwrap_or((
            t.utime,
            t.stime,
            t.voluntary_cs,
            t.involuntary_cs,
        ));
        let (du, ds) = (t.utime.saturating_sub(pu), t.stime.saturating_sub(ps));
        u += du;
        s += ds;
        // A count not read on either side is no switch.
        let d = |now: u64, then: u64| {
            if now == proc::UNKNOWN || then == proc::UNKNOWN {
                0
            } else {
                now.saturating_sub(then)
            }
        };
        v += d(t.voluntary_cs, pv);
        iv += d(t.involuntary_cs, piv);
        if du + ds > 0 || (t.state == 'R' && prev.is_some()) {
            ran.insert(t.cpu);
        }
    }
    (u, s, v, iv, ran)
}

/// An interval's clock: CPU ticks into percent of one CPU, counts into rates.
struct Rates {
    hz: f64,
    dt: f64,
    /// Switches are counted over the time between their readings.
    dt_cs: f64,
}

impl Rates {
    fn pct(&self, ticks: u64) -> f64 {
        100.0 * ticks as f64 / self.hz / self.dt
    }
    fn cs_per_s(&self, n: u64) -> f64 {
        n as f64 / self.dt_cs
    }
}

/// The view of one interval, from two snapshots of the same targets.
pub(crate) fn view(targets: &[Target], prev: &Snapshot, cur: &Snapshot, hz: f64) -> View {
    let dt = (cur.at - prev.at).max(1e-3);
    let r = Rates {
        hz,
        dt,
        dt_cs: (cur.cs_at - prev.cs_at).max(1e-3),
    };
    let mut alerts = vec![];
    let ranks = targets
        .iter()
        .enumerate()
        .map(|(i, t)| rank_view(t, cur.ranks.get(i), prev.ranks.get(i), &r, &mut alerts))
        .collect();
    View {
        schema: TOP_SCHEMA.to_string(),
        interval_s: dt,
        ranks,
        cpu_busy_pct: cpu_busy(prev, cur),
        alerts: dedupe(alerts),
    }
}

/// A rank that is gone.
fn gone(t: &Target, alerts: &mut Vec<Alert>) -> RankView {
    alerts.push(Alert {
        local_rank: t.local_rank,
        kind: AlertKind::Exited,
        reason: format!("rank {} (pid {}) is gone", t.local_rank, t.pid),
    });
    RankView {
        local_rank: t.local_rank,
        pid: t.pid,
        alive: false,
        comm: String::new(),
        cpu_user_pct: 0.0,
        cpu_sys_pct: 0.0,
        threads: 0,
        runnable: 0,
        voluntary_cs_per_s: 0.0,
        involuntary_cs_per_s: 0.0,
        planned: t.cpus.clone(),
        ran_on: CpuSet::new(),
        rss_mib: 0.0,
        local_pages_pct: None,
        workers: vec![],
        gpu: None,
    }
}

/// One rank over the interval, its alerts added to `alerts`.
fn rank_view(
    t: &Target,
    now: Option<&RankSnap>,
    before: Option<&RankSnap>,
    r: &Rates,
    alerts: &mut Vec<Alert>,
) -> RankView {
    let Some(main) = now.and_then(|n| n.main.as_ref()) else {
        return gone(t, alerts);
    };
    let (u, s, v, iv, ran_on) = delta(before.and_then(|b| b.main.as_ref()), main);
    let children = now.map(|n| n.children.as_slice()).unwrap_or_default();
    let (workers, w_runnable, w_invol) = workers(t, children, before, r, alerts);
    let runnable = main.threads.iter().filter(|t| t.state == 'R').count() + w_runnable;
    let local_pages_pct = main.pages_per_node.as_ref().and_then(|per| {
        let total: u64 = per.values().sum();
        (total > 0 && !t.mem_nodes.is_empty()).then(|| {
            let local: u64 = t.mem_nodes.iter().filter_map(|n| per.get(n)).sum();
            100.0 * local as f64 / total as f64
        })
    });
    let mut alert = |kind, reason| {
        alerts.push(Alert {
            local_rank: t.local_rank,
            kind,
            reason,
        })
    };
    let k = t.local_rank;
    if !ran_on.is_subset(&t.cpus) {
        let why = format!(
            "rank {k} ran on CPUs {ran_on} outside its planned {} (its mask is {})",
            t.cpus, main.affinity
        );
        alert(AlertKind::OffPlan, why);
    }
    if runnable > t.cpus.len().max(1) {
        let why = format!(
            "rank {k}: {runnable} runnable threads on {} CPU(s) ({})",
            t.cpus.len(),
            t.cpus
        );
        alert(AlertKind::Oversubscribed, why);
    }
    let invol_s = r.cs_per_s(iv + w_invol);
    if invol_s > PREEMPTED_PER_S {
        let why = format!(
            "rank {k}: {invol_s:.0} involuntary context switches/s: its threads are preempted"
        );
        alert(AlertKind::Preempted, why);
    }
    if let Some(l) = local_pages_pct
        && 100.0 - l > REMOTE_PCT
    {
        let why = format!(
            "rank {k}: {:.0}% of its pages are off its node(s) {:?}",
            100.0 - l,
            t.mem_nodes
        );
        alert(AlertKind::RemoteMemory, why);
    }
    RankView {
        local_rank: t.local_rank,
        pid: t.pid,
        alive: true,
        comm: main.comm.clone(),
        cpu_user_pct: r.pct(u),
        cpu_sys_pct: r.pct(s),
        threads: main.threads.len(),
        runnable,
        voluntary_cs_per_s: r.cs_per_s(v),
        involuntary_cs_per_s: r.cs_per_s(iv),
        planned: t.cpus.clone(),
        ran_on,
        rss_mib: main.rss_kib as f64 / 1024.0,
        local_pages_pct,
        workers,
        gpu: None,
    }
}

/// A rank's workers (its child processes) over the interval, with their
/// runnable threads and involuntary switches; a worker off its CPUs is an alert.
fn workers(
    t: &Target,
    children: &[Process],
    before: Option<&RankSnap>,
    r: &Rates,
    alerts: &mut Vec<Alert>,
) -> (Vec<WorkerView>, usize, u64) {
    let worker_set = if t.worker_cpus.is_empty() {
        &t.cpus
    } else {
        &t.worker_cpus
    };
    let (mut runnable, mut invol) = (0, 0);
    let mut out = vec![];
    for c in children {
        let old = before.and_then(|b| b.children.iter().find(|p| p.pid == c.pid));
        let (cu, cs, _, civ, cran) = delta(old, c);
        runnable += c.threads.iter().filter(|t| t.state == 'R').count();
        invol += civ;
        if !cran.is_subset(worker_set) && !cran.is_subset(&t.cpus) {
            alerts.push(Alert {
                local_rank: t.local_rank,
                kind: AlertKind::OffPlan,
                reason: format!(
                    "rank {} worker {} ({}) ran on CPUs {} outside its set {}",
                    t.local_rank, c.pid, c.comm, cran, worker_set
                ),
            });
        }
        out.push(WorkerView {
            pid: c.pid,
            comm: c.comm.clone(),
            cpu_pct: r.pct(cu + cs),
            allowed: c.affinity.clone(),
            ran_on: cran,
        });
    }
    (out, runnable, invol)
}

/// Each CPU's busy share over the interval.
fn cpu_busy(prev: &Snapshot, cur: &Snapshot) -> BTreeMap<usize, f64> {
    cur.cpus
        .iter()
        .filter_map(|(c, (busy, total))| {
            let (pb, pt) = prev.cpus.get(c)?;
            let dtot = total.saturating_sub(*pt);
            Some((
                *c,
                if dtot == 0 {
                    0.0
                } else {
                    100.0 * busy.saturating_sub(*pb) as f64 / dtot as f64
                },
            ))
        })
        .collect()
}

fn dedupe(v: Vec<Alert>) -> Vec<Alert> {
    let mut seen = BTreeSet::new();
    v.into_iter()
        .filter(|a| seen.insert((a.local_rank, a.kind.name(), a.reason.clone())))
        .collect()
}

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

    /// Wait `interval`, then the view.
    pub fn after(&mut self, interval: Duration) -> View {
        std::thread::sleep(interval);
        self.sample()
    }
}

#[cfg(test)]
mod tests;
