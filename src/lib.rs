//! threadwise: topology-aware placement of multi-process training ranks.
//!
//! Data flow, in the order the modules are declared below: probe ->
//! `Topology` -> pure `plan()` -> `Plan` -> export / launch (run, bind) ->
//! tune, doctor, top -> the command line. Everything that touches the OS
//! (sysfs, /proc, cgroups, syscalls, clocks, child processes, NVML) sits at
//! the edges: `topology`'s probe, `measure`, `launch`.
//!
//! Every module is private and its items `pub(crate)` by default
//! (`unreachable_pub` is denied): the public surface is what is re-exported
//! at the end of this file, for the `threadwise` and `threadwise-workload`
//! binaries and the benches. The Python wheel ships the binaries and talks to
//! them, never to this library.
#![warn(unreachable_pub)]
// Every unsafe operation sits in an `unsafe {}` block with its SAFETY
// comment, inside `unsafe fn`s too; forks live in `proc::vm`.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

// Shared pieces every layer uses.
mod cpuset;
mod error;
mod files;
mod names;
mod netif;
mod nvml;
mod os;

// probe -> Topology
mod host;
mod topology;
// -> plan() -> Plan (and the roles of a rank's threads)
mod plan;
mod roles;
// -> export
mod export;
mod picture;
// -> the process edge (births, containment, signals, moving workers: every
// `unsafe` of launching), one node's supervision, the rendezvous above it,
// the one entry point of a job (one node or many), ranks other launchers start
mod adopt;
mod job;
mod launch;
mod measure;
mod proc;
mod rdzv;
// -> tune, doctor, top
mod doctor;
mod top;
mod tune;
// The built-in workload's kernels (the threadwise-workload binary).
pub mod workload;
// -> the command line
mod cli;

// The public surface.

/// The `threadwise` command line: parse the process's arguments, run, and
/// return the exit code.
pub fn run_cli() -> i32 {
    cli::main()
}

/// The line a client prints for tune to read its throughput exactly
/// (`threadwise: throughput=<N> <unit>`), for the built-in workload.
pub use measure::rates::CANONICAL as THROUGHPUT_LINE;
/// The line a client prints for tune to keep a figure beside its throughput
/// (`threadwise: figure <name>=<N>`).
pub use measure::rates::FIGURE as FIGURE_LINE;

/// Planning, for the benches: a topology from sysfs or a synthetic
/// description, a request, the plan.
pub use cpuset::CpuSet;
pub use plan::plan as plan_ranks;
pub use plan::{Facts, GpuSelect, NProc, Plan, PlanRequest};
pub use topology::Topology;
pub use topology::synthetic::parse as synthetic_topology;
pub use topology::sysfs::probe as probe_sysfs;

/// `top`'s sampler, for its bench.
pub use top::{Sampler, Target};
