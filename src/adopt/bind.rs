//! `bind`: become one rank. Apply this rank's CPU affinity and memory policy to
//! ourselves, set its environment, and exec the command in our place, so the
//! launcher's signals and exit codes reach the command untouched.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use crate::launch::{LaunchError, RankLaunch, resolve};

/// Apply the rank's placement and exec; returns only on failure.
pub(crate) fn exec_rank(
    r: &RankLaunch,
    allow_unbound: bool,
    hold: crate::proc::hold::Hold,
) -> LaunchError {
    let Some(program) = r.argv.first() else {
        return LaunchError::NoCommand;
    };
    if let Err(e) = resolve(program) {
        return e;
    }
    let mut placement = r.placement.clone();
    let mut applied = placement.apply();
    // The local policy only restates the kernel's default: where the kernel
    // refuses it (seccomp, no NUMA), go on without it, as `run` does.
    if let Err(("set_mempolicy", source)) = &applied
        && placement.asks_local()
    {
        crate::say!(
            "threadwise: warning: rank {}: {}",
            r.local_rank,
            crate::launch::prepare::local_refused(source)
        );
        placement.mem = None;
        applied = placement.apply();
    }
    let placed = applied.is_ok();
    if let Err((what, source)) = applied {
        if !allow_unbound {
            return LaunchError::Placement {
                rank: r.local_rank,
                what,
                cpus: r.cpus.clone(),
                mem: r.mem.clone(),
                source,
            };
        }
        crate::say!(
            "threadwise: warning: rank {} runs unbound ({what} refused: {source})",
            r.local_rank
        );
    }
    // Placed: a holder keeps the threads there (a bound rank only).
    if let Some(spec) = r.hold.as_ref().filter(|_| placed) {
        // Under --roles its DataLoader workers too: forked by the main
        // thread, they would inherit the service core. Otherwise they keep
        // the rank's CPUs as before (a shell rank's `$(...)` is a fork of the
        // shell until it execs, and would be moved as a worker).
        let workers = r
            .worker_mask
            .clone()
            .filter(|_| spec.roles.is_some())
            .map(crate::cpuset::CpuSet::from_words);
        if let Err(e) = super::holder::start(r.local_rank, spec, workers.as_ref(), hold) {
            crate::say!(
                "threadwise: warning: rank {}: its threads are placed but not held \
                 (the holder did not start: {e})",
                r.local_rank
            );
        }
    }
    let err = std::process::Command::new(program)
        .args(&r.argv[1..])
        .envs(&r.env)
        .exec();
    LaunchError::Exec {
        program: OsString::from(program).to_string_lossy().into_owned(),
        source: err,
    }
}
