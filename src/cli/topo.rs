//! `threadwise topo` and `threadwise plan`: read the topology, plan, print.

use super::args::{PlanCmd, TopoArgs};
use super::{Exit, Failure, PlanArgs, SourceArgs, emit};
use crate::export::{Context, PlanFormat};
use crate::launch::prepare::{self, Source};
use crate::plan::{self, PlanRequest};
use crate::topology::{Topology, TopologyError, render};

fn topology_failure(e: TopologyError) -> Failure {
    let hint = prepare::topology_hint(&e);
    Failure::env(e.to_string(), hint)
}

/// Where the options say the topology comes from.
fn source(a: &SourceArgs) -> Source {
    if let Some(root) = &a.root {
        Source::Root(root.clone())
    } else if let Some(file) = &a.topology {
        Source::Xml(file.clone())
    } else if let Some(desc) = &a.synthetic {
        Source::Synthetic(desc.clone())
    } else {
        Source::Live
    }
}

/// Read the topology the options name; the live machine honours CUDA_VISIBLE_DEVICES.
pub fn load(a: &SourceArgs) -> Result<Topology, Failure> {
    prepare::topology(&source(a)).map_err(topology_failure)
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
    // topo shows everything, NVML's view included.
    let t = prepare::topology_with(&source(&a.source), crate::topology::gpus::NvmlUse::Always)
        .map_err(topology_failure)?;
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

pub use crate::launch::prepare::facts;

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
    use crate::plan::AllocatorChoice;
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
