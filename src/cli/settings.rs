//! The cross-field checks of what the user typed, in one place and before
//! anything starts (ripgrep's low/high args split): clap checks each value on
//! its own; what depends on several options, on the plan or on the files
//! named is checked here, so a mistake never shows up after minutes of tuning
//! or half a launch.

use std::path::PathBuf;

use super::Failure;
use super::args::{PlanArgs, RunCmd, SourceArgs, TuneCmd};
use crate::files::check_output;
use crate::plan::PlanRequest;
use crate::topology::probe::{self, Source};
use crate::topology::{Topology, TopologyError};

/// A topology that cannot be had: exit 2 when it is a value typed on the
/// command line (`--synthetic`), 3 when it is what was read from the machine
/// or a dump of one (its `Hinted::kind`).
pub(super) fn topology_failure(e: TopologyError) -> Failure {
    e.into()
}

/// Where the options say the topology comes from.
pub(super) fn source(a: &SourceArgs) -> Source {
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
pub(super) fn load(a: &SourceArgs) -> Result<Topology, Failure> {
    probe::topology(&source(a)).map_err(topology_failure)
}

/// The machine `run`, `bind` or `tune` plans on: this one, or with
/// `--dry-run` the one `--root`, `--topology` or `--synthetic` names (a
/// preview: what the command would do there). Without `--dry-run` such a
/// machine is refused, since ranks can only start here.
pub(super) fn load_for(a: &SourceArgs, dry_run: bool) -> Result<Topology, Failure> {
    let given = [
        a.root.as_ref().map(|_| "--root"),
        a.topology.as_ref().map(|_| "--topology"),
        a.synthetic.as_ref().map(|_| "--synthetic"),
    ];
    if let (Some(flag), false) = (given.into_iter().flatten().next(), dry_run) {
        return Err(Failure::usage(
            format!("{flag} without --dry-run: ranks can only start on this machine"),
            format!(
                "add --dry-run to preview the command on the machine {flag} names, or drop {flag}"
            ),
        ));
    }
    load(a)
}

/// The plain request the options describe.
pub(super) fn request(a: &PlanArgs) -> PlanRequest {
    PlanRequest {
        nproc: a.nproc,
        gpus: a.gpus.clone(),
        policy: a.policy,
        // One rank per CPU needs the SMT siblings as CPUs of their own.
        smt: a.smt || a.nproc == crate::plan::NProc::Cpu,
        threads: a.threads,
        workers: a.workers,
        mem: a.mem,
        allocator: a.allocator,
        profile: a.profile,
        amp: a.amp,
        // The seed formulas' world: the most nodes the job may have.
        nnodes: a.nnodes.max,
        oversubscribe: a.oversubscribe,
        omp_bind: a.omp_bind,
        omp_wait: a.omp_wait,
        reserve: a.reserve.clone(),
        roles: a.roles,
        unset_threads: false,
    }
}

/// `run` before planning: a multi-node job needs its rendezvous endpoint
/// (given, or torchrun's static shape's).
pub(super) fn check_run(
    a: &RunCmd,
    endpoint: Option<&crate::netif::Endpoint>,
) -> Result<(), Failure> {
    if a.plan.nnodes.max > 1 && endpoint.is_none() {
        return Err(Failure::usage(
            format!("--nnodes {} needs --rdzv-endpoint HOST:PORT", a.plan.nnodes),
            "every node gives the same endpoint, e.g. --rdzv-endpoint node0:29400",
        ));
    }
    if let (true, Some(r)) = (a.plan.nnodes.elastic(), a.node_rank) {
        return Err(Failure::usage(
            format!(
                "--node-rank {r} with --nnodes {}: an elastic job's node ranks change as nodes \
                 come and go",
                a.plan.nnodes
            ),
            "drop --node-rank: the rendezvous numbers the nodes each round (its host's node first)",
        ));
    }
    Ok(())
}

/// `run` once the plan is known: the filter names ranks that exist.
pub(super) fn check_run_plan(a: &RunCmd, nproc: usize) -> Result<(), Failure> {
    if let Some(f) = &a.local_ranks_filter
        && let Some(bad) = f.iter().find(|r| **r >= nproc)
    {
        return Err(Failure::usage(
            format!(
                "--local-ranks-filter names rank {bad}, but there are {nproc} ranks (0-{})",
                nproc - 1
            ),
            "list local ranks below --nproc-per-node",
        ));
    }
    Ok(())
}

/// `tune`: every file it will write can be written, and the built-in
/// workload's sizes fit, before the first trial.
pub(super) fn check_tune(a: &TuneCmd) -> Result<(), Failure> {
    if a.plan.nnodes.elastic() {
        return Err(Failure::usage(
            format!(
                "tune --nnodes {}: tune measures every configuration on the same nodes",
                a.plan.nnodes
            ),
            format!(
                "give one number of nodes (--nnodes {}), as many as the allocation has",
                a.plan.nnodes.max
            ),
        ));
    }
    if a.command.is_empty()
        && let Some(mib) =
            crate::workload::activations_too_big(a.work_size, a.work_batch, a.work_layers)
    {
        return Err(Failure::usage(
            format!(
                "--work-size {} --work-batch {} --work-layers {} would hold {mib} MiB of \
                 activations per rank (at most {} MiB)",
                a.work_size,
                a.work_batch,
                a.work_layers,
                crate::workload::MAX_BYTES >> 20
            ),
            "make them smaller",
        ));
    }
    let files: [(&str, &Option<PathBuf>); 5] = [
        ("--export-json", &a.export_json),
        ("--export-csv", &a.export_csv),
        ("--export-markdown", &a.export_markdown),
        ("--export-svg", &a.export_svg),
        ("--save-plan", &a.save_plan),
    ];
    let mut seen: Vec<&PathBuf> = vec![];
    for (flag, path) in files {
        let Some(path) = path else { continue };
        check_output(path).map_err(|e| Failure::usage(format!("{flag}: {e}"), e.advice()))?;
        if seen.contains(&path) {
            return Err(Failure::usage(
                format!("{flag} {}: another option writes there too", path.display()),
                "give each report its own file",
            ));
        }
        seen.push(path);
    }
    Ok(())
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
            (any::<[bool; 5]>(), 1usize..8),
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
                        roles: b[4],
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
