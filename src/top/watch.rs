//! What `top` takes from a job's events (`job::events`): the state file that
//! lets `top` find a run, and `run --top` (the live view in place of the
//! ranks' output), each round's from its `Started` to its `RoundEnded`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::find::{self, RunState, STATE_SCHEMA};
use super::{Sampler, Target, ui};
use crate::job::Event;
use crate::plan::Plan;
use crate::topology::Topology;

/// Each rank's target from its plan and pid.
pub(crate) fn targets(
    p: &Plan,
    pids: &[(usize, i32)],
    allowed: &crate::cpuset::CpuSet,
) -> Vec<Target> {
    pids.iter()
        .filter_map(|(rank, pid)| {
            let r = p.ranks.get(*rank)?;
            Some(Target {
                local_rank: *rank,
                pid: *pid,
                cpus: if r.bind {
                    r.cpus.clone()
                } else {
                    allowed.clone()
                },
                worker_cpus: if r.bind {
                    r.worker_cpus.clone()
                } else {
                    Default::default()
                },
                mem_nodes: r.mem_nodes.clone(),
                gpu: r.gpu.clone(),
                roles: r.roles.clone().filter(|_| r.bind),
                corrections: Default::default(),
            })
        })
        .collect()
}

/// What `run` keeps to undo at the end: the state file, the view's thread.
#[derive(Default)]
pub(crate) struct RunWatch {
    /// The state file and what it says (its ranks' corrections grow as they
    /// come).
    state: Mutex<Option<(PathBuf, RunState)>>,
    view: Mutex<Option<JoinHandle<()>>>,
    done: AtomicBool,
}

impl RunWatch {
    /// The ranks started: write the state file, and with `--top` start the
    /// view.
    pub(crate) fn started(
        self: &Arc<Self>,
        w: &TopWatcher,
        pids: &[(usize, i32)],
        log_dir: Option<String>,
    ) {
        let ranks = targets(&w.plan, pids, &w.topology.allowed_cpus);
        let state = RunState {
            schema: STATE_SCHEMA.into(),
            pid: std::process::id() as i32,
            command: w.command.clone(),
            ranks: ranks.clone(),
            log_dir,
            holder: false,
        };
        match find::write_state(&state) {
            Ok(f) => *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some((f, state)),
            Err(e) => crate::say!("threadwise: note: top cannot find this run: {e}"),
        }
        if w.live {
            let (watch, topo) = (self.clone(), w.topology.clone());
            let h = std::thread::spawn(move || {
                let mut s = Sampler::new(ranks);
                let done = || watch.done.load(Ordering::Relaxed);
                if let Err(e) = ui::run(&topo, &mut s, Duration::from_secs(1), &done) {
                    crate::say!("threadwise: the view stopped: {e}");
                }
            });
            *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        }
    }

    /// A thread of `local_rank` was put back: counted in the state file, for
    /// `top`.
    fn held(&self, local_rank: usize, tid: i32) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, s)) = state.as_mut() else {
            return;
        };
        if let Some(t) = s.ranks.iter_mut().find(|t| t.local_rank == local_rank) {
            *t.corrections.entry(tid).or_default() += 1;
        }
        // The same file, rewritten whole (a reader sees the old or the new).
        let _ = find::write_state(s);
    }

    /// The run ended: close the view, remove the state file.
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = self.view.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        if let Some((f, _)) = self.state.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// `run`'s watcher: each round's state file, and with `live` (`run --top`)
/// the view in place of the ranks' output.
pub(crate) struct TopWatcher {
    plan: Plan,
    topology: Topology,
    command: Vec<String>,
    live: bool,
    /// The round under way, and its number.
    round: Mutex<Option<(u32, Arc<RunWatch>)>>,
}

impl TopWatcher {
    pub(crate) fn new(
        plan: &Plan,
        topology: &Topology,
        command: &[std::ffi::OsString],
        live: bool,
    ) -> TopWatcher {
        TopWatcher {
            plan: plan.clone(),
            topology: topology.clone(),
            command: command
                .iter()
                .map(|x| x.to_string_lossy().into_owned())
                .collect(),
            live,
            round: Mutex::default(),
        }
    }

    /// A round's start and end; the rest of a job's events are not top's.
    pub(crate) fn event(&self, e: &Event<'_>) {
        let mut round = self.round.lock().unwrap_or_else(|e| e.into_inner());
        match e {
            Event::Started {
                round: n,
                ranks,
                log_dir,
            } => {
                let w = Arc::new(RunWatch::default());
                w.started(self, ranks, log_dir.map(|d| d.display().to_string()));
                if let Some((_, old)) = round.replace((*n, w)) {
                    old.finish();
                }
            }
            Event::Held {
                round: n,
                local_rank,
                correction,
            } => {
                if let Some((r, w)) = round.as_ref()
                    && r == n
                    && correction.counts()
                {
                    w.held(*local_rank, correction.tid);
                }
            }
            Event::RoundEnded { round: n, .. } => {
                if round.as_ref().is_some_and(|(r, _)| r == n)
                    && let Some((_, w)) = round.take()
                {
                    w.finish();
                }
            }
            _ => {}
        }
    }
}
