//! Synthetic machines from a one-line description, for planning ahead and for
//! tests. Grammar (whitespace-separated `key:value`, any order):
//!
//! - levels, each a count *per parent*, nested in this order:
//!   `package:N numa:N l3:N core:N pu:N` (any may be left out; default 1)
//! - `gpu:N` GPUs in all, spread in blocks over the NUMA nodes in order, or placed
//!   with `gpu-nodes:3,3,1,1,7,7,5,5` (the node of each GPU, in PCI order)
//! - `nic:N` high-speed NICs, spread like GPUs
//! - `mem:SIZE` memory per NUMA node (`64G`, `512M`, bytes; default 64G)
//! - `numbering:linux` (default: SMT siblings are N apart, like x86 Linux) or
//!   `numbering:compact` (siblings adjacent, like POWER or hwloc's logical order)
//! - `allowed:CPULIST` a cpuset restriction; `quota:F` a CPU quota in CPUs
//!
//! Example: `package:2 numa:4 l3:2 core:8 pu:2 gpu:8 gpu-nodes:3,3,1,1,7,7,5,5`.

use super::{Core, Distances, Group, NumaNode, PciDevice, Topology, TopologyError};
use crate::cpuset::{CpuSet, MAX_CPU};

#[derive(Default)]
struct Spec {
    package: usize,
    numa: usize,
    l3: usize,
    core: usize,
    pu: usize,
    gpus: usize,
    gpu_nodes: Option<Vec<usize>>,
    nics: usize,
    mem: u64,
    compact: bool,
    allowed: Option<CpuSet>,
    quota: Option<f64>,
}

fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        (i, 'T' | 't') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn parse_spec(text: &str) -> Result<Spec, TopologyError> {
    let err = |why: String| TopologyError::Synthetic {
        text: text.to_string(),
        why,
    };
    let mut s = Spec {
        package: 1,
        numa: 1,
        l3: 1,
        core: 1,
        pu: 1,
        mem: 64 << 30,
        ..Default::default()
    };
    for tok in text.split_whitespace() {
        let (key, val) = tok
            .split_once(':')
            .ok_or_else(|| err(format!("{tok:?} is not key:value")))?;
        set_key(&mut s, key, val).map_err(err)?;
    }
    check_spec(&mut s).map_err(err)?;
    Ok(s)
}

/// One `key:value` of the description into the spec.
fn set_key(s: &mut Spec, key: &str, val: &str) -> Result<(), String> {
    let count = || -> Result<usize, String> {
        match val.parse::<usize>() {
            Ok(n) if (1..=MAX_CPU).contains(&n) => Ok(n),
            _ => Err(format!("{key}:{val}: expected a count from 1 to {MAX_CPU}")),
        }
    };
    match key {
        "package" | "socket" => s.package = count()?,
        "numa" | "node" => s.numa = count()?,
        "l3" => s.l3 = count()?,
        "core" => s.core = count()?,
        "pu" | "thread" => s.pu = count()?,
        "gpu" => s.gpus = count()?,
        "nic" => s.nics = count()?,
        "gpu-nodes" => {
            let nodes: Result<Vec<usize>, _> = val.split(',').map(str::parse).collect();
            s.gpu_nodes =
                Some(nodes.map_err(|_| format!("gpu-nodes:{val}: not a list of node ids"))?);
        }
        "mem" => {
            s.mem = parse_size(val).ok_or_else(|| format!("mem:{val}: not a size like 64G"))?
        }
        "numbering" => {
            s.compact = match val {
                "compact" => true,
                "linux" => false,
                _ => return Err(format!("numbering:{val}: expected linux or compact")),
            }
        }
        "allowed" => s.allowed = Some(CpuSet::parse_list(val).map_err(|e| e.to_string())?),
        "quota" => {
            s.quota = Some(
                val.parse::<f64>()
                    .ok()
                    .filter(|q| *q > 0.0 && q.is_finite())
                    .ok_or_else(|| format!("quota:{val}: expected a positive number"))?,
            )
        }
        _ => {
            return Err(format!(
                "unknown key {key:?}; keys: package numa l3 core pu gpu gpu-nodes nic mem numbering allowed quota"
            ));
        }
    }
    Ok(())
}

/// What the keys allow together: the CPU, node and device counts, the GPUs' nodes.
fn check_spec(s: &mut Spec) -> Result<(), String> {
    let total = [s.package, s.numa, s.l3, s.core, s.pu]
        .iter()
        .try_fold(1usize, |a, b| a.checked_mul(*b))
        .filter(|n| *n <= MAX_CPU)
        .ok_or_else(|| format!("more than {MAX_CPU} CPUs"))?;
    let _ = total;
    let nodes = s.package * s.numa;
    if nodes > super::MAX_NODES {
        return Err(format!("{nodes} NUMA nodes: at most {}", super::MAX_NODES));
    }
    if s.gpus > super::MAX_DEVICES || s.nics > super::MAX_DEVICES {
        return Err(format!(
            "at most {} GPUs and {} NICs",
            super::MAX_DEVICES,
            super::MAX_DEVICES
        ));
    }
    if let Some(g) = &s.gpu_nodes {
        if s.gpus == 0 {
            s.gpus = g.len();
        }
        if g.len() != s.gpus {
            return Err(format!(
                "gpu-nodes lists {} nodes for {} GPUs",
                g.len(),
                s.gpus
            ));
        }
        if let Some(bad) = g.iter().find(|n| **n >= nodes) {
            return Err(format!(
                "gpu-nodes names node {bad}; nodes are 0-{}",
                nodes - 1
            ));
        }
    }
    if s.gpus > 256 || s.nics > 256 {
        return Err("at most 256 GPUs and 256 NICs".into());
    }
    Ok(())
}

/// Build the topology a description names.
pub fn parse(text: &str) -> Result<Topology, TopologyError> {
    let s = parse_spec(text)?;
    let mut t = Topology::empty(format!("synthetic:{text}"));
    cpus_and_nodes(&s, &mut t);
    devices_and_limits(&s, &mut t);
    t.finish();
    Ok(t)
}

/// Cores, L3 groups, NUMA nodes, packages and their distances.
fn cpus_and_nodes(s: &Spec, t: &mut Topology) {
    let nodes = s.package * s.numa;
    let cores_per_node = s.l3 * s.core;
    let total_cores = nodes * cores_per_node;
    let cpu = |core: usize, pu: usize| {
        if s.compact {
            core * s.pu + pu
        } else {
            pu * total_cores + core
        }
    };
    for node in 0..nodes {
        let mut node_cpus = CpuSet::new();
        for l3 in 0..s.l3 {
            let mut l3_cpus = CpuSet::new();
            for c in 0..s.core {
                let core = node * cores_per_node + l3 * s.core + c;
                let cpus: CpuSet = (0..s.pu).map(|p| cpu(core, p)).collect();
                l3_cpus = l3_cpus.union(&cpus);
                t.cores.push(Core {
                    id: core,
                    package: node / s.numa,
                    cpus,
                    kind: None,
                    capacity: None,
                });
            }
            node_cpus = node_cpus.union(&l3_cpus);
            t.l3_groups.push(Group {
                id: t.l3_groups.len(),
                cpus: l3_cpus,
            });
        }
        t.numa_nodes.push(NumaNode {
            id: node,
            cpus: node_cpus,
            memory_bytes: s.mem,
        });
    }
    for p in 0..s.package {
        let cpus = t.numa_nodes[p * s.numa..(p + 1) * s.numa]
            .iter()
            .fold(CpuSet::new(), |a, n| a.union(&n.cpus));
        t.packages.push(Group { id: p, cpus });
    }
    t.online_cpus = t
        .packages
        .iter()
        .fold(CpuSet::new(), |a, p| a.union(&p.cpus));
    if nodes > 1 {
        let d = |a: usize, b: usize| match (a == b, a / s.numa == b / s.numa) {
            (true, _) => 10,
            (false, true) => 12,
            (false, false) => 32,
        };
        t.numa_distances = Some(Distances {
            ids: (0..nodes).collect(),
            matrix: (0..nodes)
                .map(|a| (0..nodes).map(|b| d(a, b)).collect())
                .collect(),
        });
    }
}

/// GPUs and NICs spread over the nodes (or on the nodes named), the cgroup limits.
fn devices_and_limits(s: &Spec, t: &mut Topology) {
    let nodes = s.package * s.numa;
    let place = |i: usize, n: usize, explicit: Option<&Vec<usize>>| {
        explicit.map_or(i * nodes / n.max(1), |v| v[i])
    };
    for i in 0..s.gpus {
        let node = place(i, s.gpus, s.gpu_nodes.as_ref());
        t.gpus.push(device(t, i + 1, node, "0x10de", "0x030200"));
    }
    for i in 0..s.nics {
        let node = place(i, s.nics, None);
        t.nics.push(device(t, 0x81 + i, node, "0x15b3", "0x020700"));
    }
    t.limits.cgroup_cpuset = s.allowed.clone();
    t.limits.cpu_quota = s.quota;
    if s.allowed.is_some() || s.quota.is_some() {
        t.limits.cgroup_version = Some(super::CgroupVersion::Synthetic);
    }
}

fn device(t: &Topology, bus: usize, node: usize, vendor: &str, class: &str) -> PciDevice {
    PciDevice {
        index: 0,
        bus_id: format!("0000:{bus:02x}:00.0"),
        vendor: vendor.into(),
        device: "0x0000".into(),
        class: class.into(),
        numa_node: Some(node),
        local_cpus: t.numa_nodes[node].cpus.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn builds_the_example() {
        let t = parse("package:2 numa:2 l3:2 core:8 pu:2 gpu:4").unwrap();
        assert_eq!(t.online_cpus.len(), 128);
        assert_eq!(t.cores.len(), 64);
        assert_eq!(t.numa_nodes.len(), 4);
        assert_eq!(t.l3_groups.len(), 8);
        assert_eq!(t.packages.len(), 2);
        assert_eq!(t.gpus.len(), 4);
        assert_eq!(t.gpus[3].numa_node, Some(3));
        // Linux numbering: core 0 holds CPUs 0 and 64.
        assert_eq!(t.cores[0].cpus.to_string(), "0,64");
        assert_eq!(t.numa_nodes[0].cpus.to_string(), "0-15,64-79");
        let d = t.numa_distances.unwrap();
        assert_eq!(d.get(0, 1), Some(12));
        assert_eq!(d.get(0, 2), Some(32));
    }

    #[test]
    fn compact_numbering_limits_and_gpu_nodes() {
        let t = parse("core:4 pu:2 numbering:compact allowed:0-3 quota:1.5").unwrap();
        assert_eq!(t.cores[1].cpus.to_string(), "2-3");
        assert_eq!(t.allowed_cpus.to_string(), "0-3");
        assert_eq!(t.cpu_budget, 1.5);
        let t = parse("package:2 numa:4 core:4 gpu-nodes:3,3,1,1,7,7,5,5").unwrap();
        assert_eq!(t.gpus.len(), 8);
        assert_eq!(t.gpus[0].numa_node, Some(3));
    }

    #[test]
    fn clear_errors() {
        for bad in [
            "core",
            "core:0",
            "core:x",
            "bogus:1",
            "gpu:2 gpu-nodes:0",
            "numa:2 gpu-nodes:5",
            "package:65536 core:65536",
            "mem:lots",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("invalid synthetic topology"), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in "[a-z0-9:,. -]{0,40}") {
            let _ = parse(&s);
        }

        /// Any counts, however large: an error, or a machine within the
        /// bounds (never an n² matrix of 65536 nodes).
        #[test]
        fn any_counts_stay_within_the_bounds(
            c in proptest::collection::vec(prop_oneof![1usize..8, 1usize..100_000, Just(usize::MAX)], 6),
        ) {
            let desc = format!(
                "package:{} numa:{} l3:{} core:{} pu:{} gpu:{}",
                c[0], c[1], c[2], c[3], c[4], c[5]
            );
            if let Ok(t) = parse(&desc) {
                prop_assert!(t.online_cpus.len() <= MAX_CPU);
                prop_assert!(t.numa_nodes.len() <= crate::topology::MAX_NODES);
                prop_assert!(t.gpus.len() <= crate::topology::MAX_DEVICES);
            }
        }
    }
}
