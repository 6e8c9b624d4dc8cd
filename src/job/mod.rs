//! `run`'s one entry point: the typed settings (`settings`) run a job on one
//! node, or as one node of many (`cluster::rounds`). Everything a launch
//! says on stderr (the replaced variables, the per-rank summary, the
//! failing rank's report) is said on these paths, alike on both; the
//! command line maps the result to an exit code.

pub(crate) mod node;
pub(crate) mod rounds;
pub(crate) mod settings;

use crate::launch::env::current;
use crate::launch::prepare::{self, ErrorFiles};
use crate::launch::{node_launches, report, supervise};
use node::{before_start, supervise_node};
use settings::{JobError, RunSettings};

/// What each rank would get, and the containment (`--dry-run`), on one node
/// or as one node of many.
pub(crate) fn dry_run(s: &RunSettings) -> Result<String, JobError> {
    crate::launch::threads_work()?;
    if let Some(c) = &s.cluster {
        return Ok(rounds::dry_run(s, &c.agent));
    }
    let mut launches = node_launches(&s.plan, &s.command, &s.master_addr, s.master_port, &s.role)?;
    s.torchrun.set_env(&mut launches);
    let contain = crate::proc::contain::JobCgroup::probe();
    let shown = prepare::dry_run(&s.plan, &launches, s.move_workers, &current);
    Ok(format!("{shown}containment: {contain}\n"))
}

/// Run the job to its end and return its exit code: 0, the first failing
/// rank's own (128+N for a signal), 3 when a log was lost.
pub(crate) fn run(s: &RunSettings) -> Result<i32, JobError> {
    if let Some(c) = &s.cluster {
        crate::launch::threads_work()?;
        return rounds::run(s, c);
    }
    let mut launches = node_launches(&s.plan, &s.command, &s.master_addr, s.master_port, &s.role)?;
    s.torchrun.set_env(&mut launches);
    before_start(s, &launches);
    if let (_, Some(w)) = prepare::check_bindings(&mut launches, s.allow_unbound)? {
        crate::say!("threadwise: warning: {w}");
    }
    if !s.quiet {
        crate::say!(
            "threadwise: {}",
            crate::launch::report::placement_line(&launches, 0)
        );
    }
    let errors = ErrorFiles::new(s.log_dir.as_deref())?;
    let outcome = supervise_node(s, launches, &errors, None, 0, None)?;
    Ok(finish(s, &outcome, &errors))
}

/// What the user sees at the end of a one-node job, and its exit code.
fn finish(s: &RunSettings, outcome: &supervise::Outcome, errors: &ErrorFiles) -> i32 {
    if !s.quiet {
        crate::say_text!(report::summary(outcome));
    }
    if let Some(report) = report::failure_report(outcome, Some(&errors.dir)) {
        crate::say_text!(report);
    } else if let Some(sig) = outcome.signal {
        crate::say!("threadwise: stopped by {}", crate::os::signal_name(sig));
    }
    if outcome.split_lines {
        crate::say!(
            "threadwise: a line longer than {} MiB was shown in pieces (the log files keep it whole)",
            crate::launch::output::MAX_LINE >> 20
        );
    }
    if let Some(dir) = errors.logs() {
        crate::say!("threadwise: logs in {}", dir.display());
    }
    for (file, why) in &outcome.log_errors {
        crate::say!("threadwise: error: the log {file} is incomplete: {why}");
    }
    // Ranks that succeeded with logs lost still make a failed run: exit 3.
    match outcome.code() {
        0 if !outcome.log_errors.is_empty() => 3,
        code => code,
    }
}
