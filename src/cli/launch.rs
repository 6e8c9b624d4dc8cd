//! `threadwise run` and `threadwise bind`: the options into a launch
//! (`launch::prepare` does the work), then supervise (run) or exec (bind).

use std::os::unix::process::CommandExt;

use super::args::{BindCmd, RunCmd};
use super::topo::{load, request};
use super::{Exit, Failure, SourceArgs, settings};
use crate::export::quote_all;
use crate::launch::output::OutputOptions;
use crate::launch::prepare::{self, ErrorFiles, MultiNode, PrepareError};
use crate::launch::supervise::{self, RunOptions};
use crate::launch::{LaunchError, bind, node_launches, resolve};
use crate::plan::{self, Plan};

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
fn finish_run(
    a: &RunCmd,
    outcome: &supervise::Outcome,
    errors: &std::path::Path,
) -> Result<Exit, Failure> {
    if !a.quiet {
        crate::say_text!(supervise::summary(outcome));
    }
    if let Some(report) = supervise::failure_report(outcome, Some(errors)) {
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
    if let Some(dir) = &a.log_dir {
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
    if a.plan.nnodes > 1 || a.rdzv_endpoint.is_some() {
        return multi_node(&a, &p);
    }
    settings::check_run_plan(&a, p.nproc)?;
    let mut launches = node_launches(&p, &a.command, &a.master_addr, a.master_port)?;
    if a.dry_run {
        let contain = crate::launch::contain::JobCgroup::probe();
        let shown = prepare::dry_run(&p, &launches, !a.no_move_workers, &current);
        return super::emit(&format!("{shown}containment: {contain}\n"));
    }
    if let Some(note) = launches
        .first()
        .and_then(|l| prepare::overrides_note(l, &current))
    {
        crate::say!("threadwise: {note}");
    }
    if !a.no_doctor {
        super::doctor::preflight(&t, p.nproc);
    }
    if let Some(w) = prepare::check_bindings(&mut launches, a.allow_unbound)? {
        crate::say!("threadwise: warning: {w}");
    }
    let errors = ErrorFiles::new(a.log_dir.as_deref())?;
    errors.assign(&mut launches);
    for l in &mut launches {
        l.program = Some(program.clone());
    }
    let watch = std::sync::Arc::new(crate::top::watch::RunWatch::default());
    let shown: Vec<String> = a
        .command
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let opts = RunOptions {
        grace: a.grace,
        output: OutputOptions {
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
        log_dir: a.log_dir.clone(),
        on_spawned: Some(watch.hook(
            &p,
            &t,
            shown,
            a.log_dir.as_ref().map(|d| d.display().to_string()),
            a.top,
        )),
    };
    if let Some(w) = a.log_dir.as_deref().and_then(settings::log_dir_warning) {
        crate::say!("threadwise: warning: {w}");
    }
    let outcome = supervise::run(&launches, &opts);
    watch.finish();
    finish_run(&a, &outcome?, &errors.dir)
}

/// Hand the job to torchrun's elastic agent; each rank runs `threadwise bind`.
fn multi_node(a: &RunCmd, p: &Plan) -> Result<Exit, Failure> {
    let m = MultiNode {
        torchrun: a.torchrun.clone(),
        nnodes: a.plan.nnodes as usize,
        rdzv_backend: a.rdzv_backend.clone(),
        // settings::check_run made sure a multi-node job has its endpoint.
        rdzv_endpoint: a.rdzv_endpoint.clone().unwrap_or_default(),
        rdzv_id: a.rdzv_id.clone(),
        max_restarts: a.max_restarts,
        node_rank: a.node_rank,
        allow_unbound: a.allow_unbound,
    };
    let (torchrun, args) = prepare::torchrun_command(&m, p, &a.command)?;
    if a.dry_run {
        let words: Vec<String> = std::iter::once(torchrun.display().to_string())
            .chain(args.iter().map(|x| x.to_string_lossy().into_owned()))
            .collect();
        return super::emit(&(quote_all(&words) + "\n"));
    }
    let err = std::process::Command::new(&torchrun).args(&args).exec();
    Err(Failure::env(
        format!("cannot exec {}: {err}", torchrun.display()),
        "check the torchrun installation",
    ))
}

pub fn bind_cmd(a: BindCmd) -> Result<Exit, Failure> {
    if a.command.is_empty() {
        return Err(LaunchError::NoCommand.into());
    }
    let t = load(&SourceArgs::default())?;
    let (p, l) = prepare::bind_launch(t, request(&a.plan), &a.command, &current)?;
    if a.dry_run {
        let one = Plan {
            nproc: 1,
            ..p.clone()
        };
        return super::emit(&prepare::dry_run(&one, &[l], false, &current));
    }
    Err(bind::exec_rank(&l, a.allow_unbound).into())
}
