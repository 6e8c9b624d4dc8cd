//! The probe entry point: where a topology comes from (the live machine, a
//! /sys + /proc dump, an hwloc XML export, a synthetic description), its GPUs
//! narrowed to the job's (`gpus`). `topo`, `plan`, `run`, `bind`, `tune`,
//! `doctor` and `top` all start here (the planner's other facts, the
//! allocators installed, come from `host`); nothing here launches.

use std::path::{Path, PathBuf};

use super::gpus::{self, NvmlUse};
use super::{Topology, TopologyError, hwloc_xml, synthetic, sysfs};

/// Where a topology comes from.
#[derive(Debug, Clone, Default)]
pub(crate) enum Source {
    /// This machine, narrowed to CUDA_VISIBLE_DEVICES.
    #[default]
    Live,
    /// A /sys + /proc dump (hwloc-gather-topology).
    Root(PathBuf),
    /// An hwloc v2 XML export.
    Xml(PathBuf),
    /// A synthetic description.
    Synthetic(String),
}

/// Read the topology `source` names, its GPUs narrowed to the job's.
pub(crate) fn topology(source: &Source) -> Result<Topology, TopologyError> {
    topology_with(source, NvmlUse::IfNeeded)
}

/// `topology`, saying when NVML is loaded (`topo` always loads it).
pub(crate) fn topology_with(source: &Source, nvml: NvmlUse) -> Result<Topology, TopologyError> {
    match source {
        Source::Root(root) => {
            let mut t = sysfs::probe(root, false)?;
            job_gpus(&mut t, root, false, nvml)?;
            Ok(t)
        }
        Source::Xml(file) => hwloc_xml::load(file),
        Source::Synthetic(desc) => synthetic::parse(desc),
        Source::Live => {
            let mut t = sysfs::probe(Path::new("/"), true)?;
            job_gpus(&mut t, Path::new("/"), true, nvml)?;
            Ok(t)
        }
    }
}

/// Narrow the machine's GPUs to those the job may use (topology/gpus.rs).
fn job_gpus(t: &mut Topology, root: &Path, live: bool, nvml: NvmlUse) -> Result<(), TopologyError> {
    if t.gpus.is_empty() {
        return Ok(());
    }
    let ev = gpus::gather(root, live, nvml);
    let (chosen, access) = gpus::decide(&t.gpus, &ev)?;
    t.gpus = chosen;
    t.gpu_access = Some(access);
    Ok(())
}

/// Inside an srun step: each task gets one CPU unless asked, which the hint of
/// a plan short of CPUs names.
pub(crate) fn in_srun_step() -> bool {
    std::env::var_os("SLURM_STEP_ID").is_some()
}
