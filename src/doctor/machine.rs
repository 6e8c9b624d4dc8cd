//! Checks of the machine itself: NUMA layout and kernel memory settings, and
//! the CPUs (SMT, frequency governor, hybrid cores, isolated CPUs). These
//! read sysfs/procfs through `Sys`, so `--root DIR` checks a dump.

use std::collections::BTreeMap;

use super::sys::Sys;
use super::{Area, Finding, Severity};
use crate::cpuset::CpuSet;
use crate::topology::{CoreKind, Topology};

fn num(sys: &dyn Sys, path: &str) -> Option<i64> {
    sys.read(path)?.trim().parse().ok()
}

/// The bracketed choice of a sysfs selector ("always [madvise] never").
fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

pub(super) fn memory(sys: &dyn Sys, topo: &Topology, out: &mut Vec<Finding>) {
    let with_cpus = numa_layout(topo, out);
    gpu_locality(topo, with_cpus, out);
    memoryless(topo, out);
    kernel_memory(sys, with_cpus, out);
    swap(sys, out);
}

/// The NUMA nodes; returns how many have CPUs.
fn numa_layout(topo: &Topology, out: &mut Vec<Finding>) -> usize {
    let with_cpus = topo
        .numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .count();
    let nodes = topo.numa_nodes.len();
    out.push(
        Finding::new(
            "memory.numa",
            Area::Memory,
            Severity::Info,
            format!("{nodes} NUMA node(s), {with_cpus} with CPUs"),
        )
        .evidence(
            topo.numa_nodes
                .iter()
                .map(|n| {
                    let cpus = match n.cpus.is_empty() {
                        true => "memory only,".to_string(),
                        false => format!("cpus {}", n.cpus),
                    };
                    format!("node {}: {cpus} {} MiB", n.id, n.memory_bytes >> 20)
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
    );
    with_cpus
}

/// GPUs whose NUMA node is unknown, and GPUs spread unevenly over nodes.
fn gpu_locality(topo: &Topology, with_cpus: usize, out: &mut Vec<Finding>) {
    let unknown: Vec<&str> = topo
        .gpus
        .iter()
        .filter(|g| g.numa_node.is_none())
        .map(|g| g.bus_id.as_str())
        .collect();
    if !unknown.is_empty() && with_cpus > 1 {
        out.push(
            Finding::new(
                "memory.gpu-numa-unknown",
                Area::Memory,
                Severity::Warn,
                "the firmware does not say which NUMA node some GPUs are on (numa_node -1): \
                 their ranks cannot be placed by locality",
            )
            .evidence(unknown.join(", "))
            .fix("update the BIOS, or enable its 'NUMA node per socket'/ACPI SRAT options"),
        );
    }
    let mut per_node: BTreeMap<usize, usize> = BTreeMap::new();
    for g in &topo.gpus {
        if let Some(n) = g.numa_node {
            *per_node.entry(n).or_default() += 1;
        }
    }
    if per_node.len() > 1 && per_node.values().min() != per_node.values().max() {
        out.push(
            Finding::new(
                "memory.gpu-spread",
                Area::Memory,
                Severity::Info,
                "GPUs are spread unevenly over NUMA nodes: ranks on the fuller nodes share fewer cores",
            )
            .evidence(format!("GPUs per node: {per_node:?}")),
        );
    }
}

/// NUMA nodes with CPUs but no memory.
fn memoryless(topo: &Topology, out: &mut Vec<Finding>) {
    let memless: Vec<String> = topo
        .numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty() && n.memory_bytes == 0)
        .map(|n| n.id.to_string())
        .collect();
    if !memless.is_empty() {
        out.push(
            Finding::new(
                "memory.memoryless-node",
                Area::Memory,
                Severity::Warn,
                "NUMA nodes with CPUs but no memory: ranks there always allocate remotely",
            )
            .evidence(format!("nodes {}", memless.join(","))),
        );
    }
}

/// The kernel's NUMA balancing, zone reclaim, huge pages and swappiness.
fn kernel_memory(sys: &dyn Sys, with_cpus: usize, out: &mut Vec<Finding>) {
    if with_cpus > 1 && num(sys, "/proc/sys/kernel/numa_balancing").is_some_and(|v| v != 0) {
        out.push(
            Finding::new(
                "memory.numa-balancing",
                Area::Memory,
                Severity::Warn,
                "automatic NUMA balancing is on: it unmaps and migrates the pages of ranks that are \
                 already bound, costing page faults",
            )
            .evidence("/proc/sys/kernel/numa_balancing = 1")
            .sysctl("kernel.numa_balancing", "0"),
        );
    }
    if let Some(z) = num(sys, "/proc/sys/vm/zone_reclaim_mode")
        && z != 0
    {
        out.push(
            Finding::new(
                "memory.zone-reclaim",
                Area::Memory,
                Severity::Warn,
                "zone reclaim is on: a node that fills up reclaims page cache instead of using another node",
            )
            .evidence(format!("/proc/sys/vm/zone_reclaim_mode = {z}"))
            .sysctl("vm.zone_reclaim_mode", "0"),
        );
    }
    if let Some(t) = sys.read("/sys/kernel/mm/transparent_hugepage/enabled")
        && let Some(sel) = selected(&t)
    {
        let (sev, title) = match sel {
            "never" => (
                Severity::Info,
                "transparent huge pages are off: large tensors use 4 KiB pages (more TLB misses)",
            ),
            _ => (Severity::Ok, "transparent huge pages are available"),
        };
        let mut f = Finding::new("memory.thp", Area::Memory, sev, title)
            .evidence(format!("transparent_hugepage/enabled: {}", t.trim()));
        if sel == "never" {
            f = f.fix("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled");
        }
        out.push(f);
    }
    if let Some(s) = num(sys, "/proc/sys/vm/swappiness")
        && s > 10
    {
        out.push(
            Finding::new(
                "memory.swappiness",
                Area::Memory,
                Severity::Info,
                format!("vm.swappiness is {s}: the guides set 10 so training memory is not swapped early"),
            )
            .evidence(format!("/proc/sys/vm/swappiness = {s}"))
            .sysctl("vm.swappiness", "10"),
        );
    }
}

/// Swap in use.
fn swap(sys: &dyn Sys, out: &mut Vec<Finding>) {
    if let Some(m) = sys.read("/proc/meminfo") {
        let kib = |k: &str| -> Option<u64> {
            let l = m.lines().find(|l| l.starts_with(k))?;
            l[k.len()..].split_whitespace().next()?.parse().ok()
        };
        if let (Some(total), Some(free)) = (kib("SwapTotal:"), kib("SwapFree:"))
            && total > free
        {
            out.push(
                Finding::new(
                    "memory.swap-used",
                    Area::Memory,
                    Severity::Warn,
                    format!(
                        "{} MiB of swap are in use: a swapped-out rank stalls every other",
                        (total - free) / 1024
                    ),
                )
                .evidence(format!("SwapTotal {total} kB, SwapFree {free} kB")),
            );
        }
    }
}

pub(super) fn cpu(sys: &dyn Sys, topo: &Topology, out: &mut Vec<Finding>) {
    let smt = topo.cores.iter().map(|c| c.cpus.len()).max().unwrap_or(1);
    out.push(
        Finding::new(
            "cpu.smt",
            Area::Cpu,
            Severity::Info,
            if smt > 1 {
                format!(
                    "SMT is on ({smt} threads per core): the plan counts cores and keeps siblings with \
                     their core (--smt computes on siblings too)"
                )
            } else {
                "SMT is off or absent: one thread per core".to_string()
            },
        )
        .evidence(format!(
            "{} cores, {} CPUs",
            topo.cores.len(),
            topo.online_cpus.len()
        )),
    );
    if let Some(g) = sys.read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") {
        let g = g.trim().to_string();
        if g != "performance" {
            out.push(
                Finding::new(
                    "cpu.governor",
                    Area::Cpu,
                    Severity::Info,
                    format!("the frequency governor is {g}, not performance: cores ramp up late after waits"),
                )
                .evidence(format!("cpu0/cpufreq/scaling_governor = {g}"))
                .fix("cpupower frequency-set -g performance"),
            );
        }
    }
    hybrid_and_isolated(sys, topo, out);
}

/// Hybrid (performance and efficiency) cores, isolated and nohz_full CPUs.
fn hybrid_and_isolated(sys: &dyn Sys, topo: &Topology, out: &mut Vec<Finding>) {
    let e = topo
        .cores
        .iter()
        .filter(|c| c.kind == Some(CoreKind::Efficiency))
        .count();
    if e > 0 {
        out.push(Finding::new(
            "cpu.hybrid",
            Area::Cpu,
            Severity::Info,
            format!(
                "hybrid CPU: {} performance and {e} efficiency cores; the plan computes on performance \
                 cores and gives efficiency cores to DataLoader workers",
                topo.cores.len() - e
            ),
        ));
    }
    let list = |p: &str| {
        sys.read(p)
            .and_then(|s| CpuSet::parse_list(s.trim()).ok())
            .filter(|s| !s.is_empty())
    };
    if let Some(iso) = list("/sys/devices/system/cpu/isolated") {
        let hit = iso.intersection(&topo.allowed_cpus);
        out.push(
            Finding::new(
                "cpu.isolated",
                Area::Cpu,
                if hit.is_empty() { Severity::Info } else { Severity::Warn },
                "some CPUs are isolated (isolcpus): the scheduler does not balance threads onto or off them",
            )
            .evidence(format!("isolated {iso}; of them allowed here: {}", if hit.is_empty() { "none".into() } else { hit.to_string() }))
            .fix("leave the isolated CPUs out of the job: docker --cpuset-cpus, taskset, Slurm's cpuset"),
        );
    }
    if let Some(nohz) = list("/sys/devices/system/cpu/nohz_full") {
        out.push(
            Finding::new(
                "cpu.nohz-full",
                Area::Cpu,
                Severity::Info,
                "nohz_full CPUs: good for one pinned thread each, bad for several",
            )
            .evidence(format!("nohz_full {nohz}")),
        );
    }
}
