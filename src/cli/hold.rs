//! `--hold` (run and bind) and bind's hidden holder, `__hold`
//! (`adopt::holder`).

use clap::Args;

use super::values::parse_cpus;
use crate::cpuset::CpuSet;
use crate::proc::hold::Hold;

/// `--hold`, shared by run and bind.
#[derive(Args, Debug, Clone)]
pub(crate) struct HoldArg {
    /// Put back a rank's threads that a library moves off its CPUs, each at most 3 times, then
    /// leave a thread that keeps leaving (said once); with --roles, place each thread by its
    /// role; always: keep putting it back; off: only watch and say (docs/how-it-works.md)
    #[arg(hide_short_help = true, long, value_enum, default_value_t = Hold::On, help_heading = "Launch")]
    pub hold: Hold,
}

/// `threadwise __hold PID LOCAL_RANK CPUS [--service=S --team=T] [--workers=W] [--binds]
/// [--hold=MODE]`,
/// as `adopt::holder::args` writes it.
#[derive(Args, Debug)]
pub(crate) struct HoldCmd {
    pid: i32,
    local_rank: usize,
    #[arg(value_parser = parse_cpus)]
    cpus: CpuSet,
    #[arg(long, value_parser = parse_cpus, requires = "team")]
    service: Option<CpuSet>,
    #[arg(long, value_parser = parse_cpus, requires = "service")]
    team: Option<CpuSet>,
    #[arg(long, value_parser = parse_cpus)]
    workers: Option<CpuSet>,
    /// The rank's OpenMP runtime binds its threads (its environment says so).
    #[arg(long)]
    binds: bool,
    #[arg(long, value_enum, default_value_t = Hold::On)]
    hold: Hold,
}

pub(super) fn hold_cmd(a: HoldCmd) -> i32 {
    let roles = a
        .service
        .zip(a.team)
        .map(|(service, team)| crate::roles::RoleCpus { service, team });
    let spec = crate::proc::hold::HoldSpec {
        cpus: a.cpus,
        roles,
        runtime_binds: a.binds,
    };
    crate::adopt::holder::hold_main(a.pid, a.local_rank, spec, a.workers, a.hold)
}
