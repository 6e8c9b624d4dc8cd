//! Which GPUs this job may use, decided from evidence rather than from the
//! PCI bus alone: a container (`docker run --gpus 2`, a Kubernetes pod) or a
//! Slurm step with `ConstrainDevices=yes` shows every GPU of the server on the
//! bus but lets the job open only some.
//!
//! The evidence, in the order it is applied:
//! 1. the device nodes the process can open: `/dev/nvidia<minor>` (the minor
//!    maps to a bus id through `/proc/driver/nvidia/gpus/<bus id>/information`),
//!    `/dev/dri/renderD*` for AMD (`/sys/class/drm/renderD*/device`); a node
//!    that exists but cannot be opened (a devices cgroup) does not count;
//! 2. NVML, when consulted: it lists only what the process may use;
//! 3. `CUDA_VISIBLE_DEVICES` (indices into what is left, as CUDA numbers them,
//!    UUIDs `GPU-...` and `MIG-...`), `ROCR_VISIBLE_DEVICES` then
//!    `HIP_VISIBLE_DEVICES` on AMD;
//! 4. Slurm's `SLURM_STEP_GPUS`/`SLURM_JOB_GPUS` and `NVIDIA_VISIBLE_DEVICES`,
//!    compared with the result and reported, never acted on.
//!
//! `gather` reads (the OS edge, `gather.rs`); `decide` is pure: one
//! `Decision` value that each stage (`stages.rs`) narrows in turn, saying
//! what it read and what it decided.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PciDevice, TopologyError};
use crate::nvml::NvmlGpu;

/// How the job's GPUs were told from the machine's, for `topo` and `plan`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuAccess {
    /// GPUs on the PCI bus: the whole machine.
    pub on_bus: usize,
    /// GPUs (or MIG slices) this job may use: `gpus` of the topology.
    pub usable: usize,
    /// What was read and what it decided, in order.
    pub evidence: Vec<String>,
    /// GPUs on the bus this job cannot use, and why.
    pub hidden: Vec<HiddenGpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HiddenGpu {
    pub bus_id: String,
    pub numa_node: Option<usize>,
    pub why: String,
}

/// A device node, as far as the job can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// Opened (a live device node the job may use).
    Opened,
    /// A file in a dump, or a node whose driver did not answer (no driver):
    /// it exists and nothing forbids it.
    Present,
    /// It exists but the job may not open it (a devices cgroup: EPERM).
    Denied(String),
}

/// One GPU in `/proc/driver/nvidia/gpus/<bus id>/information`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct DriverGpu {
    pub minor: Option<u32>,
    pub uuid: Option<String>,
    pub model: Option<String>,
}

/// Everything `decide` looks at.
#[derive(Debug, Clone, Default)]
pub(crate) struct GpuEvidence {
    /// `/proc/driver/nvidia/gpus`, by bus id; None when there is no such
    /// directory (no NVIDIA driver, or a dump without it).
    pub nvidia_driver: Option<BTreeMap<String, DriverGpu>>,
    /// Whether a `dev/` directory was there to look at.
    pub dev_seen: bool,
    /// `/dev/nvidia<minor>` nodes.
    pub nvidia_nodes: BTreeMap<u32, NodeState>,
    /// AMD render nodes by the bus id their sysfs link names; None when
    /// there is no `/sys/class/drm`.
    pub amd_nodes: Option<BTreeMap<String, NodeState>>,
    /// GPU minors whose driver capabilities show MIG GPU instances.
    pub mig_minors: Vec<u32>,
    /// NVML's list, or why it did not load; None when not consulted.
    pub nvml: Option<Result<Vec<NvmlGpu>, String>>,
    /// The job's environment (the variables below only).
    pub env: BTreeMap<String, String>,
    /// Where the environment came from, for the evidence lines.
    pub env_from: String,
}

/// The variables that bear on which GPUs a job has.
pub(crate) const ENV_VARS: [&str; 7] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
];

/// When to load NVML while gathering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NvmlUse {
    /// `topo`: always (it is the command that shows everything).
    Always,
    /// Planning: only when the files cannot answer (UUIDs to resolve, MIG,
    /// device nodes with no driver table): NVML's start-up costs up to seconds
    /// when persistence mode is off, once per `bind`.
    IfNeeded,
}

mod gather;
mod stages;
#[cfg(test)]
mod tests;

pub(crate) use gather::gather;
use stages::Decision;

/// Decide the job's GPUs from the machine's (`bus`, PCI order, `index` set).
/// Returns them in the order the job numbers them (cuda:0 first).
pub(crate) fn decide(
    bus: &[PciDevice],
    ev: &GpuEvidence,
) -> Result<(Vec<PciDevice>, GpuAccess), TopologyError> {
    let mut d = Decision::new(bus, ev);
    // 1. Device nodes.
    d.device_nodes();
    // 2. NVML.
    d.nvml_list();
    // 3. The job's own variables, in the job's numbering.
    d.number();
    d.cuda_device_order();
    match ev.env.get("CUDA_VISIBLE_DEVICES") {
        Some(v) => d.cuda_visible_devices(v)?,
        None => d.every_nvidia_gpu(),
    }
    d.amd_visible_devices();
    // 4. Corroboration only.
    d.slurm_gpus();
    d.nvidia_visible_devices();
    Ok(d.finish())
}
