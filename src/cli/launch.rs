//! `threadwise run` and `threadwise bind`: the options into a launch
//! (`launch::prepare` does the work), then supervise (run) or exec (bind).

use super::args::{BindCmd, RunCmd};
use super::topo::{load, request};
use super::{Exit, Failure, SourceArgs, settings};
use crate::launch::output::OutputOptions;
use crate::launch::prepare::{self, ErrorFiles, PrepareError};
use crate::launch::supervise::{self, RunOptions};
use crate::launch::{LaunchError, RankLaunch, bind, node_launches, resolve};
use crate::plan::{self, Plan};
use crate::topology::Topology;

impl From<LaunchError> for Failure {
    fn from(e: LaunchError) -> Self {
        Failure {
            code: e.code(),
            message: e.to_string(),
            hint: Some(e.hint().to_string()),
        }
    }
}

impl From<PrepareError> for Failure {
    fn from(e: PrepareError) -> Self {
        Failure {
            code: e.code(),
            message: e.to_string(),
            hint: Some(e.hint()),
        }
    }
}

fn current(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// What the user sees at the end, and our exit code.
pub(super) fn finish_run(
    a: &RunCmd,
    outcome: &supervise::Outcome,
    errors: &ErrorFiles,
) -> Result<Exit, Failure> {
    if !a.quiet {
        crate::say_text!(supervise::summary(outcome));
    }
    if let Some(report) = supervise::failure_report(outcome, Some(&errors.dir)) {
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
    Ok(match outcome.code() {
        0 if !outcome.log_errors.is_empty() => Exit(3),
        code => Exit(code),
    })
}

pub fn run(a: RunCmd) -> Result<Exit, Failure> {
    let Some(program) = a.command.first() else {
        return Err(LaunchError::NoCommand.into());
    };
    let program = resolve(program)?;
    settings::check_run(&a)?;
    let req = request(&a.plan);
    let t = load(&SourceArgs::default())?;
    let p = match &a.plan_file {
        Some(path) => prepare::saved_plan(path, &t)?,
        None => plan::plan(&t, &req, &prepare::facts(&req))?,
    };
    settings::check_run_plan(&a, p.nproc)?;
    if a.plan.nnodes > 1 || a.rdzv_endpoint.is_some() {
        return super::nodes::run(&a, &p, &t, program);
    }
    let mut launches = node_launches(&p, &a.command, &a.master_addr, a.master_port)?;
    if a.dry_run {
        let contain = crate::launch::contain::JobCgroup::probe();
        let shown = prepare::dry_run(&p, &launches, !a.no_move_workers, &current);
        return super::emit(&format!("{shown}containment: {contain}\n"));
    }
    before_start(&a, &p, &t, &launches);
    if let Some(w) = prepare::check_bindings(&mut launches, a.allow_unbound)? {
        crate::say!("threadwise: warning: {w}");
    }
    let errors = ErrorFiles::new(a.log_dir.as_deref())?;
    let outcome = supervise_ranks(&a, &p, &t, launches, &program, &errors, None, 0)?;
    finish_run(&a, &outcome, &errors)
}

/// What `run` says before starting: replaced variables, doctor's preflight,
/// a log directory that will not hold.
pub(super) fn before_start(a: &RunCmd, p: &Plan, t: &Topology, launches: &[RankLaunch]) {
    if let Some(note) = launches
        .first()
        .and_then(|l| prepare::overrides_note(l, &current))
    {
        crate::say!("threadwise: {note}");
    }
    if !a.no_doctor {
        super::doctor::preflight(t, p.nproc);
    }
    if let Some(w) = a.log_dir.as_deref().and_then(settings::log_dir_warning) {
        crate::say!("threadwise: warning: {w}");
    }
}

/// Start this node's ranks and supervise them to the end; `errors` holds
/// their error files (and `errors.dir` is the log directory, if any).
#[allow(clippy::too_many_arguments)]
pub(super) fn supervise_ranks(
    a: &RunCmd,
    p: &Plan,
    t: &Topology,
    mut launches: Vec<RankLaunch>,
    program: &std::path::Path,
    errors: &ErrorFiles,
    peer: Option<std::sync::Arc<dyn supervise::Peer>>,
    rank_base: usize,
) -> Result<supervise::Outcome, LaunchError> {
    errors.assign(&mut launches);
    for l in &mut launches {
        l.program = Some(program.to_path_buf());
    }
    let watch = std::sync::Arc::new(crate::top::watch::RunWatch::default());
    let shown: Vec<String> = a
        .command
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let log_dir = errors.logs().map(std::path::Path::to_path_buf);
    let opts = RunOptions {
        grace: a.grace,
        output: OutputOptions {
            rank_base,
            prefix: !a.no_prefix,
            // The live view takes the terminal; the output still goes to the logs.
            show: if a.top {
                Some(vec![])
            } else {
                a.local_ranks_filter.clone()
            },
            sink: None,
        },
        timeout: None,
        move_workers: !a.no_move_workers,
        on_spawned: Some(watch.hook(
            p,
            t,
            shown,
            log_dir.as_ref().map(|d| d.display().to_string()),
            a.top,
        )),
        log_dir,
        peer,
    };
    let outcome = supervise::run(&launches, &opts);
    watch.finish();
    outcome
}

pub fn bind_cmd(a: BindCmd) -> Result<Exit, Failure> {
    if a.command.is_empty() {
        return Err(LaunchError::NoCommand.into());
    }
    let t = load(&SourceArgs::default())?;
    let (p, l) = prepare::bind_launch(t, request(&a.plan), &a.command, &current)?;
    // Said once per job (by task 0), not once per task.
    let derived: Vec<String> = ["MASTER_ADDR", "MASTER_PORT"]
        .iter()
        .filter(|k| current(k).is_none())
        .filter_map(|k| Some(format!("{k}={}", l.env.get(*k)?)))
        .collect();
    if !derived.is_empty() && !a.dry_run && current("SLURM_PROCID").as_deref() == Some("0") {
        crate::say!(
            "threadwise: {} (unset: from the step's first node and 15000 + the job id's last 4 digits, as Lightning does)",
            derived.join(" ")
        );
    }
    if a.dry_run {
        let one = Plan {
            nproc: 1,
            ..p.clone()
        };
        return super::emit(&prepare::dry_run(&one, &[l], false, &current));
    }
    Err(bind::exec_rank(&l, a.allow_unbound).into())
}
