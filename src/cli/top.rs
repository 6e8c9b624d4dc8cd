//! `threadwise top`, and the two hooks `run` gives it: the state file that
//! lets `top` find a run, and `run --top` (the view in place of the output).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::args::TopCmd;
use super::topo::load;
use super::{Exit, Failure, SourceArgs, emit};
use crate::launch::supervise::Spawned;
use crate::plan::Plan;
use crate::top::find::{self, RunState, STATE_SCHEMA};
use crate::top::{Sampler, Target, View, ui};
use crate::topology::Topology;

/// Each rank's target from its plan and pid.
pub fn targets(p: &Plan, pids: &[(usize, i32)], allowed: &crate::cpuset::CpuSet) -> Vec<Target> {
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
            })
        })
        .collect()
}

/// What `run` keeps to undo at the end: the state file, the view's thread.
#[derive(Default)]
pub struct RunWatch {
    state_file: Mutex<Option<PathBuf>>,
    view: Mutex<Option<JoinHandle<()>>>,
    done: AtomicBool,
}

impl RunWatch {
    /// The hook `supervise` calls with the pids: write the state file, and
    /// with `--top` start the view.
    pub fn hook(
        self: &Arc<Self>,
        p: &Plan,
        topo: &Topology,
        command: Vec<String>,
        log_dir: Option<String>,
        top: bool,
    ) -> Spawned {
        let (me, p, topo) = (self.clone(), p.clone(), topo.clone());
        Spawned(Arc::new(move |pids| {
            let ranks = targets(&p, pids, &topo.allowed_cpus);
            let state = RunState {
                schema: STATE_SCHEMA.into(),
                pid: std::process::id() as i32,
                command: command.clone(),
                ranks: ranks.clone(),
                log_dir: log_dir.clone(),
            };
            match find::write_state(&state) {
                Ok(f) => *me.state_file.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
                Err(e) => crate::say!("threadwise: note: top cannot find this run: {e}"),
            }
            if top {
                let (watch, topo) = (me.clone(), topo.clone());
                let h = std::thread::spawn(move || {
                    let mut s = Sampler::new(ranks);
                    let done = || watch.done.load(Ordering::Relaxed);
                    if let Err(e) = ui::run(&topo, &mut s, Duration::from_secs(1), &done) {
                        crate::say!("threadwise: the view stopped: {e}");
                    }
                });
                *me.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
            }
        }))
    }

    /// The run ended: close the view, remove the state file.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = self.view.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        if let Some(f) = self
            .state_file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Plain text of one view, for `--once` without `--json`.
fn text(v: &View) -> String {
    let mut out = format!("{} rank(s) over {:.1} s\n", v.ranks.len(), v.interval_s);
    for r in &v.ranks {
        out.push_str(&format!(
            "rank {} pid {} {}: cpu {:.0}% usr {:.0}% sys, {} threads ({} runnable), \
             {:.0}/{:.0} cs/s, planned {} ran on {}, {:.0} MiB, {} worker(s)\n",
            r.local_rank,
            r.pid,
            r.comm,
            r.cpu_user_pct,
            r.cpu_sys_pct,
            r.threads,
            r.runnable,
            r.voluntary_cs_per_s,
            r.involuntary_cs_per_s,
            r.planned,
            r.ran_on,
            r.rss_mib,
            r.workers.len()
        ));
    }
    for a in &v.alerts {
        out.push_str(&format!("alert {}: {}\n", a.kind, a.reason));
    }
    out
}

fn find_targets(a: &TopCmd) -> Result<Vec<Target>, Failure> {
    if !a.pid.is_empty() {
        let mut out = vec![];
        for (i, pid) in a.pid.iter().enumerate() {
            let env = crate::measure::process::environ(*pid).map_err(|e| {
                Failure::usage(
                    format!("--pid {pid}: cannot read the process: {e}"),
                    "give the pid of a running rank you may read",
                )
            })?;
            let mut t = find::target_from_env(*pid, &env).unwrap_or(Target {
                local_rank: i,
                pid: *pid,
                cpus: Default::default(),
                worker_cpus: Default::default(),
                mem_nodes: vec![],
            });
            if t.cpus.is_empty() {
                t.cpus = crate::measure::process::affinity(*pid);
            }
            out.push(t);
        }
        return Ok(out);
    }
    if a.all {
        let t = find::all_ranks();
        if t.is_empty() {
            return Err(Failure::usage(
                "--all: no rank of torchrun, srun or mpirun is running that you may read",
                "start a job, or give --pid PID",
            ));
        }
        return Ok(t);
    }
    match find::live_runs().into_iter().next() {
        Some(s) => Ok(s.ranks),
        None => Err(Failure::usage(
            format!(
                "no threadwise run is running (no live state file in {})",
                find::state_dir().display()
            ),
            "start one with threadwise run, or give --pid PID or --all",
        )),
    }
}

pub fn top_cmd(a: TopCmd) -> Result<Exit, Failure> {
    let targets = find_targets(&a)?;
    let mut s = Sampler::new(targets);
    if a.once {
        let v = s.after(a.interval);
        return if a.json {
            let t = serde_json::to_string(&v)
                .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
            emit(&(t + "\n"))
        } else {
            emit(&text(&v))
        };
    }
    if a.json {
        loop {
            let v = s.after(a.interval);
            let all_gone = v.ranks.iter().all(|r| !r.alive);
            let t = serde_json::to_string(&v)
                .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
            emit(&(t + "\n"))?;
            if all_gone {
                return Ok(Exit::OK);
            }
        }
    }
    let topo = load(&SourceArgs::default())?;
    ui::run(&topo, &mut s, a.interval, &|| false)
        .map_err(|e| Failure::env(format!("the terminal view failed: {e}"), "use --json"))?;
    Ok(Exit::OK)
}
