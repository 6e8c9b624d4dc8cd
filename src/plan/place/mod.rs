//! Where each rank runs: which allowed CPUs, by policy. Works on "units" (a
//! physical core with its allowed SMT siblings, or a whole L3 group) ordered by
//! NUMA node, then L3 group, then CPU number, so that contiguous runs of units
//! stay inside caches and nodes.

mod leftovers;

use std::collections::BTreeMap;

use super::{PlanError, PlanRequest, Policy};
use crate::cpuset::CpuSet;
use crate::topology::{PciDevice, Topology};

/// A rank's CPUs before sizing.
#[derive(Debug, Clone)]
pub(super) struct Slice {
    pub cpus: CpuSet,
    pub bind: bool,
    /// Physical cores in `cpus`, in placement order.
    pub core_sets: Vec<CpuSet>,
    pub cores: usize,
    /// How many ranks share these CPUs.
    pub sharers: usize,
    /// The efficiency cores (hybrid CPUs) among `core_sets`.
    pub efficiency: CpuSet,
    /// CPUs for this rank's DataLoader workers only (not bound to the rank):
    /// cores of GPU-less NUMA nodes shared out to the nearest GPU ranks.
    pub extra: CpuSet,
    /// Physical cores in `extra`.
    pub extra_cores: usize,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Unit {
    pub(super) cpus: CpuSet,
    pub(super) cores: Vec<CpuSet>,
    pub(super) node: Option<usize>,
    /// An efficiency core of a hybrid CPU.
    efficient: bool,
}

/// NUMA nodes whose CPUs meet `cpus`.
pub(super) fn nodes_of(topo: &Topology, cpus: &CpuSet) -> Vec<usize> {
    topo.numa_nodes
        .iter()
        .filter(|n| n.cpus.intersects(cpus))
        .map(|n| n.id)
        .collect()
}

/// Allowed physical cores, each with its allowed siblings, in placement order.
fn core_units(topo: &Topology) -> Vec<Unit> {
    let allowed = &topo.allowed_cpus;
    let mut sets: Vec<(CpuSet, bool)> = topo
        .cores
        .iter()
        .map(|c| {
            (
                c.cpus.intersection(allowed),
                c.kind == Some(crate::topology::CoreKind::Efficiency),
            )
        })
        .filter(|(s, _)| !s.is_empty())
        .collect();
    // Allowed CPUs no core lists (sources without core information).
    let covered = sets.iter().fold(CpuSet::new(), |a, (s, _)| a.union(s));
    sets.extend(
        allowed
            .difference(&covered)
            .iter()
            .map(|c| (std::iter::once(c).collect(), false)),
    );
    // CPU -> L3 group and CPU -> node tables: one pass over the groups instead
    // of a set intersection per core and group (4096-CPU machines).
    let width = topo.online_cpus.last().map_or(0, |c| c + 1);
    let mut l3_of = vec![None; width];
    for (i, g) in topo.l3_groups.iter().enumerate() {
        for c in g.cpus.iter().filter(|c| *c < width) {
            l3_of[c].get_or_insert(i);
        }
    }
    let mut node_of = vec![None; width];
    for n in &topo.numa_nodes {
        for c in n.cpus.iter().filter(|c| *c < width) {
            node_of[c].get_or_insert(n.id);
        }
    }
    let first = |s: &CpuSet| s.first().filter(|c| *c < width);
    let mut units: Vec<(Option<usize>, Option<usize>, Unit)> = sets
        .into_iter()
        .map(|(cpus, efficient)| {
            let node = first(&cpus).and_then(|c| node_of[c]);
            let l3 = first(&cpus).and_then(|c| l3_of[c]);
            (
                node,
                l3,
                Unit {
                    cores: vec![cpus.clone()],
                    cpus,
                    node,
                    efficient,
                },
            )
        })
        .collect();
    units.sort_by_key(|(node, l3, u)| (node.unwrap_or(usize::MAX), *l3, u.cpus.first()));
    units.into_iter().map(|(_, _, u)| u).collect()
}

/// Allowed L3 groups as units (empty when the topology has none).
fn l3_units(topo: &Topology, cores: &[Unit]) -> Vec<Unit> {
    let mut units: Vec<Unit> = topo
        .l3_groups
        .iter()
        .filter_map(|g| {
            let members: Vec<CpuSet> = cores
                .iter()
                .filter(|u| u.cpus.is_subset(&g.cpus))
                .map(|u| u.cpus.clone())
                .collect();
            let cpus = members.iter().fold(CpuSet::new(), |a, s| a.union(s));
            let efficient = cores
                .iter()
                .filter(|u| u.cpus.is_subset(&g.cpus))
                .all(|u| u.efficient);
            (!cpus.is_empty()).then(|| Unit {
                node: topo.node_of_set(&cpus),
                cpus,
                cores: members,
                efficient,
            })
        })
        .collect();
    units.sort_by_key(|u| (u.node.unwrap_or(usize::MAX), u.cpus.first()));
    units
}

pub(super) fn distance(topo: &Topology, a: Option<usize>, b: Option<usize>) -> u64 {
    match (a, b, &topo.numa_distances) {
        (Some(a), Some(b), _) if a == b => 0,
        (Some(a), Some(b), Some(d)) => d.get(a, b).unwrap_or(u64::MAX / 2),
        _ => u64::MAX / 2,
    }
}

/// CPU-only ranks: contiguous runs of the ordered units, sizes within one.
pub(super) fn contiguous_runs(units: usize, n: usize) -> Vec<Vec<usize>> {
    let (base, extra) = (units / n, units % n);
    let mut at = 0;
    (0..n)
        .map(|i| {
            let k = base + usize::from(i < extra);
            at += k;
            (at - k..at).collect()
        })
        .collect()
}

/// CPU-only ranks: contiguous runs; on a hybrid CPU, performance and efficiency
/// cores are shared out separately, so every rank gets the same mix and none
/// runs on efficiency cores alone (DDP waits for its slowest rank).
fn cpu_runs(
    units: &[Unit],
    n: usize,
    unit_name: &str,
    reasons: &mut [Vec<String>],
) -> Vec<Vec<usize>> {
    let (fast, slow): (Vec<usize>, Vec<usize>) =
        (0..units.len()).partition(|&u| !units[u].efficient);
    if slow.is_empty() {
        return contiguous_runs(units.len(), n);
    }
    if fast.len() < n {
        for r in reasons.iter_mut() {
            r.push(format!(
                "hybrid CPU: {n} ranks but {} performance {unit_name}(s): some ranks run on efficiency cores only",
                fast.len()
            ));
        }
        return contiguous_runs(units.len(), n);
    }
    let runs_fast = contiguous_runs(fast.len(), n);
    let runs_slow = contiguous_runs(slow.len(), n);
    (0..n)
        .map(|r| {
            let mut v: Vec<usize> = runs_fast[r].iter().map(|&i| fast[i]).collect();
            v.extend(runs_slow[r].iter().map(|&i| slow[i]));
            reasons[r].push(format!(
                "hybrid CPU: {} performance and {} efficiency {unit_name}(s), shared out separately so every rank gets the same mix",
                runs_fast[r].len(),
                runs_slow[r].len()
            ));
            v
        })
        .collect()
}

/// Ranks whose GPU's node is unknown or short of CPUs take `share` free units
/// nearest to that node by NUMA distance.
fn place_homeless(
    topo: &Topology,
    units: &[Unit],
    gpus: &[Option<&PciDevice>],
    share: usize,
    unit_name: &str,
    out: &mut [Vec<usize>],
    reasons: &mut [Vec<String>],
) -> Option<()> {
    let mut used = vec![false; units.len()];
    for &u in out.iter().flatten() {
        used[u] = true;
    }
    let homeless: Vec<usize> = (0..out.len()).filter(|r| out[*r].is_empty()).collect();
    for r in homeless {
        let want = gpus[r].and_then(|g| g.numa_node);
        let mut free: Vec<usize> = (0..units.len()).filter(|u| !used[*u]).collect();
        free.sort_by_key(|&u| (distance(topo, want, units[u].node), u));
        if free.len() < share {
            return None;
        }
        out[r] = free[..share].to_vec();
        out[r].sort_unstable();
        for &u in &out[r] {
            used[u] = true;
        }
        let got = nodes_of(topo, &union(units, &out[r]));
        reasons[r].push(match want {
            Some(node) => format!(
                "its GPU's NUMA node {node} has too few allowed CPUs: {share} {unit_name}s on the nearest node(s) {got:?}"
            ),
            None => format!("its GPU's NUMA node is unknown: {share} {unit_name}s on node(s) {got:?}"),
        });
    }
    Some(())
}

/// Give each rank its own units: GPU ranks on their GPU's node, an equal number
/// each (the smallest node share, so no rank waits on a poorer sibling); CPU
/// ranks contiguous runs of the ordered units, sizes within one of each other.
fn assign_exclusive(
    topo: &Topology,
    units: &[Unit],
    gpus: &[Option<&PciDevice>],
    unit_name: &'static str,
    reasons: &mut [Vec<String>],
) -> Option<Vec<Vec<usize>>> {
    let n = gpus.len();
    if units.len() < n {
        return None;
    }
    if gpus.iter().all(Option::is_none) {
        return Some(cpu_runs(units, n, unit_name, reasons));
    }
    let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, g) in gpus.iter().enumerate() {
        if let Some(node) = g.and_then(|g| g.numa_node) {
            by_node.entry(node).or_default().push(i);
        }
    }
    let on_node = |node: usize| -> Vec<usize> {
        (0..units.len())
            .filter(|&u| units[u].node == Some(node))
            .collect()
    };
    let share = by_node
        .iter()
        .map(|(node, ranks)| on_node(*node).len() / ranks.len())
        .filter(|s| *s > 0)
        .min()
        .unwrap_or(units.len())
        // Ranks whose node is short take their share elsewhere: all must fit.
        .min(units.len() / n)
        .max(1);
    let mut out: Vec<Vec<usize>> = vec![vec![]; n];
    for (node, ranks) in &by_node {
        let local = on_node(*node);
        if local.len() / ranks.len() == 0 {
            continue;
        }
        for (k, &r) in ranks.iter().enumerate() {
            out[r] = local[k * share..(k + 1) * share].to_vec();
            reasons[r].push(format!(
                "its GPU is on NUMA node {node}: {share} {unit_name}s of the {} allowed there, \
                 shared out among the node's {} GPU rank(s)",
                local.len(),
                ranks.len()
            ));
        }
    }
    place_homeless(topo, units, gpus, share, unit_name, &mut out, reasons)?;
    Some(out)
}

fn union(units: &[Unit], idx: &[usize]) -> CpuSet {
    idx.iter()
        .fold(CpuSet::new(), |a, &u| a.union(&units[u].cpus))
}

/// Ranks sharing whole nodes or packages: GPU ranks take their GPU's, CPU ranks
/// are spread over them in blocks.
fn assign_shared(topo: &Topology, groups: &[CpuSet], gpus: &[Option<&PciDevice>]) -> Vec<usize> {
    let n = gpus.len();
    (0..n)
        .map(|i| {
            let by_gpu = gpus[i].and_then(|g| {
                let node = topo.numa_nodes.iter().find(|x| Some(x.id) == g.numa_node)?;
                groups.iter().position(|s| s.intersects(&node.cpus))
            });
            by_gpu.unwrap_or(i * groups.len() / n)
        })
        .collect()
}

/// Slices from unit assignments; ranks given the same units share them.
fn slices(assign: Vec<Vec<usize>>, units: &[Unit], reasons: Vec<Vec<String>>) -> Vec<Slice> {
    let mut count: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    for a in &assign {
        *count.entry(a.clone()).or_default() += 1;
    }
    assign
        .iter()
        .zip(reasons)
        .map(|(idx, reasons)| {
            let core_sets: Vec<CpuSet> = idx.iter().flat_map(|&u| units[u].cores.clone()).collect();
            let efficiency = idx
                .iter()
                .filter(|&&u| units[u].efficient)
                .fold(CpuSet::new(), |a, &u| a.union(&units[u].cpus));
            Slice {
                cpus: union(units, idx),
                bind: true,
                cores: core_sets.len(),
                core_sets,
                sharers: count[idx],
                efficiency,
                extra: CpuSet::new(),
                extra_cores: 0,
                reasons,
            }
        })
        .collect()
}

/// Attach each rank's worker-only units.
fn with_extra(mut s: Vec<Slice>, extra: &[Vec<usize>], units: &[Unit]) -> Vec<Slice> {
    for (x, e) in s.iter_mut().zip(extra) {
        x.extra = union(units, e);
        x.extra_cores = e.iter().map(|&u| units[u].cores.len()).sum();
    }
    s
}

/// Units no rank got, said once for the whole plan.
fn idle_note(
    assign: &[Vec<usize>],
    extra: &[Vec<usize>],
    units: &[Unit],
    what: &str,
    plan_reasons: &mut Vec<String>,
) {
    let used: std::collections::BTreeSet<usize> =
        assign.iter().chain(extra).flatten().copied().collect();
    let idle: CpuSet = (0..units.len())
        .filter(|u| !used.contains(u))
        .fold(CpuSet::new(), |a, u| a.union(&units[u].cpus));
    if !idle.is_empty() {
        plan_reasons.push(format!(
            "{} allowed {what}(s) stay idle (CPUs {idle}): not on a GPU's node, or left over to keep ranks equal",
            units.len() - used.len()
        ));
    }
}

/// Unit indices per rank.
type Assign = Vec<Vec<usize>>;

/// Own units per rank (cores or L3 groups); with --oversubscribe, more ranks
/// than units share them round-robin, one unit each.
fn exclusive_units(
    topo: &Topology,
    req: &PlanRequest,
    units: &[Unit],
    gpus: &[Option<&PciDevice>],
    unit: &'static str,
    reasons: &mut [Vec<String>],
    plan_reasons: &mut Vec<String>,
) -> Result<(Assign, Assign), PlanError> {
    let n = gpus.len();
    let assign = match assign_exclusive(topo, units, gpus, unit, reasons) {
        Some(a) => a,
        None if req.oversubscribe => {
            plan_reasons.push(format!(
                "--oversubscribe: {n} ranks share {} {unit}s round-robin",
                units.len()
            ));
            (0..n).map(|i| vec![i % units.len()]).collect()
        }
        None => {
            return Err(PlanError::TooFewCpus {
                ranks: n,
                have: units.len(),
                unit: if unit == "core" {
                    "physical core"
                } else {
                    unit
                },
                cpus: units
                    .iter()
                    .fold(CpuSet::new(), |a, u| a.union(&u.cpus))
                    .to_string(),
            });
        }
    };
    // GPU ranks: what no rank computes on goes to the nearest GPU ranks'
    // DataLoader workers (not with policy single, which asks for one core).
    let extra = if req.policy == Policy::Exclusive && gpus.iter().any(Option::is_some) {
        leftovers::share_leftovers(topo, units, gpus, &assign, unit, reasons)
    } else {
        vec![vec![]; n]
    };
    idle_note(&assign, &extra, units, unit, plan_reasons);
    Ok((assign, extra))
}

/// The package (index) a NUMA node's CPUs are in.
pub(super) fn package_of(topo: &Topology, node: Option<usize>) -> Option<usize> {
    let n = topo.numa_nodes.iter().find(|x| Some(x.id) == node)?;
    topo.packages
        .iter()
        .position(|p| p.cpus.intersects(&n.cpus))
}

/// Whole NUMA nodes or packages, shared by the ranks on them.
fn shared_groups(
    topo: &Topology,
    req: &PlanRequest,
    cores: &[Unit],
    gpus: &[Option<&PciDevice>],
    reasons: &mut [Vec<String>],
) -> Vec<Vec<usize>> {
    let (groups, what): (Vec<CpuSet>, &str) = if req.policy == Policy::Node {
        (
            topo.cpu_nodes().map(|x| x.cpus.clone()).collect(),
            "NUMA node",
        )
    } else {
        (
            topo.packages.iter().map(|p| p.cpus.clone()).collect(),
            "package",
        )
    };
    let groups: Vec<CpuSet> = groups
        .into_iter()
        .map(|g| g.intersection(&topo.allowed_cpus))
        .filter(|g| !g.is_empty())
        .collect();
    let pick = assign_shared(topo, &groups, gpus);
    for (r, &g) in pick.iter().enumerate() {
        reasons[r].push(format!(
            "policy {}: the whole {what} {}",
            req.policy, groups[g]
        ));
    }
    pick.iter()
        .map(|&g| {
            (0..cores.len())
                .filter(|&u| cores[u].cpus.is_subset(&groups[g]))
                .collect()
        })
        .collect()
}

/// Place every rank by the request's policy.
pub(super) fn place(
    topo: &Topology,
    req: &PlanRequest,
    gpus: &[Option<&PciDevice>],
    plan_reasons: &mut Vec<String>,
) -> Result<Vec<Slice>, PlanError> {
    let n = gpus.len();
    let cores = core_units(topo);
    let mut reasons: Vec<Vec<String>> = vec![vec![]; n];
    match req.policy {
        Policy::None => {
            plan_reasons
                .push("policy none: ranks are not bound; each may run on every allowed CPU".into());
            let all = vec![(0..cores.len()).collect::<Vec<_>>(); n];
            let mut s = slices(all, &cores, reasons);
            for x in &mut s {
                x.bind = false;
            }
            Ok(s)
        }
        Policy::Node | Policy::Socket => {
            let assign = shared_groups(topo, req, &cores, gpus, &mut reasons);
            Ok(slices(assign, &cores, reasons))
        }
        Policy::L3 => {
            let l3 = l3_units(topo, &cores);
            if l3.is_empty() {
                plan_reasons
                    .push("policy l3: this machine shows no L3 groups; placed as exclusive".into());
                let exclusive = PlanRequest {
                    policy: Policy::Exclusive,
                    ..req.clone()
                };
                return place(topo, &exclusive, gpus, plan_reasons);
            }
            let (assign, extra) =
                exclusive_units(topo, req, &l3, gpus, "L3 group", &mut reasons, plan_reasons)?;
            Ok(with_extra(slices(assign, &l3, reasons), &extra, &l3))
        }
        Policy::Exclusive | Policy::Single => {
            let (mut assign, extra) =
                exclusive_units(topo, req, &cores, gpus, "core", &mut reasons, plan_reasons)?;
            if req.policy == Policy::Single {
                for a in &mut assign {
                    a.truncate(1);
                }
                plan_reasons.push("policy single: one physical core per rank".into());
            }
            Ok(with_extra(slices(assign, &cores, reasons), &extra, &cores))
        }
    }
}
