//! The command line's reporter of a job's events (`job::events`): the job's
//! words on stderr, each line whole, and the ranks' pids to `top` (its state
//! file, and `run --top`'s live view).

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::job::{Event, Level, Reporter};
use crate::proc::hold::Correction;
use crate::top::watch::TopWatcher;

/// `run`'s reporter.
pub(crate) struct Stderr {
    pub top: TopWatcher,
    /// No per-rank summary at the end of a round (`--quiet`).
    pub quiet: bool,
    /// The round's corrections so far, per local rank: (count, threads).
    pub held: Mutex<BTreeMap<usize, (usize, Vec<String>)>>,
}

/// Corrections said one by one per rank per round; the rest are counted.
const HELD_SAID: usize = 3;

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
        let (n, names) = h.entry(local_rank).or_default();
        *n += 1;
        let who = format!("{} '{}' ({})", c.tid, c.name, c.role);
        if !names.contains(&who) {
            names.push(who.clone());
        }
        if *n <= HELD_SAID {
            say(Level::Warning, &crate::proc::hold::said(local_rank, c));
        }
    }

    /// The round's corrections, once it ended.
    fn held_summary(&self) {
        let h = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        for (rank, (n, names)) in h {
            say(
                Level::Note,
                &format!(
                    "rank {rank}: {n} correction(s) of thread(s) that left the rank's CPUs: {}",
                    names.join(", ")
                ),
            );
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
