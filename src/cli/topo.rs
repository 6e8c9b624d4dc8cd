//! `threadwise topo` and `threadwise plan`: read the topology, plan, print.

use super::args::{PlanCmd, TopoArgs};
use super::{Exit, Failure, PlanArgs, SourceArgs, emit};
use crate::export::{Context, PlanFormat};
use crate::plan::{self, AllocatorChoice, Facts, PlanRequest};
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

/// Colour on a terminal, unless NO_COLOR.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// `--svg FILE`, written the safe way.
fn write_svg(
    path: Option<&std::path::Path>,
    t: &Topology,
    p: Option<&plan::Plan>,
) -> Result<(), Failure> {
    if let Some(path) = path {
        crate::files::write_output(path, crate::picture::svg(t, p).as_bytes())?;
    }
    Ok(())
}

pub fn topo(a: TopoArgs) -> Result<Exit, Failure> {
    let t = load(&a.source)?;
    write_svg(a.svg.as_deref(), &t, None)?;
    if a.picture {
        return emit(&crate::picture::text(&t, None, colour()));
    }
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
        policy: a.policy,
        smt: a.smt,
        threads: a.threads,
        workers: a.workers,
        mem: a.mem,
        allocator: a.allocator,
        profile: a.profile,
        amp: a.amp,
        nnodes: a.nnodes as usize,
        oversubscribe: a.oversubscribe,
        omp_bind: a.omp_bind,
        omp_wait: a.omp_wait,
        reserve: a.reserve.clone(),
        unset_threads: false,
    }
}

/// What the planner may use besides the topology: the allocator libraries on
/// this machine, looked up only when the request asks for one.
pub fn facts(req: &PlanRequest) -> Facts {
    if req.allocator == AllocatorChoice::None {
        Facts::default()
    } else {
        facts_with_allocators()
    }
}

/// Facts with the allocator search done (tune: any configuration may ask).
pub fn facts_with_allocators() -> Facts {
    let s = crate::host::find_allocators();
    Facts {
        allocators: s.found,
        skipped_allocators: s.skipped,
    }
}

/// How to call this binary again in printed command lines.
pub fn program_name() -> String {
    std::env::args()
        .next()
        .filter(|p| !p.contains('/'))
        .unwrap_or_else(|| "threadwise".to_string())
}

pub fn plan(a: PlanCmd) -> Result<Exit, Failure> {
    let t = load(&a.source)?;
    let req = request(&a.plan);
    let p = plan::plan(&t, &req, &facts(&req))?;
    write_svg(a.svg.as_deref(), &t, Some(&p))?;
    if a.picture {
        return emit(&crate::picture::text(&t, Some(&p), colour()));
    }
    let format = if a.json { PlanFormat::Json } else { a.format };
    let ctx = Context {
        command: a.command,
        local_rank: a.local_rank,
        explain: a.explain,
        program: program_name(),
    };
    let text = format
        .exporter()
        .render(&p, &ctx)
        .map_err(|e| Failure::usage(e.to_string(), "see threadwise plan --help"))?;
    emit(&text)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use proptest::prelude::*;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::export::request_args;
    use crate::plan::{Amount, GpuSelect, MemPolicy, NProc, Policy, Profile, Reserve, WaitPolicy};

    fn reparse(args: &[String]) -> PlanRequest {
        let argv = ["threadwise", "bind"]
            .into_iter()
            .map(String::from)
            .chain(args.iter().cloned())
            .chain(["--".into(), "true".into()]);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Bind(b) => request(&b.plan),
            _ => unreachable!(),
        }
    }

    fn requests() -> impl Strategy<Value = PlanRequest> {
        let amount = prop_oneof![Just(Amount::Auto), (1usize..64).prop_map(Amount::Fixed)];
        (
            prop_oneof![
                Just(NProc::Auto),
                Just(NProc::Gpu),
                (1usize..64).prop_map(NProc::Count)
            ],
            prop_oneof![
                Just(GpuSelect::Auto),
                Just(GpuSelect::None),
                Just(GpuSelect::List(vec![1, 0, 3]))
            ],
            proptest::sample::select(Policy::ALL),
            proptest::sample::select(MemPolicy::ALL),
            proptest::sample::select(AllocatorChoice::ALL),
            (
                proptest::sample::select(Profile::ALL),
                proptest::sample::select(WaitPolicy::ALL),
            ),
            (amount.clone(), amount),
            (any::<[bool; 4]>(), 1usize..8),
            prop_oneof![
                Just(Reserve::None),
                (1usize..4).prop_map(Reserve::PerNode),
                Just(Reserve::Cpus(
                    crate::cpuset::CpuSet::parse_list("0,2-3").unwrap()
                ))
            ],
        )
            .prop_map(
                |(
                    nproc,
                    gpus,
                    policy,
                    mem,
                    allocator,
                    (profile, omp_wait),
                    (threads, workers),
                    (b, nnodes),
                    reserve,
                )| {
                    PlanRequest {
                        nproc,
                        gpus,
                        policy,
                        smt: b[0],
                        threads,
                        workers,
                        mem,
                        allocator,
                        profile,
                        amp: b[1],
                        nnodes,
                        oversubscribe: b[2],
                        omp_bind: b[3],
                        omp_wait,
                        reserve,
                        // tune's baseline only: no command-line spelling.
                        unset_threads: false,
                    }
                },
            )
    }

    proptest! {
        /// bind and multi-node runs rebuild the plan from these options on
        /// every rank: they must mean exactly the request they came from.
        #[test]
        fn request_args_reparse_to_the_same_request(req in requests()) {
            prop_assert_eq!(reparse(&request_args(&req)), req);
        }
    }
}
