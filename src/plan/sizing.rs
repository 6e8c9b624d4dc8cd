//! How many compute threads and DataLoader workers a rank gets. Our rules count
//! the rank's own cores and the cgroup budget; the seed profile reproduces the
//! guides' formulas exactly and says where they go wrong on this machine.

use super::place::Slice;
use super::{Amount, PlanRequest, Profile};
use crate::cpuset::CpuSet;
use crate::topology::Topology;

pub(super) struct Size {
    pub threads: usize,
    pub workers: usize,
    pub worker_cpus: CpuSet,
}

/// Most DataLoader workers a GPU rank gets by default: beyond this they cost
/// memory (each is a copy of the dataset object) for little throughput.
const MAX_AUTO_WORKERS: usize = 8;

/// What a rank computes on: its cores (the performance ones of a hybrid
/// CPU), counted as the request counts them, split among its sharers.
struct Units {
    hybrid: bool,
    /// Cores it computes on.
    cores: usize,
    /// Compute units (cores, or CPUs with --smt) of its own.
    units: usize,
}

fn units(
    topo: &Topology,
    req: &PlanRequest,
    slice: &Slice,
    has_gpu: bool,
    reasons: &mut Vec<String>,
) -> Units {
    // Hybrid: compute threads on the performance cores only (an OpenMP loop
    // split evenly waits for its slowest thread); efficiency cores feed workers.
    let fast: Vec<&CpuSet> = slice
        .core_sets
        .iter()
        .filter(|c| !c.is_subset(&slice.efficiency))
        .collect();
    let hybrid = !slice.efficiency.is_empty() && !fast.is_empty() && slice.bind;
    let (n_cores, n_cpus) = if hybrid {
        (fast.len(), fast.iter().map(|c| c.len()).sum())
    } else {
        (slice.cores, slice.cpus.len())
    };
    let per_core = if req.smt {
        n_cpus.max(n_cores)
    } else {
        n_cores
    };
    if hybrid {
        reasons.push(capacity_note(topo, slice));
    }
    if hybrid && has_gpu {
        reasons.push(format!(
            "hybrid CPU: compute threads count only the {} performance core(s)",
            fast.len()
        ));
    }
    Units {
        hybrid,
        cores: n_cores,
        // Ranks sharing a node or package split its cores between them.
        units: (per_core / slice.sharers.max(1)).max(1),
    }
}

pub(super) fn size(
    topo: &Topology,
    req: &PlanRequest,
    slice: &Slice,
    has_gpu: bool,
    nproc: usize,
    reasons: &mut Vec<String>,
) -> Size {
    let u = units(topo, req, slice, has_gpu, reasons);
    let (mut threads, mut workers) = match req.profile {
        Profile::Seed => seed(topo, req, nproc, reasons),
        Profile::Auto => auto(req, slice, &u, has_gpu, reasons),
    };
    if req.profile == Profile::Auto {
        threads = within_budget(topo, nproc, threads, reasons);
    }
    if let Amount::Fixed(t) = req.threads {
        threads = t.max(1);
        if t > u.units {
            reasons.push(format!(
                "{t} threads asked on {} {}: oversubscribed",
                u.units,
                unit_word(req)
            ));
        }
    }
    if let Amount::Fixed(w) = req.workers {
        workers = w;
    }
    let worker_cpus = worker_cpus(
        topo, req, slice, u.hybrid, has_gpu, threads, workers, reasons,
    );
    Size {
        threads,
        workers,
        worker_cpus,
    }
}

/// Our rule's threads and workers for a GPU rank, a hybrid CPU rank and a CPU rank.
fn auto(
    req: &PlanRequest,
    slice: &Slice,
    u: &Units,
    has_gpu: bool,
    reasons: &mut Vec<String>,
) -> (usize, usize) {
    let units = u.units;
    if has_gpu {
        let t = units.div_ceil(4).clamp(1, 4);
        let room = units.saturating_sub(t) + slice.extra_cores;
        let w = room.clamp(1, MAX_AUTO_WORKERS);
        reasons.push(format!(
            "GPU rank: {t} compute thread(s) of {units} {}; {w} DataLoader worker(s) on the rest{}{}",
            unit_word(req),
            if slice.extra_cores > 0 {
                format!(" and on the {} worker-only core(s)", slice.extra_cores)
            } else {
                String::new()
            },
            if room > MAX_AUTO_WORKERS { format!(" (capped at {MAX_AUTO_WORKERS})") } else { String::new() }
        ));
        (t, w)
    } else if u.hybrid {
        let slow = slice.core_sets.len() - u.cores;
        let w = slow.clamp(1, MAX_AUTO_WORKERS);
        reasons.push(format!(
            "CPU rank: all {units} performance core(s) compute; {w} DataLoader worker(s) on its {slow} efficiency core(s)"
        ));
        (units, w)
    } else {
        // At least two: with one, the step waits whenever that worker's
        // batch is slow; a second keeps a batch ready (measured on the
        // PyTorch example, 2 ranks on 2 cores: 1 worker 0.93x torchrun's
        // default, 2 workers 1.04x; scripts/bench-run-vs-torchrun.sh).
        let w = (units / 4).clamp(2, 4);
        reasons.push(format!(
            "CPU rank: all {units} {} compute; {w} DataLoader worker(s) (at least 2, so one \
             batch is ready while another is slow)",
            unit_word(req)
        ));
        (units, w)
    }
}

/// Threads capped by each rank's share of the cgroup CPU budget (and a
/// share under one CPU said).
fn within_budget(
    topo: &Topology,
    nproc: usize,
    threads: usize,
    reasons: &mut Vec<String>,
) -> usize {
    let budget = topo.cpu_budget / nproc as f64;
    let budget_cap = (budget.floor() as usize).max(1);
    // Where the budget comes from: a CPU quota below the allowed CPUs, or the
    // allowed CPUs themselves (a cpuset, the machine).
    let quota = topo
        .limits
        .cpu_quota
        .is_some_and(|q| q < topo.allowed_cpus.len() as f64);
    let source = if quota {
        format!("the cgroup CPU quota of {:.2} CPUs", topo.cpu_budget)
    } else {
        format!("the {} allowed CPU(s)", topo.allowed_cpus.len())
    };
    let mut threads = threads;
    if threads > budget_cap {
        let verb = if quota { "allows" } else { "allow" };
        reasons.push(format!(
            "{source} over {nproc} rank(s) {verb} {budget_cap} thread(s) each"
        ));
        threads = budget_cap;
    }
    if budget < 1.0 {
        reasons.push(if quota {
            format!(
                "{source} gives each of {nproc} rank(s) {budget:.2} CPU: less than one, so the \
                 quota throttles every rank whatever the threads; raise the quota or start fewer ranks"
            )
        } else {
            format!(
                "{source} give each of {nproc} rank(s) {budget:.2} CPU: less than one, so ranks \
                 share CPUs and wait for each other; start fewer ranks or allow more CPUs"
            )
        });
    }
    threads
}

/// Where the rank's DataLoader workers run. GPU ranks: the cores after the
/// compute threads' ones and the worker-only cores of GPU-less nodes. CPU
/// ranks compute on all their cores, so their workers may use any allowed
/// CPU of the rank's NUMA node(s): a worker stuck behind its own rank's
/// compute threads stalls the step whenever one batch is slow to make,
/// while another rank's core is idle in its all-reduce.
#[allow(clippy::too_many_arguments)]
fn worker_cpus(
    topo: &Topology,
    req: &PlanRequest,
    slice: &Slice,
    hybrid: bool,
    has_gpu: bool,
    threads: usize,
    workers: usize,
    reasons: &mut Vec<String>,
) -> CpuSet {
    let spare: CpuSet = slice
        .core_sets
        .iter()
        .skip(threads)
        .fold(CpuSet::new(), |a, s| a.union(s))
        .union(&slice.extra);
    if hybrid && !has_gpu {
        return slice.efficiency.clone();
    }
    if has_gpu && !spare.is_empty() && slice.bind {
        return spare;
    }
    if !(!has_gpu && slice.bind && workers > 0 && req.profile == Profile::Auto) {
        return slice.cpus.clone();
    }
    let near = topo
        .numa_nodes
        .iter()
        .filter(|n| n.cpus.intersects(&slice.cpus))
        .fold(CpuSet::new(), |a, n| a.union(&n.cpus))
        .intersection(&topo.allowed_cpus);
    let near = if near.is_empty() {
        topo.allowed_cpus.clone()
    } else {
        near
    };
    if near != slice.cpus {
        reasons.push(format!(
            "DataLoader workers may run on CPUs {near} (the allowed CPUs of its NUMA node(s)): \
             its own {} core(s) run its {threads} compute thread(s), and a worker queued behind \
             them stalls the step when a batch is slow; threadwise run moves its child processes there",
            slice.cores
        ));
    }
    near
}

/// How much compute a hybrid rank has: its cores weighted by their capacity
/// (cpu_capacity, else maximum frequency) against the machine's fastest core.
fn capacity_note(topo: &Topology, slice: &Slice) -> String {
    let cap_of = |set: &CpuSet| {
        topo.cores
            .iter()
            .find(|c| c.cpus.intersects(set))
            .and_then(|c| c.capacity)
    };
    let best = topo.cores.iter().filter_map(|c| c.capacity).max();
    let slow = slice
        .core_sets
        .iter()
        .filter(|c| c.is_subset(&slice.efficiency))
        .count();
    let fast = slice.core_sets.len() - slow;
    // The capacity of the rank's performance (false) or efficiency (true)
    // cores in fastest-core units; None when a core shows none.
    let weight = |efficient: bool| -> Option<f64> {
        let best = best.filter(|b| *b > 0)? as f64;
        slice
            .core_sets
            .iter()
            .filter(|c| c.is_subset(&slice.efficiency) == efficient)
            .map(|c| cap_of(c).map(|v| v as f64 / best))
            .sum()
    };
    match (weight(false), weight(true)) {
        (Some(p), Some(e)) => {
            format!(
                "hybrid CPU: {fast} performance + {slow} efficiency core(s) = {:.1} fastest-core \
                 equivalents by capacity ({p:.1} + {e:.1}); compute threads follow the performance cores",
                p + e
            )
        }
        _ => format!(
            "hybrid CPU: {fast} performance + {slow} efficiency core(s) (sysfs shows no capacity \
             to weigh them); compute threads follow the performance cores"
        ),
    }
}

fn unit_word(req: &PlanRequest) -> &'static str {
    if req.smt {
        "CPUs (SMT)"
    } else {
        "physical cores"
    }
}

/// The guides' formulas, exactly: os.cpu_count() over the global world size.
fn seed(
    topo: &Topology,
    req: &PlanRequest,
    nproc: usize,
    reasons: &mut Vec<String>,
) -> (usize, usize) {
    let cpu_count = topo.online_cpus.len();
    let world = nproc * req.nnodes.max(1);
    let cap = if req.amp { 2 } else { 4 };
    let threads = (cpu_count / world).max(1).min(cap);
    let workers = (cpu_count / world).saturating_sub(1).clamp(1, 4);
    reasons.push(format!(
        "seed profile: threads = min({cap}, max(1, {cpu_count} // {world})) = {threads}; \
         workers = min(4, max(1, {cpu_count} // {world} - 1)) = {workers}"
    ));
    if req.nnodes > 1 {
        reasons.push(format!(
            "seed profile divides by the global world size {world}, but only {nproc} ranks share this node"
        ));
    }
    let allowed = topo.allowed_cpus.len();
    if (topo.cpu_budget as usize) < cpu_count {
        reasons.push(format!(
            "seed profile trusts os.cpu_count() = {cpu_count}, but this process may use {allowed} CPUs \
             with a budget of {:.2}",
            topo.cpu_budget
        ));
    }
    let busy = nproc * (threads + workers);
    if busy as f64 > topo.cpu_budget {
        reasons.push(format!(
            "seed profile: {nproc} ranks x ({threads} threads + {workers} workers) = {busy} busy threads \
             on {:.2} CPUs of budget",
            topo.cpu_budget
        ));
    }
    (threads, workers)
}
