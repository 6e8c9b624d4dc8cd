//! `run`'s one entry point: a typed `RunSettings`, built once by the command
//! line, runs a job on one node or as one node of many (`cluster::node`).
//! Everything a launch says on stderr (the replaced variables, doctor's
//! preflight, the per-rank summary, the failing rank's report) is said here,
//! alike on both paths; the command line maps the result to an exit code.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::cluster::{AgentConfig, ClusterError};
use super::output::OutputOptions;
use super::prepare::{self, ErrorFiles, PrepareError};
use super::report;
use super::supervise::{self, Peer, RunOptions, Spawned};
use super::{LaunchError, RankLaunch, node_launches};
use crate::plan::Plan;
use crate::topology::Topology;

/// Who watches a node's ranks while they run (`top`'s state file and `run
/// --top`'s live view): the command line gives it, launching knows no more.
pub(crate) trait Watcher: Send + Sync {
    /// For one round: the hook `supervise` calls with the ranks' pids, and
    /// what to call once they all ended.
    fn round(&self, s: &RunSettings, log_dir: Option<&Path>)
    -> (Spawned, Box<dyn FnOnce() + Send>);
}

/// What `run` was asked to do, checked and resolved: the plan is made, the
/// program found.
pub(crate) struct RunSettings {
    /// The command each rank runs, as typed (argv[0] as given).
    pub command: Vec<OsString>,
    /// argv[0] resolved on PATH.
    pub program: PathBuf,
    pub plan: Plan,
    pub topology: Topology,
    pub master_addr: String,
    pub master_port: Option<u16>,
    pub grace: Duration,
    pub prefix: bool,
    /// Show only these local ranks' output (`--local-ranks-filter`; none
    /// under `run --top`, whose view takes the terminal).
    pub show: Option<Vec<usize>>,
    pub move_workers: bool,
    pub log_dir: Option<PathBuf>,
    pub allow_unbound: bool,
    pub watcher: Option<Box<dyn Watcher>>,
    /// No per-rank summary at the end.
    pub quiet: bool,
    /// One node of many: the rendezvous to join.
    pub cluster: Option<ClusterSettings>,
}

/// One node of a multi-node job.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSettings {
    pub agent: AgentConfig,
    /// Report this node's use to the rendezvous after each round, with global
    /// rank 0's throughput read by this metric (tune --nnodes).
    pub report: Option<crate::measure::throughput::Metric>,
}

/// Why a job could not run (its ranks' own failures are exit codes, not these).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl JobError {
    pub(crate) fn code(&self) -> i32 {
        match self {
            JobError::Launch(e) => e.code(),
            JobError::Prepare(e) => e.code(),
            JobError::Cluster(e) => e.code(),
        }
    }

    /// What to do about it (empty when nothing is to be done).
    pub(crate) fn hint(&self) -> String {
        match self {
            JobError::Launch(e) => e.hint().into(),
            JobError::Prepare(e) => e.hint(),
            JobError::Cluster(e) => e.hint(),
        }
    }
}

fn current(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// What each rank would get, and the containment (`--dry-run`), on one node
/// or as one node of many.
pub(crate) fn dry_run(s: &RunSettings) -> Result<String, JobError> {
    if let Some(c) = &s.cluster {
        return Ok(super::cluster::rounds::dry_run(s, &c.agent));
    }
    let launches = node_launches(&s.plan, &s.command, &s.master_addr, s.master_port)?;
    let contain = super::contain::JobCgroup::probe();
    let shown = prepare::dry_run(&s.plan, &launches, s.move_workers, &current);
    Ok(format!("{shown}containment: {contain}\n"))
}

/// Run the job to its end and return its exit code: 0, the first failing
/// rank's own (128+N for a signal), 3 when a log was lost.
pub(crate) fn run(s: &RunSettings) -> Result<i32, JobError> {
    if let Some(c) = &s.cluster {
        return super::cluster::rounds::run(s, c);
    }
    let mut launches = node_launches(&s.plan, &s.command, &s.master_addr, s.master_port)?;
    before_start(s, &launches);
    if let Some(w) = prepare::check_bindings(&mut launches, s.allow_unbound)? {
        crate::say!("threadwise: warning: {w}");
    }
    let errors = ErrorFiles::new(s.log_dir.as_deref())?;
    let outcome = supervise_node(s, launches, &errors, None, 0, None)?;
    Ok(finish(s, &outcome, &errors))
}

/// What `run` says before starting: replaced variables, a log directory
/// that will not hold.
pub(crate) fn before_start(s: &RunSettings, launches: &[RankLaunch]) {
    if let Some(note) = launches
        .first()
        .and_then(|l| prepare::overrides_note(l, &current))
    {
        crate::say!("threadwise: {note}");
    }
    if let Some(w) = s.log_dir.as_deref().and_then(log_dir_warning) {
        crate::say!("threadwise: warning: {w}");
    }
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
            super::output::MAX_LINE >> 20
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

/// Start this node's ranks and supervise them to the end; `errors` holds
/// their error files (and `errors.dir` is the log directory, if any).
pub(crate) fn supervise_node(
    s: &RunSettings,
    mut launches: Vec<RankLaunch>,
    errors: &ErrorFiles,
    peer: Option<Arc<dyn Peer>>,
    rank_base: usize,
    sink: Option<super::output::LineSink>,
) -> Result<supervise::Outcome, LaunchError> {
    errors.assign(&mut launches);
    for l in &mut launches {
        l.program = Some(s.program.clone());
    }
    let log_dir = errors.logs().map(Path::to_path_buf);
    let (on_spawned, finish) = match &s.watcher {
        Some(w) => {
            let (hook, finish) = w.round(s, log_dir.as_deref());
            (Some(hook), Some(finish))
        }
        None => (None, None),
    };
    let opts = RunOptions {
        grace: s.grace,
        output: OutputOptions {
            rank_base,
            prefix: s.prefix,
            show: s.show.clone(),
            sink,
        },
        timeout: None,
        move_workers: s.move_workers,
        on_spawned,
        log_dir,
        peer,
    };
    let outcome = supervise::run(&launches, &opts);
    if let Some(f) = finish {
        f();
    }
    outcome
}

/// A warning when others may write in the log directory: they could plant
/// files where rank logs go (links are never followed, but a file of theirs
/// would be overwritten by root).
pub(crate) fn log_dir_warning(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    // SAFETY: plain syscall.
    let me = unsafe { libc::geteuid() };
    if m.mode() & 0o002 != 0 {
        Some(format!(
            "--log-dir {}: other users may write in it (mode {:o}); give a directory of your own",
            dir.display(),
            m.mode() & 0o7777
        ))
    } else if m.uid() != me && m.uid() != 0 {
        Some(format!(
            "--log-dir {}: owned by uid {}, not by you (uid {me}); its owner controls the files",
            dir.display(),
            m.uid()
        ))
    } else {
        None
    }
}
