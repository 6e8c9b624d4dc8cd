//! One node's ranks, started and supervised to their end, alike for a
//! one-node job (`job`) and each round of one node of many
//! (`cluster::rounds`): what is said before they start, their error files,
//! the watcher, the output options.

use std::path::Path;
use std::sync::Arc;

use super::env::current;
use super::output::{LineSink, OutputOptions};
use super::prepare::{self, ErrorFiles};
use super::settings::RunSettings;
use super::supervise::{self, Peer, RunOptions};
use super::{LaunchError, RankLaunch};

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

/// Start this node's ranks and supervise them to the end; `errors` holds
/// their error files (and `errors.dir` is the log directory, if any).
pub(crate) fn supervise_node(
    s: &RunSettings,
    mut launches: Vec<RankLaunch>,
    errors: &ErrorFiles,
    peer: Option<Arc<dyn Peer>>,
    rank_base: usize,
    sink: Option<LineSink>,
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
