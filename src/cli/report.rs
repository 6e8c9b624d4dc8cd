//! The command line's reporter of a job's events (`job::events`): the job's
//! words on stderr, each line whole, and the ranks' pids to `top` (its state
//! file, and `run --top`'s live view).

use std::sync::Mutex;

use crate::job::{Event, Level, Reporter};
use crate::proc::hold::{Correction, Loud, Tally};
use crate::top::watch::TopWatcher;

/// `run`'s reporter.
pub(crate) struct Stderr {
    pub top: TopWatcher,
    /// No per-rank summary at the end of a round (`--quiet`).
    pub quiet: bool,
    /// The round's findings about threads so far (`proc::hold`'s words and
    /// limit, the same as bind's holder).
    pub held: Mutex<Tally>,
}

impl Stderr {
    pub(crate) fn new(top: TopWatcher, quiet: bool) -> Stderr {
        Stderr {
            top,
            quiet,
            held: Mutex::default(),
        }
    }

    fn held(&self, local_rank: usize, c: &Correction) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((loud, line)) = h.add(local_rank, c) {
            let level = match loud {
                Loud::Warning => Level::Warning,
                Loud::Note => Level::Note,
            };
            say(level, &line);
        }
    }

    /// The round's findings, once it ended.
    fn held_summary(&self) {
        let lines = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .summary();
        for line in lines {
            say(Level::Note, &line);
        }
    }
}

impl Reporter for Stderr {
    fn event(&self, e: &Event<'_>) {
        match e {
            Event::Said { level, text } => return say(*level, text),
            Event::Held {
                local_rank,
                correction,
                ..
            } => self.held(*local_rank, correction),
            Event::RoundEnded { outcome, .. } => {
                if let Some(o) = outcome.filter(|_| !self.quiet) {
                    crate::say_text!(crate::launch::report::summary(o));
                }
                self.held_summary();
            }
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
