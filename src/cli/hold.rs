//! `--hold` (run and bind) and bind's hidden holder, `__hold`
//! (`adopt::holder`).

use clap::Args;

use super::values::parse_cpus;
use crate::cpuset::CpuSet;
use crate::proc::hold::Hold;

/// `--hold`, shared by run and bind.
#[derive(Args, Debug, Clone)]
pub(crate) struct HoldArg {
    /// Put back a rank's threads that a library moves off its CPUs (with --roles, place each
    /// thread by its role); off: only watch and say (docs/how-it-works.md)
    #[arg(hide_short_help = true, long, value_enum, default_value_t = Hold::On, help_heading = "Launch")]
    pub hold: Hold,
}

impl HoldArg {
    pub(crate) fn on(&self) -> bool {
        self.hold == Hold::On
    }
}

/// `threadwise __hold PID LOCAL_RANK CPUS [--service=S --team=T] [--workers=W] [--off]`,
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
    #[arg(long)]
    off: bool,
}

pub(super) fn hold_cmd(a: HoldCmd) -> i32 {
    let roles = a
        .service
        .zip(a.team)
        .map(|(service, team)| crate::roles::RoleCpus { service, team });
    crate::adopt::holder::hold_main(a.pid, a.local_rank, a.cpus, roles, a.workers, !a.off)
}
