//! threadwise: topology-aware placement of multi-process training ranks.
//! Data flow: probe -> Topology -> pure plan() -> Plan -> export/run/bind/tune.

mod cli;
pub mod cpuset;
pub mod doctor;
pub mod export;
pub mod files;
pub mod host;
pub mod launch;
pub mod measure;
mod names;
pub mod nvml;
pub mod os;
pub mod picture;
pub mod plan;
pub mod top;
pub mod topology;
pub mod tune;
pub mod workload;

/// The `threadwise` command line: parse the process's arguments, run, and
/// return the exit code. The command line itself (`cli`) is not public API.
pub fn run_cli() -> i32 {
    cli::main()
}
