//! GPU plans use the whole machine: the cores no GPU rank computes on (GPU-less
//! NUMA nodes, what is left over on a GPU's node) go to the nearest GPU ranks'
//! DataLoader workers, each node's shared out evenly in contiguous runs.

use std::collections::BTreeMap;

use super::{Unit, contiguous_runs, distance, package_of};
use crate::topology::{PciDevice, Topology};

/// Units no GPU rank computes on (GPU-less NUMA nodes, what is left over on
/// GPU nodes), each node's shared out evenly, in contiguous runs, among the GPU
/// ranks nearest to it: same package first, then NUMA distance.
pub(super) fn share_leftovers(
    topo: &Topology,
    units: &[Unit],
    gpus: &[Option<&PciDevice>],
    assign: &[Vec<usize>],
    unit_name: &str,
    reasons: &mut [Vec<String>],
) -> Vec<Vec<usize>> {
    let n = gpus.len();
    let mut used = vec![false; units.len()];
    for &u in assign.iter().flatten() {
        used[u] = true;
    }
    let mut free: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for u in (0..units.len()).filter(|u| !used[*u]) {
        free.entry(units[u].node).or_default().push(u);
    }
    // A rank's home: its GPU's node, else the node of its first unit.
    let home: Vec<Option<usize>> = (0..n)
        .map(|r| {
            gpus[r]
                .and_then(|g| g.numa_node)
                .or_else(|| assign[r].first().and_then(|&u| units[u].node))
        })
        .collect();
    let gpu_ranks: Vec<usize> = (0..n).filter(|&r| gpus[r].is_some()).collect();
    let mut extra: Vec<Vec<usize>> = vec![vec![]; n];
    let mut got: Vec<BTreeMap<Option<usize>, (usize, u64)>> = vec![BTreeMap::new(); n];
    for (node, list) in free {
        let key = |r: usize| {
            let other_package = package_of(topo, home[r]) != package_of(topo, node);
            (other_package, distance(topo, home[r], node))
        };
        let Some(best) = gpu_ranks.iter().map(|&r| key(r)).min() else {
            continue;
        };
        let mut nearest: Vec<usize> = gpu_ranks
            .iter()
            .copied()
            .filter(|&r| key(r) == best)
            .collect();
        // Ranks with fewer extra units so far take the larger runs.
        nearest.sort_by_key(|&r| (extra[r].len(), r));
        let runs = contiguous_runs(list.len(), nearest.len());
        let mut order: Vec<(usize, Vec<usize>)> = nearest.into_iter().zip(runs).collect();
        order.sort_by_key(|(r, _)| *r);
        for (r, run) in order {
            if run.is_empty() {
                continue;
            }
            extra[r].extend(run.iter().map(|&i| list[i]));
            got[r].insert(node, (run.len(), best.1));
        }
    }
    for r in 0..n {
        if got[r].is_empty() {
            continue;
        }
        let parts: Vec<String> = got[r]
            .iter()
            .map(|(node, (k, d))| match node {
                Some(id) if *d == 0 => format!("{k} left over on its own node {id}"),
                Some(id) => format!("{k} on node {id} (distance {d})"),
                None => format!("{k} on no known node"),
            })
            .collect();
        let total: usize = got[r].values().map(|(k, _)| k).sum();
        reasons[r].push(format!(
            "{total} more {unit_name}(s) no GPU rank computes on, for its DataLoader workers only: {} \
             (shared evenly among the nearest GPU ranks, same package first)",
            parts.join(", ")
        ));
        extra[r].sort_unstable();
    }
    extra
}
