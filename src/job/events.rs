//! What a job says as it goes, typed (nextest's runner -> `TestEvent` ->
//! reporter is the model): the job's entry points emit these and print
//! nothing themselves; reporters draw them. The command line's reporter
//! writes the words to stderr and hands the ranks' pids to `top`'s state
//! file and live view; tune's trial runners read the lines and the pids.
//! The ranks' own output is relayed to the terminal and the logs by
//! `launch::output` (it is theirs, not the job's words).

use std::path::Path;
use std::sync::Arc;

use crate::launch::supervise::Outcome;

/// How a piece of the job's words reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// A line of the job's own: `threadwise: ...`.
    Note,
    /// `threadwise: warning: ...`.
    Warning,
    /// `threadwise: error: ...` (the job goes on, or ends with its code).
    Error,
    /// A whole text as it is (a summary table, a failure report).
    Text,
}

/// One event of a job on this node.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// Words for the user, before, between or after the rounds.
    Said { level: Level, text: &'a str },
    /// A round's ranks all started here: (local rank, pid) each, where
    /// their logs go.
    Started {
        round: u32,
        ranks: &'a [(usize, i32)],
        log_dir: Option<&'a Path>,
    },
    /// A thread of a rank found outside the rank's CPUs, and put back
    /// (unless `--hold off`).
    Held {
        round: u32,
        local_rank: usize,
        correction: &'a crate::proc::hold::Correction,
    },
    /// A line a rank printed (global rank), for reporters that read lines.
    Line { rank: usize, line: &'a str },
    /// A round's ranks all ended here (None: they could not start).
    RoundEnded {
        round: u32,
        outcome: Option<&'a Outcome>,
    },
}

/// What consumes a job's events.
pub(crate) trait Reporter: Send + Sync {
    fn event(&self, e: &Event<'_>);
    /// Does it read the ranks' lines? (Each line is then an event.)
    fn lines(&self) -> bool {
        false
    }
}

/// The reporter every entry point takes.
pub(crate) type Shared = Arc<dyn Reporter>;

/// Say `text` at `level` through `r`.
pub(crate) fn say(r: &dyn Reporter, level: Level, text: impl AsRef<str>) {
    r.event(&Event::Said {
        level,
        text: text.as_ref(),
    });
}

/// A reporter that keeps nothing (tune's srun trials: their one launch is
/// srun, whose nodes report through the rendezvous instead).
#[derive(Debug, Default)]
pub(crate) struct Quiet;

impl Reporter for Quiet {
    fn event(&self, _: &Event<'_>) {}
}
