//! What the machine is: plain data that every source (live sysfs, a sysfs dump,
//! an hwloc XML export, a synthetic description) produces and the planner reads.
//! Nothing here does I/O except through the source modules.

pub(crate) mod cgroup;
pub(crate) mod fsread;
pub(crate) mod gpus;
pub(crate) mod hwloc_xml;
pub(crate) mod probe;
pub(crate) mod render;
pub(crate) mod synthetic;
pub(crate) mod sysfs;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

pub(crate) const TOPOLOGY_SCHEMA: &str = "threadwise.topology/1";

/// Errors from reading a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a topology root: no {path}/sys/devices/system/cpu")]
    NotARoot { path: String },
    #[error("no online CPU found under {path}")]
    NoCpus { path: String },
    #[error("invalid hwloc XML in {path}: {why}")]
    Xml { path: String, why: String },
    #[error("invalid synthetic topology {text:?}: {why}")]
    Synthetic { text: String, why: String },
    #[error("CUDA_VISIBLE_DEVICES={value:?}: {why}")]
    VisibleDevices { value: String, why: String },
}

impl TopologyError {
    /// What to do about a topology that cannot be read.
    pub fn advice(&self) -> &'static str {
        match self {
            TopologyError::NotARoot { .. } => {
                "give --root a directory holding sys/ and proc/ (hwloc-gather-topology output)"
            }
            TopologyError::Xml { .. } => {
                "give --topology an hwloc v2 export: lstopo --of xml FILE.xml"
            }
            TopologyError::Synthetic { .. } => {
                "e.g. --synthetic \"package:2 numa:2 l3:2 core:8 pu:2 gpu:4\""
            }
            TopologyError::VisibleDevices { .. } => {
                "give indices or UUIDs of GPUs this job can open (threadwise topo lists them); \
                 UUIDs need the NVIDIA driver's /proc/driver/nvidia or NVML"
            }
            _ => "check the path and permissions",
        }
    }
}

/// At most this many NUMA nodes (Linux's MAX_NUMNODES with NODES_SHIFT=10):
/// the distance matrix is nodes², so the bound keeps hostile input cheap.
pub(crate) const MAX_NODES: usize = 1024;
/// At most this many GPUs or NICs (larger than any single machine).
pub(crate) const MAX_DEVICES: usize = 4096;

/// The PCI devices placement cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PciKind {
    Gpu,
    Nic,
}

/// NVIDIA and AMD display controllers are GPUs; network controllers and
/// Mellanox/NVIDIA networking devices (but not their bridges) are NICs.
/// `class` is sysfs's 24-bit class code (class, subclass, prog-if).
pub(crate) fn classify_pci(vendor: u32, class: u32) -> Option<PciKind> {
    let base = class >> 16;
    if matches!(vendor, 0x10de | 0x1002) && base == 0x03 {
        Some(PciKind::Gpu)
    } else if base == 0x02 || (vendor == 0x15b3 && base != 0x06) {
        Some(PciKind::Nic)
    } else {
        None
    }
}

/// One machine, as far as placement is concerned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub schema: String,
    /// Where this came from: "sysfs:/", "hwloc-xml:FILE", "synthetic:...".
    pub source: String,
    pub online_cpus: CpuSet,
    /// Online CPUs this process may use: affinity mask and cgroup cpuset applied.
    pub allowed_cpus: CpuSet,
    /// CPUs' worth of time this process may use: allowed CPUs capped by the cgroup quota.
    pub cpu_budget: f64,
    pub packages: Vec<Group>,
    /// Dies and clusters where sysfs shows more than one per package.
    pub dies: Vec<Group>,
    pub clusters: Vec<Group>,
    pub cores: Vec<Core>,
    pub l2_groups: Vec<Group>,
    pub l3_groups: Vec<Group>,
    pub numa_nodes: Vec<NumaNode>,
    pub numa_distances: Option<Distances>,
    pub gpus: Vec<PciDevice>,
    pub nics: Vec<PciDevice>,
    pub limits: Limits,
    /// How the GPUs this job may use were told from the machine's (live
    /// machine and dumps; null for XML exports and synthetic machines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_access: Option<gpus::GpuAccess>,
    /// Things the reader had to decide about this machine, in plain words.
    pub notes: Vec<String>,
}

/// A package, die, cluster or cache group: a set of CPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: usize,
    pub cpus: CpuSet,
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum CoreKind ("a core kind,") {
        Performance => "performance",
        Efficiency => "efficiency",
    }
}

crate::named_enum! {
    /// Where the allowed set's limit comes from.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub enum CgroupVersion ("a cgroup version,") {
        #[serde(rename = "v1")]
        V1 => "v1",
        #[serde(rename = "v2")]
        V2 => "v2",
        /// The allowed cpuset of an hwloc XML export.
        #[serde(rename = "from-xml")]
        Xml => "from-xml",
        /// `allowed:` / `quota:` of a synthetic description.
        #[serde(rename = "synthetic")]
        Synthetic => "synthetic",
    }
}

/// A physical core and its SMT siblings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Core {
    pub id: usize,
    pub package: usize,
    pub cpus: CpuSet,
    /// Performance or efficiency core on hybrid machines, else null.
    pub kind: Option<CoreKind>,
    /// cpu_capacity (arm) or max frequency in kHz, when sysfs shows it.
    pub capacity: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: usize,
    pub cpus: CpuSet,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distances {
    pub ids: Vec<usize>,
    pub matrix: Vec<Vec<u64>>,
}

impl Distances {
    pub fn get(&self, a: usize, b: usize) -> Option<u64> {
        let i = self.ids.iter().position(|&x| x == a)?;
        let j = self.ids.iter().position(|&x| x == b)?;
        self.matrix.get(i)?.get(j).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PciDevice {
    /// Index in PCI bus order among all devices of its kind on the machine (what
    /// CUDA numbers with CUDA_DEVICE_ORDER=PCI_BUS_ID and no CUDA_VISIBLE_DEVICES).
    pub index: usize,
    pub bus_id: String,
    pub vendor: String,
    pub device: String,
    pub class: String,
    /// NUMA node, or null when neither sysfs nor its local CPUs say.
    pub numa_node: Option<usize>,
    pub local_cpus: CpuSet,
    /// The GPU's UUID (`GPU-...`), from the driver or NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The driver's minor number: the GPU's device node is `/dev/nvidia<minor>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// A MIG slice of this GPU (`MIG-...`): the job's device is the slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// What CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD) names this GPU
    /// by inside this job: its place among the GPUs the job can open, in PCI
    /// bus order, or its UUID. Null when nothing narrows the machine's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_as: Option<String>,
}

impl PciDevice {
    /// What a rank's CUDA_VISIBLE_DEVICES names this GPU by.
    pub fn visible_name(&self) -> String {
        self.visible_as
            .clone()
            .unwrap_or_else(|| self.index.to_string())
    }
    pub fn is_amd(&self) -> bool {
        self.vendor == "0x1002"
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// This process's affinity mask (live machine only).
    pub affinity: Option<CpuSet>,
    /// v1 or v2, when a cgroup cpuset or quota was found.
    pub cgroup_version: Option<CgroupVersion>,
    pub cgroup_path: Option<String>,
    pub cgroup_cpuset: Option<CpuSet>,
    /// CPU quota in CPUs (quota / period), when one is set.
    pub cpu_quota: Option<f64>,
}

impl Topology {
    /// An empty topology of a given source, for readers to fill in.
    pub(crate) fn empty(source: String) -> Self {
        Topology {
            schema: TOPOLOGY_SCHEMA.to_string(),
            source,
            online_cpus: CpuSet::new(),
            allowed_cpus: CpuSet::new(),
            cpu_budget: 0.0,
            packages: vec![],
            dies: vec![],
            clusters: vec![],
            cores: vec![],
            l2_groups: vec![],
            l3_groups: vec![],
            numa_nodes: vec![],
            numa_distances: None,
            gpus: vec![],
            nics: vec![],
            limits: Limits::default(),
            gpu_access: None,
            notes: vec![],
        }
    }

    /// Fill in `allowed_cpus` and `cpu_budget` from online CPUs and limits.
    pub(crate) fn apply_limits(&mut self) {
        let mut allowed = self.online_cpus.clone();
        if let Some(a) = &self.limits.affinity {
            allowed = allowed.intersection(a);
        }
        if let Some(c) = &self.limits.cgroup_cpuset {
            allowed = allowed.intersection(c);
        }
        self.allowed_cpus = allowed;
        let n = self.allowed_cpus.len() as f64;
        self.cpu_budget = match self.limits.cpu_quota {
            Some(q) => n.min(q),
            None => n,
        };
    }

    /// The NUMA node whose CPUs hold most of `cpus`.
    pub fn node_of_set(&self, cpus: &CpuSet) -> Option<usize> {
        self.numa_nodes
            .iter()
            .map(|n| (n.cpus.intersection(cpus).len(), n.id))
            .filter(|(k, _)| *k > 0)
            .max_by_key(|(k, id)| (*k, std::cmp::Reverse(*id)))
            .map(|(_, id)| id)
    }

    /// Sort every list and derive what can be derived; readers call this last.
    pub(crate) fn finish(&mut self) {
        fn by_first(v: &mut [Group]) {
            v.sort_by_key(|g| g.cpus.first());
        }
        by_first(&mut self.packages);
        by_first(&mut self.dies);
        by_first(&mut self.clusters);
        by_first(&mut self.l2_groups);
        by_first(&mut self.l3_groups);
        self.cores.sort_by_key(|c| c.cpus.first());
        self.numa_nodes.sort_by_key(|n| n.id);
        for list in [&mut self.gpus, &mut self.nics] {
            list.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
            for (i, d) in list.iter_mut().enumerate() {
                d.index = i;
                if d.numa_node.is_none() && !d.local_cpus.is_empty() {
                    d.numa_node = self
                        .numa_nodes
                        .iter()
                        .filter(|n| !n.cpus.is_empty() && n.cpus.is_subset(&d.local_cpus))
                        .map(|n| n.id)
                        .next();
                }
            }
        }
        self.apply_limits();
    }

    /// NUMA nodes that have allowed CPUs.
    pub fn cpu_nodes(&self) -> impl Iterator<Item = &NumaNode> {
        self.numa_nodes
            .iter()
            .filter(|n| n.cpus.intersects(&self.allowed_cpus))
    }
}

impl crate::error::Hinted for TopologyError {
    fn hint(&self) -> String {
        self.advice().into()
    }
    /// A synthetic description is typed; anything else is read from the machine.
    fn kind(&self) -> crate::error::Kind {
        match self {
            TopologyError::Synthetic { .. } => crate::error::Kind::Usage,
            _ => crate::error::Kind::Environment,
        }
    }
}
