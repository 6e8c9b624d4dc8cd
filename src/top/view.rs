//! Two snapshots of the same targets into one view: each rank's CPU use,
//! threads, context switches, the CPUs its threads (and its workers') ran
//! on, its pages' nodes, and the alerts with their reasons.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Alert, AlertKind, PREEMPTED_PER_S, REMOTE_PCT, RankSnap, RankView, Snapshot, TOP_SCHEMA,
    Target, ThreadView, View, WorkerView,
};
use crate::cpuset::CpuSet;
use crate::measure::proc::{self, Process};

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
        by_thread: vec![],
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
        by_thread: thread_views(t, main),
    }
}

/// Each thread of the rank's own process: its role, its mask, its role's
/// CPUs and the corrections `run` made to it.
fn thread_views(t: &Target, main: &crate::measure::proc::Process) -> Vec<ThreadView> {
    main.threads
        .iter()
        .map(|th| {
            let role = crate::roles::classify(main.pid, th.tid, &th.name, None);
            ThreadView {
                tid: th.tid,
                name: th.name.clone(),
                role,
                cpus: th.allowed.clone(),
                role_cpus: t.roles.as_ref().map_or(&t.cpus, |l| l.of(role)).clone(),
                corrections: t.corrections.get(&th.tid).copied().unwrap_or(0),
            }
        })
        .collect()
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
