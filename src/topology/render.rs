//! The human view of a topology: a compact tree by NUMA node (the unit placement
//! cares about), its L3 groups and cores, the GPUs and NICs local to it, then
//! the distance matrix and what this process may use.

use std::fmt::Write;

use super::{PciDevice, Topology};
use crate::cpuset::CpuSet;

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn cores_line(t: &Topology, within: &CpuSet) -> Vec<String> {
    t.cores
        .iter()
        .filter(|c| c.cpus.is_subset(within))
        .map(|c| {
            let mark = if c.cpus.intersects(&t.allowed_cpus) {
                ""
            } else {
                "!"
            };
            let kind = match c.kind {
                Some(super::CoreKind::Efficiency) => "e",
                _ => "",
            };
            format!("{mark}[{}]{kind}", c.cpus)
        })
        .collect()
}

fn wrap(out: &mut String, indent: &str, items: &[String]) {
    let mut line = String::new();
    for item in items {
        if !line.is_empty() && line.len() + item.len() + 1 > 88 {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(item);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent}{line}");
    }
}

fn device_line(kind: &str, d: &PciDevice, t: &Topology) -> String {
    let node = d
        .numa_node
        .map_or("node ?".to_string(), |n| format!("node {n}"));
    let mut line = format!(
        "{kind} {} {} vendor {} ({node}, local cpus {})",
        d.index,
        d.bus_id,
        d.vendor,
        if d.local_cpus.is_empty() {
            "?".to_string()
        } else {
            d.local_cpus.to_string()
        }
    );
    if kind == "gpu" && t.gpu_access.is_some() {
        // The job's own numbering, beside the machine's.
        if let Some(k) = t.gpus.iter().position(|g| g == d) {
            line += &format!(" job cuda:{k}");
        }
        if let Some(v) = &d.visible_as {
            line += &format!(" visible as {v}");
        }
    }
    if let Some(m) = d.minor {
        line += &format!(" /dev/nvidia{m}");
    }
    if let Some(u) = d.mig.as_ref().or(d.uuid.as_ref()) {
        line += &format!(" {u}");
    }
    line
}

/// Which GPUs this job has, and the evidence.
fn render_gpu_access(out: &mut String, t: &Topology) {
    let Some(a) = &t.gpu_access else { return };
    let _ = writeln!(
        out,
        "gpus: {} of {} on the PCI bus usable by this job",
        a.usable, a.on_bus
    );
    for e in &a.evidence {
        let _ = writeln!(out, "  {e}");
    }
    for h in &a.hidden {
        let node = h.numa_node.map_or("node ?".into(), |n| format!("node {n}"));
        let _ = writeln!(out, "  hidden {} ({node}): {}", h.bus_id, h.why);
    }
}

/// One NUMA node: its L3 groups with their cores, other cores, local devices.
fn render_node(out: &mut String, t: &Topology, node: &super::NumaNode) {
    let pk: Vec<String> = t
        .packages
        .iter()
        .filter(|p| p.cpus.intersects(&node.cpus))
        .map(|p| p.id.to_string())
        .collect();
    if node.cpus.is_empty() {
        let _ = writeln!(
            out,
            "numa node {}: memory only, {}",
            node.id,
            gib(node.memory_bytes)
        );
    } else {
        let _ = writeln!(
            out,
            "numa node {}: cpus {}, {}, package {}",
            node.id,
            node.cpus,
            gib(node.memory_bytes),
            pk.join(",")
        );
    }
    let mut covered = CpuSet::new();
    for g in t.l3_groups.iter().filter(|g| g.cpus.is_subset(&node.cpus)) {
        let _ = writeln!(out, "  L3 {}", g.cpus);
        wrap(out, "    ", &cores_line(t, &g.cpus));
        covered = covered.union(&g.cpus);
    }
    let rest = node.cpus.difference(&covered);
    if !rest.is_empty() {
        wrap(out, "  ", &cores_line(t, &rest));
    }
    for (kind, list) in [("gpu", &t.gpus), ("nic", &t.nics)] {
        for d in list.iter().filter(|d| d.numa_node == Some(node.id)) {
            let _ = writeln!(out, "  {}", device_line(kind, d, t));
        }
    }
}

/// The allowed set and where its limits come from, then the reader's notes.
fn render_limits(out: &mut String, t: &Topology) {
    let mut why = vec![];
    if let Some(a) = &t.limits.affinity {
        why.push(format!("affinity {a}"));
    }
    if let Some(c) = &t.limits.cgroup_cpuset {
        why.push(format!(
            "cgroup {} cpuset {c}",
            t.limits.cgroup_version.map_or("", |v| v.name())
        ));
    }
    if let Some(q) = t.limits.cpu_quota {
        why.push(format!("cpu quota {q:.2} CPUs"));
    }
    let from = if why.is_empty() {
        String::new()
    } else {
        format!(" from {}", why.join(", "))
    };
    let _ = writeln!(
        out,
        "allowed: {} ({} CPUs; budget {:.2} CPUs){from}",
        t.allowed_cpus,
        t.allowed_cpus.len(),
        t.cpu_budget
    );
    if t.cores.iter().any(|c| !c.cpus.intersects(&t.allowed_cpus)) {
        let _ = writeln!(
            out,
            "  ![..] marks cores this process may not use; ]e an efficiency core"
        );
    }
    for n in &t.notes {
        let _ = writeln!(out, "note: {n}");
    }
}

/// Render the tree.
pub(crate) fn render(t: &Topology) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "machine: {} CPUs online in {} packages, {} cores, {} NUMA nodes ({})",
        t.online_cpus.len(),
        t.packages.len(),
        t.cores.len(),
        t.numa_nodes.len(),
        t.source
    );
    for node in &t.numa_nodes {
        render_node(&mut out, t, node);
    }
    for (kind, list) in [("gpu", &t.gpus), ("nic", &t.nics)] {
        for d in list.iter().filter(|d| d.numa_node.is_none()) {
            let _ = writeln!(out, "{}", device_line(kind, d, t));
        }
    }
    if let Some(d) = &t.numa_distances {
        let _ = writeln!(out, "numa distances:");
        let head: Vec<String> = d.ids.iter().map(|i| format!("{i:>4}")).collect();
        let _ = writeln!(out, "      {}", head.join(""));
        for (id, row) in d.ids.iter().zip(&d.matrix) {
            let cells: Vec<String> = row.iter().map(|v| format!("{v:>4}")).collect();
            let _ = writeln!(out, "  {id:>4}{}", cells.join(""));
        }
    }
    render_gpu_access(&mut out, t);
    render_limits(&mut out, t);
    out
}
