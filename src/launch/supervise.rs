//! Start ranks and watch them to the end, nextest-style: every rank in its own
//! process group and killed through it; the first failure (or the first
//! SIGINT/SIGTERM/SIGHUP) sends SIGTERM (or that signal) to every group, then a
//! grace period, then SIGKILL; a second signal kills at once. Ranks die with us
//! (PR_SET_PDEATHSIG), and as a child subreaper we also collect and kill what
//! they leave behind, so no process outlives the run.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::machine::{Act, Event, Machine};
use super::output::{self, OutputOptions, OutputState, Stream, Tail};
use super::start::{Logs, RankChild, kill_orphans, reap, spawn_all};
use super::{LaunchError, RankLaunch};
use crate::measure::process;
use crate::os;
use crate::proc::contain::JobCgroup;
use crate::proc::signals::SignalPipe;

#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    pub grace: Duration,
    /// Stop every rank (SIGTERM, grace, SIGKILL) after this long.
    pub timeout: Option<Duration>,
    pub output: OutputOptions,
    pub log_dir: Option<PathBuf>,
    /// Told every rank's (local rank, pid) once all have started.
    pub on_spawned: Option<Spawned>,
    /// Move each rank's DataLoader workers to its worker CPUs (see workers.rs).
    pub move_workers: bool,
    /// Put back threads that leave their rank's CPUs (`--hold`: on, always,
    /// or off, watch and say only; see proc/hold.rs).
    pub hold: crate::proc::hold::Hold,
    /// Told every thread found outside its rank's CPUs (local rank, what).
    pub on_held: Option<Held>,
    /// The rest of a multi-node job (see `cluster`): told of our failure,
    /// asked whether the job ended elsewhere.
    pub peer: Option<Arc<dyn Peer>>,
}

/// The other nodes of the job, as the supervisor sees them.
pub(crate) trait Peer: Send + Sync + std::fmt::Debug {
    /// The job must end here too (polled every 100 ms).
    fn stop_requested(&self) -> bool;
    /// This node's part went wrong on its own (told once, at once).
    fn local_failure(&self, what: LocalFailure);
}

/// What went wrong on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalFailure {
    /// A rank failed: its local rank, pid and end.
    Rank(usize, i32, Exit),
    /// The user stopped us with this signal.
    Signal(i32),
}

/// A callback with the ranks' pids (the state file for `top`, `run --top`).
#[derive(Clone)]
pub(crate) struct Spawned(pub Arc<SpawnedFn>);

/// Called with every rank's (local rank, pid).
pub(crate) type SpawnedFn = dyn Fn(&[(usize, i32)]) + Send + Sync;

impl std::fmt::Debug for Spawned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spawned(..)")
    }
}

/// A callback with each correction of a rank's threads.
#[derive(Clone)]
pub(crate) struct Held(pub Arc<HeldFn>);

/// Called with the local rank and the correction.
pub(crate) type HeldFn = dyn Fn(usize, &crate::proc::hold::Correction) + Send + Sync;

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held(..)")
    }
}

pub(crate) use super::machine::Exit;

/// One rank's end, with wait4's resource usage.
#[derive(Debug, Clone)]
pub(crate) struct RankResult {
    pub local_rank: usize,
    pub pid: i32,
    pub exit: Exit,
    pub wall: Duration,
    pub cpu: Duration,
    pub max_rss_kib: i64,
    pub voluntary_cs: i64,
    pub involuntary_cs: i64,
}

/// The whole run's end.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub results: Vec<RankResult>,
    /// Index of the first rank that failed on its own.
    pub first_failure: Option<usize>,
    /// The first signal the user sent us.
    pub signal: Option<i32>,
    pub tails: Vec<Vec<String>>,
    pub wall: Duration,
    /// The run hit `RunOptions::timeout`.
    pub timed_out: bool,
    /// Log files that could not be written whole: (file, error).
    pub log_errors: Vec<(String, String)>,
    /// A line over output::MAX_LINE was passed on in pieces.
    pub split_lines: bool,
}

impl Outcome {
    /// 0, the first failing rank's code, or 128 + the user's signal.
    pub(crate) fn code(&self) -> i32 {
        match (self.first_failure, self.signal) {
            (Some(i), _) => self.results[i].exit.code(),
            (None, Some(s)) => 128 + s,
            (None, None) => 0,
        }
    }
}

struct Running {
    pid: i32,
    started: Instant,
    result: Option<RankResult>,
    /// The highest VmHWM seen after exec: the rank's own peak RSS.
    hwm_kib: Option<i64>,
    mover: Option<crate::proc::workers::Mover>,
    holder: Option<(usize, crate::proc::hold::Holder)>,
}

/// How often the ranks' peak RSS is read from /proc, and their new
/// DataLoader workers moved, while they run.
const SAMPLE: Duration = Duration::from_millis(100);

/// A rank's VmHWM, once it runs its own program (before exec it is a copy of
/// us, and wait4's ru_maxrss keeps that copy's size: our heap, not the rank's).
fn own_hwm_kib(pid: i32) -> Option<i64> {
    let (name, hwm) = process::peak_rss_kib(pid)?;
    (name != "threadwise").then_some(hwm)
}

fn timeval(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// Start the output threads of every rank; returns them and the stderr tails.
fn start_pumps(
    ranks: &[RankLaunch],
    children: &mut [(RankChild, Logs)],
    opts: &RunOptions,
    state: &Arc<OutputState>,
) -> (output::Pumps, Vec<Tail>) {
    let (mut sources, mut tails) = (vec![], vec![]);
    for (r, (child, (out_log, err_log))) in ranks.iter().zip(children.iter_mut()) {
        let tail: Tail = Arc::new(Mutex::new(Default::default()));
        if let Some(pipe) = child.stdout.take() {
            sources.push(output::Source {
                rank: r.local_rank,
                stream: Stream::Stdout,
                pipe,
                log: out_log.take(),
                tail: None,
            });
        }
        if let Some(pipe) = child.stderr.take() {
            sources.push(output::Source {
                rank: r.local_rank,
                stream: Stream::Stderr,
                pipe,
                log: err_log.take(),
                tail: Some(tail.clone()),
            });
        }
        tails.push(tail);
    }
    let cpus = os::get_affinity().map_or(1, |c| c.len());
    (output::pumps(sources, &opts.output, state, cpus), tails)
}

/// The ranks as they run, and the state machine that decides.
struct Watch {
    running: Vec<Running>,
    machine: Machine,
    /// Our RSS when the ranks were forked: what their copy of us weighed.
    fork_rss_kib: i64,
}

impl Watch {
    /// Carry out the machine's decisions.
    fn apply(&self, acts: Vec<Act>) {
        for act in acts {
            match act {
                Act::Signal(sig, ranks) => {
                    for i in ranks {
                        os::kill_group(self.running[i].pid, sig);
                    }
                }
                // SAFETY: plain syscall; our SIGCONT handler forwards the continue.
                Act::SuspendSelf => unsafe {
                    libc::raise(libc::SIGSTOP);
                },
            }
        }
    }

    fn event(&mut self, e: Event) {
        let acts = self.machine.on(e, Instant::now());
        self.apply(acts);
    }

    /// Read every live rank's peak RSS; move new DataLoader workers; hold
    /// the ranks' threads in place.
    fn sample(&mut self, on_held: Option<&Held>) {
        for r in self.running.iter_mut().filter(|r| r.result.is_none()) {
            if let Some(h) = own_hwm_kib(r.pid) {
                r.hwm_kib = Some(r.hwm_kib.map_or(h, |o| o.max(h)));
            }
            if let Some(m) = &mut r.mover {
                m.tick(r.pid);
            }
            if let Some((local, h)) = &mut r.holder {
                for c in h.tick(r.pid) {
                    if let Some(Held(f)) = on_held {
                        f(*local, &c);
                    }
                }
            }
        }
    }

    fn on_exit(&mut self, ranks: &[RankLaunch], pid: i32, status: libc::c_int, ru: &libc::rusage) {
        let Some(i) = self.running.iter().position(|r| r.pid == pid) else {
            return; // an orphan re-parented to us
        };
        let exit = Exit::from_status(status);
        // wait4's peak is max(the fork-time copy of us, the rank's own): above
        // our size it is exact; else the rank's own peak is the sampled one.
        let max_rss_kib = match self.running[i].hwm_kib {
            Some(h) if ru.ru_maxrss <= self.fork_rss_kib + self.fork_rss_kib / 8 + 1024 => h,
            _ => ru.ru_maxrss,
        };
        self.running[i].result = Some(RankResult {
            local_rank: ranks[i].local_rank,
            pid,
            exit,
            wall: self.running[i].started.elapsed(),
            cpu: timeval(ru.ru_utime) + timeval(ru.ru_stime),
            max_rss_kib,
            voluntary_cs: ru.ru_nvcsw,
            involuntary_cs: ru.ru_nivcsw,
        });
        self.event(Event::Ended(i, exit));
    }
}

impl Watch {
    /// Watching the ranks just spawned (`children`, in `ranks`' order).
    fn new(
        ranks: &[RankLaunch],
        children: &[(RankChild, Logs)],
        opts: &RunOptions,
        start: Instant,
        fork_rss_kib: i64,
    ) -> Watch {
        Watch {
            running: children
                .iter()
                .zip(ranks)
                .map(|((c, _), l)| Running {
                    pid: c.pid,
                    started: Instant::now(),
                    result: None,
                    hwm_kib: None,
                    mover: l
                        .worker_mask
                        .clone()
                        .filter(|_| opts.move_workers)
                        .map(crate::proc::workers::Mover::new),
                    holder: l.hold.clone().map(|spec| {
                        (
                            l.local_rank,
                            crate::proc::hold::Holder::new(spec, opts.hold),
                        )
                    }),
                })
                .collect(),
            machine: Machine::new(ranks.len(), opts.grace, opts.timeout.map(|t| start + t)),
            fork_rss_kib,
        }
    }
}

/// Wait for signals, ends and ticks until the machine is done; sample the
/// ranks' memory and move their workers as it goes.
fn supervise(w: &mut Watch, ranks: &[RankLaunch], opts: &RunOptions, signals: &SignalPipe) {
    let mut next_sample = Instant::now() + Duration::from_millis(10);
    let mut told = false;
    while !w.machine.done() {
        let until_sample = next_sample
            .saturating_duration_since(Instant::now())
            .as_millis() as i32;
        let wait = match w.machine.wait_ms(Instant::now()) {
            -1 => until_sample,
            ms => ms.min(until_sample),
        };
        let got = signals.wait(wait.max(0));
        if Instant::now() >= next_sample {
            w.sample(opts.on_held.as_ref());
            next_sample = Instant::now() + SAMPLE;
        }
        for (pid, status, ru) in reap() {
            w.on_exit(ranks, pid, status, &ru);
        }
        for sig in got {
            w.event(Event::Signal(sig));
        }
        w.event(Event::Tick);
        if let Some(peer) = &opts.peer {
            tell_peer(peer.as_ref(), w, &mut told);
        }
    }
}

/// Whatever the ranks left behind: their groups, the job cgroup, then
/// re-parented orphans.
fn clean_up(w: &Watch, cgroup: Option<JobCgroup>) {
    for r in &w.running {
        os::kill_group(r.pid, libc::SIGKILL);
    }
    if let Some(cg) = &cgroup {
        cg.kill();
    }
    kill_orphans(cgroup.as_ref().and_then(JobCgroup::watchdog_pid));
    drop(cgroup);
}

/// The run's end, from the machine and the output pumps.
fn outcome(w: Watch, tails: &[Tail], state: &OutputState, start: Instant) -> Outcome {
    Outcome {
        results: w.running.into_iter().filter_map(|r| r.result).collect(),
        first_failure: w.machine.first_failure(),
        signal: w.machine.user_signal(),
        tails: tails
            .iter()
            .map(|t| {
                t.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect()
            })
            .collect(),
        wall: start.elapsed(),
        timed_out: w.machine.timed_out(),
        log_errors: std::mem::take(
            &mut *state.log_errors.lock().unwrap_or_else(|e| e.into_inner()),
        ),
        split_lines: state.split_lines.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Start every rank and supervise them to the end.
pub(crate) fn run(ranks: &[RankLaunch], opts: &RunOptions) -> Result<Outcome, LaunchError> {
    let signals = SignalPipe::get().map_err(|source| LaunchError::Spawn {
        rank: 0,
        program: "signal pipe".into(),
        source,
    })?;
    os::become_subreaper();
    if let Some(dir) = &opts.log_dir {
        crate::files::create_private_dirs(dir).map_err(|source| LaunchError::LogDir {
            path: dir.display().to_string(),
            source,
        })?;
    }
    // Where the machine allows it, the job's processes share a cgroup that is
    // killed as a whole (also by the watchdog, should we be SIGKILLed).
    let cgroup = JobCgroup::create().ok();
    let fork_rss_kib = process::own_rss_kib().unwrap_or(0);
    let start = Instant::now();
    let mut children = spawn_all(ranks, &opts.log_dir, cgroup.as_ref())?;
    if let Some(Spawned(f)) = &opts.on_spawned {
        let pids: Vec<(usize, i32)> = ranks
            .iter()
            .zip(&children)
            .map(|(r, (c, _))| (r.local_rank, c.pid))
            .collect();
        f(&pids);
    }
    let mut w = Watch::new(ranks, &children, opts, start, fork_rss_kib);
    let state = Arc::new(OutputState::default());
    let (pumps, tails) = start_pumps(ranks, &mut children, opts, &state);
    supervise(&mut w, ranks, opts, signals);
    clean_up(&w, cgroup);
    pumps.join_within(Duration::from_secs(2));
    Ok(outcome(w, &tails, &state, start))
}

/// Tell the other nodes of our first failure once; stop if the job ended
/// elsewhere.
fn tell_peer(peer: &dyn Peer, w: &mut Watch, told: &mut bool) {
    if !*told {
        let what = match (w.machine.first_failure(), w.machine.user_signal()) {
            (Some(i), _) => w.running[i]
                .result
                .as_ref()
                .map(|r| LocalFailure::Rank(r.local_rank, r.pid, r.exit)),
            (None, Some(sig)) => Some(LocalFailure::Signal(sig)),
            (None, None) => None,
        };
        if let Some(what) = what {
            peer.local_failure(what);
            *told = true;
        }
    }
    if peer.stop_requested() {
        w.event(Event::Elsewhere);
    }
}
