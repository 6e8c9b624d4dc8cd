//! The command line's reporter of a job's events (`job::events`): the job's
//! words on stderr, each line whole, and the ranks' pids to `top` (its state
//! file, and `run --top`'s live view).

use crate::job::{Event, Level, Reporter};
use crate::top::watch::TopWatcher;

/// `run`'s reporter.
pub(crate) struct Stderr {
    pub top: TopWatcher,
    /// No per-rank summary at the end of a round (`--quiet`).
    pub quiet: bool,
}

impl Reporter for Stderr {
    fn event(&self, e: &Event<'_>) {
        match e {
            Event::Said { level, text } => return say(*level, text),
            Event::RoundEnded {
                outcome: Some(o), ..
            } if !self.quiet => crate::say_text!(crate::launch::report::summary(o)),
            _ => {}
        }
        self.top.event(e);
    }
}

/// How each level reads on stderr.
fn say(level: Level, text: &str) {
    match level {
        Level::Note => crate::say!("threadwise: {text}"),
        Level::Warning => crate::say!("threadwise: warning: {text}"),
        Level::Error => crate::say!("threadwise: error: {text}"),
        Level::Text => crate::say_text!(text),
    }
}
