//! `threadwise topo` and `threadwise plan`: read the topology, plan, print.

use super::args::{AllocatorArg, MemArg, PlanCmd, PolicyArg, ProfileArg, TopoArgs};
use super::{Failure, PlanArgs, SourceArgs, emit};
use crate::export::{self, Context};
use crate::plan::{self, AllocatorChoice, Facts, MemPolicy, PlanRequest, Policy, Profile};
use crate::topology::{Topology, TopologyError, hwloc_xml, render, synthetic, sysfs};

fn topology_failure(e: TopologyError) -> Failure {
    let hint = match &e {
        TopologyError::NotARoot { .. } => {
            "give --root a directory holding sys/ and proc/ (hwloc-gather-topology output)"
        }
        TopologyError::Xml { .. } => "give --topology an hwloc v2 export: lstopo --of xml FILE.xml",
        TopologyError::Synthetic { .. } => {
            "e.g. --synthetic \"package:2 numa:2 l3:2 core:8 pu:2 gpu:4\""
        }
        TopologyError::VisibleDevices { .. } => "unset CUDA_VISIBLE_DEVICES or give GPU indices",
        _ => "check the path and permissions",
    };
    Failure::env(e.to_string(), hint)
}

/// Read the topology the options name; the live machine honours CUDA_VISIBLE_DEVICES.
pub fn load(source: &SourceArgs) -> Result<Topology, Failure> {
    let mut t = if let Some(root) = &source.root {
        sysfs::probe(root, false)
    } else if let Some(file) = &source.topology {
        hwloc_xml::load(file)
    } else if let Some(desc) = &source.synthetic {
        synthetic::parse(desc)
    } else {
        sysfs::probe(std::path::Path::new("/"), true)
    }
    .map_err(topology_failure)?;
    if source.root.is_none()
        && source.topology.is_none()
        && source.synthetic.is_none()
        && let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES")
    {
        t.restrict_gpus(&visible).map_err(topology_failure)?;
    }
    Ok(t)
}

pub fn topo(a: TopoArgs) -> Result<(), Failure> {
    let t = load(&a.source)?;
    if a.json {
        let text = serde_json::to_string_pretty(&t)
            .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
        emit(&(text + "\n"))
    } else {
        emit(&render::render(&t))
    }
}

/// The plain request the options describe.
pub fn request(a: &PlanArgs) -> PlanRequest {
    PlanRequest {
        nproc: a.nproc,
        gpus: a.gpus.clone(),
        policy: match a.policy {
            PolicyArg::Exclusive => Policy::Exclusive,
            PolicyArg::Node => Policy::Node,
            PolicyArg::Socket => Policy::Socket,
            PolicyArg::L3 => Policy::L3,
            PolicyArg::Single => Policy::Single,
            PolicyArg::None => Policy::None,
        },
        smt: a.smt,
        threads: a.threads,
        workers: a.workers,
        mem: match a.mem {
            MemArg::Local => MemPolicy::Local,
            MemArg::Preferred => MemPolicy::Preferred,
            MemArg::Bind => MemPolicy::Bind,
            MemArg::Interleave => MemPolicy::Interleave,
            MemArg::None => MemPolicy::None,
        },
        allocator: match a.allocator {
            AllocatorArg::None => AllocatorChoice::None,
            AllocatorArg::Jemalloc => AllocatorChoice::Jemalloc,
            AllocatorArg::Tcmalloc => AllocatorChoice::Tcmalloc,
            AllocatorArg::Auto => AllocatorChoice::Auto,
        },
        profile: match a.profile {
            ProfileArg::Auto => Profile::Auto,
            ProfileArg::Seed => Profile::Seed,
        },
        amp: a.amp,
        nnodes: a.nnodes as usize,
        oversubscribe: a.oversubscribe,
        omp_bind: a.omp_bind,
    }
}

/// How to call this binary again in printed command lines.
pub fn program_name() -> String {
    std::env::args()
        .next()
        .filter(|p| !p.contains('/'))
        .unwrap_or_else(|| "threadwise".to_string())
}

pub fn plan(a: PlanCmd) -> Result<(), Failure> {
    let t = load(&a.source)?;
    let req = request(&a.plan);
    let facts = Facts {
        allocators: if req.allocator == AllocatorChoice::None {
            vec![]
        } else {
            plan::find_allocators()
        },
    };
    let p = plan::plan(&t, &req, &facts)?;
    let format = if a.json { "json" } else { a.format.as_str() };
    let exporter = export::exporter(format)
        .ok_or_else(|| Failure::usage(format!("unknown format {format}"), "see --help"))?;
    let ctx = Context {
        command: a.command,
        local_rank: a.local_rank,
        explain: a.explain,
        program: program_name(),
    };
    let text = exporter
        .render(&p, &ctx)
        .map_err(|e| Failure::usage(e.to_string(), "see threadwise plan --help"))?;
    emit(&text)
}
