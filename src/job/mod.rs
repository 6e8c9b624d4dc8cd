//! The one entry point of a job on this node: `run` takes the typed settings
//! (`settings`) and runs the job's rounds (`rounds`), one node's ranks
//! supervised in each (`node`). A job of one node is a job of one node: the
//! same rounds decided by the same coordinator, in the process
//! (`rdzv::local`), so `--max-restarts`, TORCHELASTIC_RESTART_COUNT, the root
//! cause, the summary and the exit code mean the same on one node and on
//! many. Everything is said through a reporter's events (`events`); the
//! command line maps the result to an exit code. `trial` is the entry point
//! of tune's runners: ranks started and watched to their end, nothing said.

pub(crate) mod events;
pub(crate) mod node;
pub(crate) mod rounds;
pub(crate) mod settings;
pub(crate) mod trial;

#[cfg(test)]
pub(crate) use crate::launch::supervise::RankResult;
pub(crate) use crate::launch::supervise::{Exit, Outcome};
pub(crate) use events::{Event, Level, Reporter};

use crate::launch::env::{self, current};
use crate::launch::{LaunchError, plan_launches, prepare};
use settings::{JobError, RunSettings};

/// What each rank would get, and the containment (`--dry-run`), on one node
/// or as one node of many.
pub(crate) fn dry_run(s: &RunSettings) -> Result<String, JobError> {
    crate::launch::threads_work()?;
    if let Some(c) = &s.cluster {
        return Ok(rounds::dry_run(s, &c.agent));
    }
    let port = match s.master_port {
        Some(p) => p,
        None => env::free_port().map_err(LaunchError::Port)?,
    };
    let job = env::Job {
        role: s.role.clone(),
        max_restarts: s.max_restarts,
        ..env::Job::single(s.plan.nproc, &s.master_addr, port, env::run_id())
    };
    let mut launches = plan_launches(&s.plan, &s.command, &job);
    s.torchrun.set_env(&mut launches);
    let contain = crate::proc::contain::JobCgroup::probe();
    let shown = prepare::dry_run(&s.plan, &launches, s.move_workers, &current);
    Ok(format!("{shown}containment: {contain}\n"))
}

/// Run the job to its end, saying what happens through `r`, and return its
/// exit code: 0, the first failing rank's own (128+N for a signal), 3 when a
/// log was lost.
pub(crate) fn run(s: &RunSettings, r: events::Shared) -> Result<i32, JobError> {
    // No thread of the rendezvous starts before the ranks' bindings are
    // tried (`prepare::check_bindings`), whose helper thread is the first:
    // where none can start, that is where it is said.
    rounds::run(s, r)
}
