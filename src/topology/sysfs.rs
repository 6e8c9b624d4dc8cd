//! Reads a Linux machine from `/sys` and `/proc` below a root directory: the live
//! machine (root "/") or a dump made by `hwloc-gather-topology`. Dumps are hostile
//! input: NUL-terminated files, dangling links, link cycles, offline CPUs that
//! never existed, ids of -1, missing files. Every read is allowed to fail; we
//! never walk links recursively.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{
    Core, CoreKind, Distances, Group, NumaNode, PciDevice, Topology, TopologyError, cgroup, fsread,
};
use crate::cpuset::CpuSet;

const CPU_DIR: &str = "sys/devices/system/cpu";
const NODE_DIR: &str = "sys/devices/system/node";
const PCI_DIR: &str = "sys/bus/pci/devices";
/// Odd files said in the notes, at most (a dump of FIFOs says so in a few).
const MAX_ODD: usize = 8;

struct Root<'a>(&'a Path, std::cell::RefCell<Vec<String>>);

impl<'a> Root<'a> {
    fn new(root: &'a Path) -> Root<'a> {
        Root(root, Default::default())
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    /// A file that is there but could not be taken (a FIFO, a device, a
    /// directory, too large, not text, a list out of range): said once in
    /// the topology's notes, read as absent.
    fn odd<T>(&self, rel: &str, why: impl std::fmt::Display) -> Option<T> {
        let mut n = self.1.borrow_mut();
        if n.len() < MAX_ODD {
            let at = self.0.display();
            n.push(format!("{rel} in {at}: {why}; read as absent"));
        }
        None
    }
    fn read(&self, rel: &str) -> Option<String> {
        let path = fsread::under(self.0, rel)?;
        let text = match fsread::read_kernel_file(&path, fsread::MAX_SYSFS_FILE) {
            Ok(t) => t,
            Err(fsread::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return None;
            }
            // EAGAIN: a FIFO with no writer.
            Err(fsread::ReadError::Io(e)) if e.raw_os_error() == Some(libc::EAGAIN) => {
                return self.odd(rel, "not a regular file (a FIFO?)");
            }
            Err(e) => return self.odd(rel, e),
        };
        // A kernel file ends in a newline: nothing at all is a FIFO with
        // no writer, a socket or a device (an fstat only then).
        if text.is_empty() && std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
            return self.odd(rel, "not a regular file (a FIFO, socket or device)");
        }
        Some(
            text.trim_matches(|c: char| c == '\0' || c.is_whitespace())
                .to_string(),
        )
    }
    fn list(&self, rel: &str) -> Option<CpuSet> {
        let text = self.read(rel)?;
        CpuSet::parse_list(&text)
            .map_or_else(|e| self.odd(rel, format!("not a CPU list ({e})")), Some)
    }
    fn mask(&self, rel: &str) -> Option<CpuSet> {
        let text = self.read(rel)?;
        CpuSet::parse_mask(&text)
            .map_or_else(|e| self.odd(rel, format!("not a CPU mask ({e})")), Some)
    }
    /// A cpulist file, or its mask twin (`foo_list` / `foo`, `cpulist` / `cpumap`).
    fn list_or_mask(&self, list: &str, mask: &str) -> Option<CpuSet> {
        self.list(list).or_else(|| self.mask(mask))
    }
    fn num<T: std::str::FromStr>(&self, rel: &str) -> Option<T> {
        self.read(rel)?.parse().ok()
    }
    /// Names `prefix<N>` in a directory, as numbers up to MAX_CPU, sorted
    /// (a `cpu18446744073709551615` directory is no CPU).
    fn numbered(&self, rel: &str, prefix: &str) -> Vec<usize> {
        let Ok(rd) = std::fs::read_dir(self.path(rel)) else {
            return vec![];
        };
        let mut v: Vec<usize> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
            .filter(|n| *n <= crate::cpuset::MAX_CPU)
            .collect();
        v.sort_unstable();
        v
    }
}

/// What one CPU's sysfs directory says.
#[derive(Default, Clone)]
struct CpuInfo {
    package_id: Option<i64>,
    core_id: Option<i64>,
    siblings: Option<CpuSet>,
    package_cpus: Option<CpuSet>,
    die_cpus: Option<CpuSet>,
    cluster_cpus: Option<CpuSet>,
    l2: Option<CpuSet>,
    l3: Option<CpuSet>,
    capacity: Option<u64>,
}

/// The hardware threads of `cpu`'s core, as its sysfs directory lists them.
fn siblings_of(r: &Root, cpu: usize) -> Option<CpuSet> {
    let t = format!("{CPU_DIR}/cpu{cpu}/topology");
    r.list_or_mask(&format!("{t}/core_cpus_list"), &format!("{t}/core_cpus"))
        .or_else(|| {
            r.list_or_mask(
                &format!("{t}/thread_siblings_list"),
                &format!("{t}/thread_siblings"),
            )
        })
}

/// Every online CPU's directory read. A hardware thread whose core an
/// earlier thread of the same core already described (its sibling list the
/// same, read from its own directory) shares that description: package,
/// core, die, cluster, caches and capacity are the core's. One file read for
/// it instead of a dozen and more (a 256-thread POWER dump: 6190 opens
/// before, see BENCHMARKS.md).
fn read_cpus(r: &Root, online: &CpuSet) -> BTreeMap<usize, CpuInfo> {
    let mut infos: BTreeMap<usize, CpuInfo> = BTreeMap::new();
    // A CPU named in an earlier CPU's sibling list -> that CPU.
    let mut described_by: BTreeMap<usize, usize> = BTreeMap::new();
    for cpu in online.iter() {
        if let Some(first) = described_by.get(&cpu).copied()
            && let Some(same) = infos.get(&first)
            && siblings_of(r, cpu).is_some_and(|s| Some(&s) == same.siblings.as_ref())
        {
            let info = same.clone();
            infos.insert(cpu, info);
            continue;
        }
        let info = read_cpu(r, cpu);
        for sibling in info.siblings.iter().flat_map(|s| s.iter()) {
            if sibling > cpu {
                described_by.entry(sibling).or_insert(cpu);
            }
        }
        infos.insert(cpu, info);
    }
    infos
}

fn read_cpu(r: &Root, cpu: usize) -> CpuInfo {
    let t = format!("{CPU_DIR}/cpu{cpu}/topology");
    let mut info = CpuInfo {
        package_id: r.num(&format!("{t}/physical_package_id")),
        core_id: r.num(&format!("{t}/core_id")),
        siblings: siblings_of(r, cpu),
        package_cpus: r
            .list_or_mask(
                &format!("{t}/package_cpus_list"),
                &format!("{t}/package_cpus"),
            )
            .or_else(|| {
                r.list_or_mask(
                    &format!("{t}/core_siblings_list"),
                    &format!("{t}/core_siblings"),
                )
            }),
        die_cpus: r.list_or_mask(&format!("{t}/die_cpus_list"), &format!("{t}/die_cpus")),
        cluster_cpus: r.list_or_mask(
            &format!("{t}/cluster_cpus_list"),
            &format!("{t}/cluster_cpus"),
        ),
        ..Default::default()
    };
    let cache = format!("{CPU_DIR}/cpu{cpu}/cache");
    for idx in r.numbered(&cache, "index") {
        let d = format!("{cache}/index{idx}");
        let level: Option<u32> = r.num(&format!("{d}/level"));
        // Only L2 and L3 make groups: an L1's files are not read further.
        if !matches!(level, Some(2 | 3)) {
            continue;
        }
        let kind = r.read(&format!("{d}/type")).unwrap_or_default();
        if kind == "Instruction" {
            continue;
        }
        // The map first, as hwloc reads it: old kernels have no list, and
        // the two can disagree.
        let shared = r
            .mask(&format!("{d}/shared_cpu_map"))
            .or_else(|| r.list(&format!("{d}/shared_cpu_list")));
        // Some kernels (ia64) leave the map empty: take the cache as the core's.
        let shared = shared.map(|s| {
            if s.is_empty() {
                info.siblings
                    .clone()
                    .unwrap_or_else(|| std::iter::once(cpu).collect())
            } else {
                s
            }
        });
        match level {
            Some(2) => info.l2 = shared.or(info.l2),
            Some(3) => info.l3 = shared.or(info.l3),
            _ => {}
        }
    }
    info.capacity = r
        .num(&format!("{CPU_DIR}/cpu{cpu}/cpu_capacity"))
        .or_else(|| r.num(&format!("{CPU_DIR}/cpu{cpu}/cpufreq/cpuinfo_max_freq")));
    info
}

fn online_cpus(r: &Root) -> CpuSet {
    if let Some(set) = r.list(&format!("{CPU_DIR}/online"))
        && !set.is_empty()
    {
        return set;
    }
    // No `online` file: every cpuN directory whose own `online` is not 0.
    r.numbered(CPU_DIR, "cpu")
        .into_iter()
        .filter(|c| r.read(&format!("{CPU_DIR}/cpu{c}/online")).as_deref() != Some("0"))
        .collect()
}

/// Distinct sets (each intersected with `online`), in order of first CPU.
fn distinct(sets: impl Iterator<Item = CpuSet>, online: &CpuSet) -> Vec<Group> {
    let mut seen: Vec<CpuSet> = vec![];
    for s in sets {
        let s = s.intersection(online);
        if !s.is_empty() && !seen.contains(&s) {
            seen.push(s);
        }
    }
    seen.sort_by_key(|s| s.first());
    seen.into_iter()
        .enumerate()
        .map(|(id, cpus)| Group { id, cpus })
        .collect()
}

/// Group CPUs by a numeric key (package id, core id) when no set file exists.
fn by_key(online: &CpuSet, key: impl Fn(usize) -> Option<i64>) -> Vec<CpuSet> {
    let mut map: BTreeMap<i64, CpuSet> = BTreeMap::new();
    for cpu in online.iter() {
        map.entry(key(cpu).unwrap_or(-1)).or_default().insert(cpu);
    }
    map.into_values().collect()
}

fn cpu_structure(r: &Root, t: &mut Topology, infos: &BTreeMap<usize, CpuInfo>) {
    let online = t.online_cpus.clone();
    // Packages: the package's CPU set where sysfs gives it, else the id.
    let packages: Vec<CpuSet> = if infos.values().all(|i| i.package_cpus.is_some()) {
        infos
            .values()
            .filter_map(|i| i.package_cpus.clone())
            .collect()
    } else {
        by_key(&online, |c| infos[&c].package_id.filter(|id| *id >= 0))
    };
    t.packages = distinct(packages.into_iter(), &online);
    let package_of = |cpu: usize| t.packages.iter().position(|p| p.cpus.contains(cpu));

    // Cores: the sibling set; else (package, core_id); else one core per CPU.
    let cores: Vec<CpuSet> = if infos.values().all(|i| i.siblings.is_some()) {
        infos.values().filter_map(|i| i.siblings.clone()).collect()
    } else if infos.values().all(|i| i.core_id.is_some()) {
        by_key(&online, |c| {
            Some(package_of(c).unwrap_or(0) as i64 * 1_000_000 + infos[&c].core_id?)
        })
    } else {
        online
            .iter()
            .map(|c| std::iter::once(c).collect())
            .collect()
    };
    let mut capacities = vec![];
    t.cores = distinct(cores.into_iter(), &online)
        .into_iter()
        .map(|g| {
            let capacity = g.cpus.iter().filter_map(|c| infos[&c].capacity).max();
            capacities.push(capacity);
            Core {
                id: g.id,
                package: g.cpus.first().and_then(package_of).unwrap_or(0),
                cpus: g.cpus,
                kind: None,
                capacity,
            }
        })
        .collect();
    mark_hybrid(t, &capacities, r);
    let group_if_split = |sets: Vec<CpuSet>| {
        let g = distinct(sets.into_iter(), &online);
        if g.len() > t.packages.len() {
            g
        } else {
            vec![]
        }
    };
    t.dies = group_if_split(infos.values().filter_map(|i| i.die_cpus.clone()).collect());
    let clusters = group_if_split(
        infos
            .values()
            .filter_map(|i| i.cluster_cpus.clone())
            .collect(),
    );
    // A "cluster" that is just the core adds nothing.
    t.clusters = if clusters.len() < t.cores.len() {
        clusters
    } else {
        vec![]
    };
    t.l2_groups = distinct(infos.values().filter_map(|i| i.l2.clone()), &online);
    t.l3_groups = distinct(infos.values().filter_map(|i| i.l3.clone()), &online);
}

/// Hybrid CPUs: Intel lists its E-cores in /sys/devices/cpu_atom/cpus; else
/// split core capacities (cpu_capacity, or max frequency) at their largest gap
/// when the fastest is over 15% above the slowest (turbo-favoured cores differ
/// by a few percent and are not another kind).
fn mark_hybrid(t: &mut Topology, capacities: &[Option<u64>], r: &Root) {
    let atoms = r
        .list("sys/devices/cpu_atom/cpus")
        .filter(|s| !s.is_empty());
    let threshold = if atoms.is_some() {
        None
    } else {
        let mut known: Vec<u64> = capacities.iter().flatten().copied().collect();
        known.sort_unstable();
        known.dedup();
        let (Some(&min), Some(&max)) = (known.first(), known.last()) else {
            return;
        };
        if min == 0 || (max as f64) < min as f64 * 1.15 {
            return;
        }
        // The upper side of the largest ratio gap between consecutive values.
        known
            .windows(2)
            .max_by(|a, b| (a[1] as f64 / a[0] as f64).total_cmp(&(b[1] as f64 / b[0] as f64)))
            .map(|w| w[1])
    };
    for core in &mut t.cores {
        let efficient = match (&atoms, threshold) {
            (Some(a), _) => core.cpus.is_subset(a),
            (None, Some(th)) => core.capacity.is_some_and(|c| c < th),
            _ => false,
        };
        core.kind = Some(if efficient {
            CoreKind::Efficiency
        } else {
            CoreKind::Performance
        });
    }
    let e = t
        .cores
        .iter()
        .filter(|c| c.kind == Some(CoreKind::Efficiency))
        .count();
    t.notes.push(format!(
        "hybrid CPU: {} performance and {e} efficiency cores",
        t.cores.len() - e
    ));
}

fn numa(r: &Root, t: &mut Topology) {
    let mut ids: Vec<usize> = r
        .list(&format!("{NODE_DIR}/online"))
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    if ids.is_empty() {
        ids = r.numbered(NODE_DIR, "node");
    }
    ids.retain(|id| *id < super::MAX_NODES);
    let mut rows: Vec<(usize, Vec<u64>)> = vec![];
    for id in ids {
        let d = format!("{NODE_DIR}/node{id}");
        if !r.path(&d).is_dir() {
            continue;
        }
        let cpus = r
            .list_or_mask(&format!("{d}/cpulist"), &format!("{d}/cpumap"))
            .unwrap_or_default()
            .intersection(&t.online_cpus);
        let memory_bytes = r
            .read(&format!("{d}/meminfo"))
            .and_then(|m| fsread::mem_total_bytes(&m))
            .unwrap_or(0);
        if let Some(row) = r.read(&format!("{d}/distance")) {
            let row: Vec<u64> = row
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            rows.push((id, row));
        }
        t.numa_nodes.push(NumaNode {
            id,
            cpus,
            memory_bytes,
        });
    }
    // Each row lists distances to the online nodes in id order.
    let ids: Vec<usize> = t.numa_nodes.iter().map(|n| n.id).collect();
    let full = rows
        .iter()
        .filter(|(_, row)| row.len() == ids.len())
        .count();
    if ids.len() > 1 && full == ids.len() {
        t.numa_distances = Some(Distances {
            matrix: rows.into_iter().map(|(_, r)| r).collect(),
            ids,
        });
    }
    collapse_buggy_numa(t);
    one_node_per_cpu(t);
}

/// A CPU listed in several nodes (overlapping node sets) stays in the most
/// specific one: the node with the fewest CPUs, the lowest id on a tie. The
/// planner needs node sets that never overlap.
fn one_node_per_cpu(t: &mut Topology) {
    let mut order: Vec<usize> = (0..t.numa_nodes.len()).collect();
    order.sort_by_key(|&i| (t.numa_nodes[i].cpus.len(), t.numa_nodes[i].id));
    let mut taken = CpuSet::new();
    let mut moved = vec![];
    for i in order {
        let n = &mut t.numa_nodes[i];
        let dup = n.cpus.intersection(&taken);
        if !dup.is_empty() {
            n.cpus = n.cpus.difference(&dup);
            moved.push(format!("{dup} (not in node {})", n.id));
        }
        taken = taken.union(&n.cpus);
    }
    if !moved.is_empty() {
        t.notes.push(format!(
            "NUMA nodes list some CPUs twice; each CPU kept in its smallest node: {}",
            moved.join(", ")
        ));
    }
}

/// Firmware that lists every CPU in every node: one node, and say so.
fn collapse_buggy_numa(t: &mut Topology) {
    let with_cpus: Vec<&NumaNode> = t.numa_nodes.iter().filter(|n| !n.cpus.is_empty()).collect();
    if with_cpus.len() < 2 || !with_cpus.iter().all(|n| n.cpus == t.online_cpus) {
        return;
    }
    let ids: Vec<String> = with_cpus.iter().map(|n| n.id.to_string()).collect();
    let merged = NumaNode {
        id: with_cpus[0].id,
        cpus: t.online_cpus.clone(),
        memory_bytes: t.numa_nodes.iter().map(|n| n.memory_bytes).sum(),
    };
    t.notes.push(format!(
        "firmware lists every CPU in every NUMA node ({}): treated as one node",
        ids.join(",")
    ));
    t.numa_nodes = vec![merged];
    t.numa_distances = None;
}

fn pci(r: &Root, t: &mut Topology) {
    let Ok(rd) = std::fs::read_dir(r.path(PCI_DIR)) else {
        return;
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    for bus_id in names {
        let d = format!("{PCI_DIR}/{bus_id}");
        let hex = |f: &str| {
            r.read(&format!("{d}/{f}"))
                .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        };
        let (Some(vendor), Some(class)) = (hex("vendor"), hex("class")) else {
            continue;
        };
        let Some(kind) = super::classify_pci(vendor, class) else {
            continue;
        };
        let local_cpus = r
            .list_or_mask(&format!("{d}/local_cpulist"), &format!("{d}/local_cpus"))
            .unwrap_or_default()
            .intersection(&t.online_cpus);
        let numa_node = r
            .num::<i64>(&format!("{d}/numa_node"))
            .filter(|n| *n >= 0)
            .map(|n| n as usize);
        let dev = PciDevice {
            index: 0,
            bus_id,
            vendor: format!("0x{vendor:04x}"),
            device: hex("device").map_or_else(String::new, |v| format!("0x{v:04x}")),
            class: format!("0x{class:06x}"),
            numa_node,
            local_cpus,
            ..Default::default()
        };
        match kind {
            super::PciKind::Gpu => t.gpus.push(dev),
            super::PciKind::Nic => t.nics.push(dev),
        }
    }
}

/// Read the machine below `root`. `live` adds this process's affinity mask.
pub fn probe(root: &Path, live: bool) -> Result<Topology, TopologyError> {
    let r = Root::new(root);
    if !r.path(CPU_DIR).is_dir() {
        return Err(TopologyError::NotARoot {
            path: root.display().to_string(),
        });
    }
    let mut t = Topology::empty(format!("sysfs:{}", root.display()));
    t.online_cpus = online_cpus(&r);
    if t.online_cpus.is_empty() {
        return Err(TopologyError::NoCpus {
            path: root.display().to_string(),
        });
    }
    let infos = read_cpus(&r, &t.online_cpus);
    cpu_structure(&r, &mut t, &infos);
    numa(&r, &mut t);
    if t.numa_nodes.iter().all(|n| n.cpus.is_empty()) {
        // No NUMA information (or none with CPUs): one node holding everything.
        let memory_bytes = t.numa_nodes.iter().map(|n| n.memory_bytes).sum::<u64>();
        let memory_bytes = if memory_bytes > 0 {
            memory_bytes
        } else {
            meminfo_total(&r)
        };
        t.numa_nodes = vec![NumaNode {
            id: 0,
            cpus: t.online_cpus.clone(),
            memory_bytes,
        }];
        t.numa_distances = None;
    }
    pci(&r, &mut t);
    let cg = cgroup::probe(root);
    t.limits.cgroup_version = cg.version;
    t.limits.cgroup_path = cg.path;
    t.limits.cgroup_cpuset = cg.cpuset;
    t.limits.cpu_quota = cg.quota;
    if live {
        t.limits.affinity = crate::os::get_affinity().ok();
    }
    t.finish();
    if t.allowed_cpus.is_empty() {
        t.notes.push(
            "the allowed CPU set is empty (cgroup cpuset and online CPUs do not meet)".into(),
        );
    }
    // A dump's odd files (`--root`); a live kernel's files are its own,
    // and some attributes refuse reads (EIO, EINVAL) as a matter of course.
    if !live {
        t.notes.extend(r.1.take());
    }
    Ok(t)
}

fn meminfo_total(r: &Root) -> u64 {
    r.read("proc/meminfo")
        .and_then(|m| fsread::mem_total_bytes(&m))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fsread::fake_root;

    /// Four CPUs, two nodes whose lists overlap on CPU 2 (neither contains the
    /// other), one L3 whose map and list disagree.
    fn odd_machine() -> tempfile::TempDir {
        let mut files = vec![
            ("sys/devices/system/cpu/online", "0-3\n".to_string()),
            ("sys/devices/system/node/online", "0-1\n".to_string()),
            ("sys/devices/system/node/node0/cpulist", "0-2\n".to_string()),
            ("sys/devices/system/node/node1/cpulist", "2-3\n".to_string()),
        ];
        let mut paths = vec![];
        for c in 0..4 {
            paths.push((
                format!("sys/devices/system/cpu/cpu{c}/cache/index3/level"),
                "3\n",
            ));
            paths.push((
                format!("sys/devices/system/cpu/cpu{c}/cache/index3/type"),
                "Unified\n",
            ));
            paths.push((
                format!("sys/devices/system/cpu/cpu{c}/cache/index3/shared_cpu_map"),
                "0000000f\n",
            ));
            paths.push((
                format!("sys/devices/system/cpu/cpu{c}/cache/index3/shared_cpu_list"),
                "0-1\n",
            ));
        }
        for (p, s) in &paths {
            files.push((p.as_str(), s.to_string()));
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, s)| (*p, s.as_str())).collect();
        fake_root(&files)
    }

    #[test]
    fn odd_files_in_a_dump_are_said_not_passed_over() {
        let d = odd_machine();
        let cpu1 = d
            .path()
            .join("sys/devices/system/cpu/cpu1/cache/index3/shared_cpu_map");
        let _ = std::fs::remove_file(&cpu1);
        let fifo = std::ffi::CString::new(cpu1.to_str().unwrap()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let cache2 = d.path().join("sys/devices/system/cpu/cpu2/cache/index3");
        std::fs::remove_file(cache2.join("shared_cpu_map")).unwrap();
        let big = cache2.join("shared_cpu_list");
        std::fs::write(&big, "0-4294967295\n").unwrap();
        let t = probe(d.path(), false).unwrap();
        let said = t.notes.join("\n");
        assert!(
            said.contains("cpu1/cache/index3/shared_cpu_map") && said.contains("FIFO"),
            "{said}"
        );
        assert!(
            said.contains("cpu2/cache/index3/shared_cpu_list") && said.contains("not a CPU list"),
            "{said}"
        );
    }

    #[test]
    fn overlapping_nodes_give_each_cpu_one_node() {
        let d = odd_machine();
        let t = probe(d.path(), false).unwrap();
        let sets: Vec<String> = t.numa_nodes.iter().map(|n| n.cpus.to_string()).collect();
        assert_eq!(sets, ["0-1", "2-3"], "CPU 2 stays in the smaller node 1");
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("listed") || n.contains("twice")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn a_hardware_thread_shares_its_cores_description_only_where_it_lists_the_same_core() {
        let t = "sys/devices/system/cpu/cpu";
        let files = [
            ("sys/devices/system/cpu/online", "0-3".to_string()),
            // CPU 0 described in full; CPU 1 lists the same core and nothing
            // else: it shares CPU 0's package, core and L2.
            (&format!("{t}0/topology/core_cpus_list"), "0-1".into()),
            (&format!("{t}0/topology/physical_package_id"), "5".into()),
            (&format!("{t}0/topology/core_id"), "9".into()),
            (&format!("{t}0/cache/index2/level"), "2".into()),
            (&format!("{t}0/cache/index2/type"), "Unified".into()),
            (&format!("{t}0/cache/index2/shared_cpu_map"), "3".into()),
            (&format!("{t}1/topology/core_cpus_list"), "0-1".into()),
            // CPU 2 names CPU 3 its sibling, but CPU 3 does not agree (a
            // dump's oddity): CPU 3 is read from its own directory.
            (&format!("{t}2/topology/core_cpus_list"), "2-3".into()),
            (&format!("{t}2/topology/core_id"), "1".into()),
            (&format!("{t}3/topology/core_cpus_list"), "3".into()),
            (&format!("{t}3/topology/core_id"), "7".into()),
        ]
        .map(|(p, s)| (p.to_string(), s));
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, s)| (p.as_str(), s.as_str()))
            .collect();
        let d = fake_root(&files);
        let r = Root::new(d.path());
        let infos = read_cpus(&r, &CpuSet::parse_list("0-3").unwrap());
        assert_eq!(
            (infos[&1].package_id, infos[&1].core_id),
            (Some(5), Some(9))
        );
        assert_eq!(infos[&1].l2, CpuSet::parse_list("0-1").ok());
        assert_eq!(infos[&3].core_id, Some(7));
        assert_eq!(infos[&3].siblings, CpuSet::parse_list("3").ok());
    }

    #[test]
    fn cache_sharing_comes_from_the_map() {
        let d = odd_machine();
        let t = probe(d.path(), false).unwrap();
        let l3: Vec<String> = t.l3_groups.iter().map(|g| g.cpus.to_string()).collect();
        assert_eq!(l3, ["0-3"], "shared_cpu_map says all four share the L3");
    }

    #[test]
    fn a_fifo_or_huge_file_in_a_dump_is_skipped_not_waited_on() {
        let d = odd_machine();
        let fifo = d.path().join("sys/devices/system/node/node1/distance");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let big = "0,".repeat(10 << 20);
        std::fs::write(d.path().join("sys/devices/system/node/node0/distance"), big).unwrap();
        let t = probe(d.path(), false).unwrap();
        assert_eq!(t.numa_nodes.len(), 2);
        assert!(t.numa_distances.is_none());
    }
}
