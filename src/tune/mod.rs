//! `tune`: run the user's command (or the built-in workload) under several
//! configurations, in interleaved rounds (A B C A B C, so drift hits all
//! alike), and report throughput, CPU and GPU use with honest statistics. The
//! loop is pure over a `TrialRunner`, so tests can drive it with a mock; the
//! real runner (runner.rs) launches ranks through `launch`.

pub mod export;
pub mod grid;
pub mod metric;
pub mod rates;
pub mod report;
pub mod runner;
pub mod stats;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use grid::TuneConfig;
use metric::Metric;
use stats::{Summary, overlaps, summarize};

pub const TUNE_SCHEMA: &str = "threadwise.tune/1";

/// What one launch of a configuration produced (from the runner).
#[derive(Debug, Clone, Default)]
pub struct TrialOutcome {
    /// The last throughput the ranks printed (the metric applied as lines arrived).
    pub hit: Option<metric::Hit>,
    pub wall: Duration,
    pub cpu: Duration,
    pub voluntary_cs: i64,
    pub involuntary_cs: i64,
    pub peak_rss_kib: i64,
    /// None when all ranks exited 0, else the first failure's exit code.
    pub failure: Option<String>,
    pub timed_out: bool,
    /// The user pressed Ctrl-C (or sent a signal): stop tuning.
    pub interrupted: bool,
    pub stderr_tail: Vec<String>,
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_mib: Option<f64>,
    /// Could not start at all (bad plan for this config, missing allocator...).
    pub error: Option<String>,
}

/// Runs one configuration once, applying `metric` to the output as it streams.
pub trait TrialRunner {
    fn run(&mut self, config: &TuneConfig, metric: &Metric) -> TrialOutcome;
    /// What a configuration launches (environment, CPU and memory placement,
    /// argv of every rank), so that two configurations which launch the same
    /// thing are measured once. None: unknown, never merged.
    fn launch_key(&self, _config: &TuneConfig) -> Option<String> {
        None
    }
}

/// The default search drops, after its first measured round, a configuration
/// whose trial is below this fraction of the round's best: a factor of two is
/// more than one trial moved between rounds in any measurement behind the
/// README (1.5 at most).
pub const FIRST_ROUND_CUT: f64 = 0.5;

/// Halving's second-round test also needs the median this far below the
/// leader's: one trial's spread here is about 10%, so two medians of two
/// trials differ by up to about 20% with nothing between them.
pub const CLEARLY_WORSE: f64 = 0.8;

/// How one trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialStatus {
    /// Every rank exited 0: the trial is measured.
    Ok,
    /// A rank exited non-zero or was killed.
    Failed,
    /// Stopped after --timeout.
    Timeout,
    /// Could not start (a plan this machine cannot satisfy, a missing allocator...).
    Error,
    /// The user stopped tuning during this trial.
    Interrupted,
    /// It ran, but printed no throughput (or one in another unit): counted, not scored.
    NoMetric,
}

impl TrialStatus {
    pub fn name(self) -> &'static str {
        match self {
            TrialStatus::Ok => "ok",
            TrialStatus::Failed => "failed",
            TrialStatus::Timeout => "timeout",
            TrialStatus::Error => "error",
            TrialStatus::Interrupted => "interrupted",
            TrialStatus::NoMetric => "no-metric",
        }
    }
}

impl std::fmt::Display for TrialStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Something the reader of a report must know (hyperfine's `Warnings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Warning {
    /// Tuning stopped early; the report holds what was measured.
    Interrupted { config: String, round: usize },
    /// No throughput in the output: configurations are ranked by 1 / wall time.
    WallMetric,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::Interrupted { config, round } => write!(
                f,
                "interrupted during {config} round {round}; the report holds what was measured"
            ),
            Warning::WallMetric => {
                f.write_str("no throughput found in the output (--metric): ranked by 1 / wall time")
            }
        }
    }
}

/// Where the throughput came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricSource {
    /// Parsed from the ranks' output (--metric or the default shapes).
    Output,
    /// 1 / wall time, because the output had none.
    Wall,
}

/// How a configuration compares with the winner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Winner,
    /// Its range overlaps the winner's: the data cannot tell them apart.
    NotDistinguishable,
    None,
}

impl Mark {
    pub fn name(self) -> &'static str {
        match self {
            Mark::Winner => "winner",
            Mark::NotDistinguishable => "not distinguishable",
            Mark::None => "",
        }
    }
}

/// One measured trial, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub round: usize,
    pub status: TrialStatus,
    pub throughput: Option<f64>,
    pub wall_s: f64,
    pub cpu_util_pct: f64,
    pub voluntary_cs_per_s: f64,
    pub involuntary_cs_per_s: f64,
    pub peak_rss_mib: f64,
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_mib: Option<f64>,
    pub message: Option<String>,
    pub stderr_tail: Vec<String>,
    /// The line the throughput was read from (rank, text, unit).
    #[serde(default)]
    pub hit: Option<metric::Hit>,
    /// Further than 3 scaled MADs from its configuration's median.
    #[serde(default)]
    pub outlier: bool,
}

/// One configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigResult {
    pub name: String,
    pub options: String,
    pub throughput: Option<Summary>,
    pub speedup: Option<f64>,
    pub cpu_util_pct: Option<f64>,
    pub voluntary_cs_per_s: Option<f64>,
    pub involuntary_cs_per_s: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_mib: Option<f64>,
    /// The 95% intervals of the winner's median and this one's overlap: the
    /// data cannot tell them apart.
    pub indistinguishable_from_winner: bool,
    /// Dropped by --strategy halving after this round.
    pub dropped_after_round: Option<usize>,
    /// Other configurations that launch exactly as this one (same environment,
    /// placement and argv for every rank): measured once, under this name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_launch: Vec<String>,
    /// Where its throughput was read: the latest scored trial's line.
    #[serde(default)]
    pub read_from: Option<metric::Hit>,
    /// Its first trial was more than 10% below the median of the others.
    #[serde(default)]
    pub slow_first_trial: bool,
    pub trials: Vec<Trial>,
}

/// The whole report (`--export-json`, schema threadwise.tune/1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneReport {
    pub schema: String,
    pub command: Vec<String>,
    pub nproc: usize,
    pub source: String,
    pub cpu_budget: f64,
    pub runs: usize,
    pub warmup: usize,
    pub metric: MetricSource,
    pub unit: String,
    pub configs: Vec<ConfigResult>,
    pub baseline: Option<String>,
    pub winner: Option<String>,
    /// False while running and when interrupted.
    pub complete: bool,
    pub warnings: Vec<Warning>,
}

impl TuneReport {
    /// How `c` compares with the winner.
    pub fn mark(&self, c: &ConfigResult) -> Mark {
        if self.winner.as_deref() == Some(c.name.as_str()) {
            Mark::Winner
        } else if c.indistinguishable_from_winner {
            Mark::NotDistinguishable
        } else {
            Mark::None
        }
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Strategy ("a strategy,") {
        /// Halving when there are more than 8 configurations, else all.
        Auto => "auto",
        /// Every configuration every round.
        All => "all",
        /// After each round, drop configurations clearly worse than the best one.
        Halving => "halving",
    }
}

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// With the default search: the plan's request, to combine the axis
    /// values that beat the plan into one more configuration.
    pub combine: Option<crate::plan::PlanRequest>,
    pub runs: usize,
    /// Extra rounds, up to this many trials, for a close race (>= runs).
    pub max_runs: usize,
    pub warmup: usize,
    pub strategy: Strategy,
    pub metric: Metric,
    pub cpu_budget: f64,
}

/// Progress events for the caller (progress bar, file rewrites).
pub enum Event<'a> {
    Start {
        total: usize,
    },
    TrialStart {
        config: &'a str,
        round: usize,
        warmup: bool,
    },
    /// After every measured trial: the report so far (write files now).
    Updated(&'a TuneReport),
}

impl ConfigResult {
    /// A configuration with nothing measured yet.
    pub fn new(name: &str, options: String) -> ConfigResult {
        ConfigResult {
            name: name.to_string(),
            options,
            throughput: None,
            speedup: None,
            cpu_util_pct: None,
            voluntary_cs_per_s: None,
            involuntary_cs_per_s: None,
            peak_rss_mib: None,
            gpu_util_pct: None,
            gpu_mem_mib: None,
            indistinguishable_from_winner: false,
            dropped_after_round: None,
            same_launch: vec![],
            read_from: None,
            slow_first_trial: false,
            trials: vec![],
        }
    }
}

fn describe(c: &TuneConfig) -> String {
    let r = &c.request;
    if c.unset_threads {
        return format!("threads unset, policy {}", r.policy);
    }
    let mut s = format!(
        "threads {}, policy {}, workers {}",
        r.threads, r.policy, r.workers
    );
    if r.allocator != crate::plan::AllocatorChoice::None {
        s.push_str(&format!(", allocator {}", r.allocator));
    }
    if r.profile == crate::plan::Profile::Seed {
        s.push_str(", profile seed");
    }
    if r.smt {
        s.push_str(", smt");
    }
    if r.omp_wait != crate::plan::WaitPolicy::Default {
        s.push_str(&format!(", wait {}", r.omp_wait));
    }
    s
}

/// One measured trial. `mode` is how throughput is read, and `unit` the unit
/// every scored trial must share (rates in another unit are not comparable).
fn trial(
    o: &TrialOutcome,
    round: usize,
    budget: f64,
    mode: MetricSource,
    unit: Option<&str>,
) -> Trial {
    let wall = o.wall.as_secs_f64().max(1e-9);
    let status = if o.interrupted {
        TrialStatus::Interrupted
    } else if o.error.is_some() {
        TrialStatus::Error
    } else if o.timed_out {
        TrialStatus::Timeout
    } else if o.failure.is_some() {
        TrialStatus::Failed
    } else {
        TrialStatus::Ok
    };
    let mut ok = status == TrialStatus::Ok;
    let mut status = status;
    let mut note = None;
    let throughput = match mode {
        _ if !ok => None,
        MetricSource::Wall => Some(1.0 / wall),
        MetricSource::Output => match &o.hit {
            Some(h) if unit.is_none() || h.unit.as_deref() == unit => Some(h.value),
            other => {
                note = Some(match other {
                    Some(h) => format!(
                        "printed {} {}, not {}: not comparable",
                        h.value,
                        h.unit.as_deref().unwrap_or("?"),
                        unit.unwrap_or("?")
                    ),
                    None => "printed no throughput".to_string(),
                });
                status = TrialStatus::NoMetric;
                ok = false;
                None
            }
        },
    };
    Trial {
        round,
        status,
        throughput,
        hit: o.hit.clone(),
        wall_s: wall,
        cpu_util_pct: 100.0 * o.cpu.as_secs_f64() / (wall * budget.max(1e-9)),
        voluntary_cs_per_s: o.voluntary_cs as f64 / wall,
        involuntary_cs_per_s: o.involuntary_cs as f64 / wall,
        peak_rss_mib: o.peak_rss_kib as f64 / 1024.0,
        gpu_util_pct: o.gpu_util_pct,
        gpu_mem_mib: o.gpu_mem_mib,
        message: o
            .error
            .clone()
            .or_else(|| o.failure.clone())
            .or_else(|| o.timed_out.then(|| "timed out".to_string()))
            .or(note),
        stderr_tail: if ok { vec![] } else { o.stderr_tail.clone() },
        outlier: false,
    }
}

fn median_of(trials: &[Trial], f: impl Fn(&Trial) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Ok)
        .filter_map(f)
        .collect();
    summarize(&v).map(|s| s.median)
}

/// Recompute every summary, the baseline's speed-ups and the winner.
pub fn finish(report: &mut TuneReport) {
    for c in &mut report.configs {
        let v: Vec<f64> = c
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Ok)
            .filter_map(|t| t.throughput)
            .collect();
        c.throughput = summarize(&v);
        if let Some(sum) = c.throughput {
            for t in &mut c.trials {
                t.outlier = t.throughput.is_some_and(|x| stats::is_outlier(&sum, x));
            }
            // A first trial well below the others: warm caches, a cold disk.
            let rest: Vec<f64> = c
                .trials
                .iter()
                .filter(|t| t.round > 0 && t.status == TrialStatus::Ok)
                .filter_map(|t| t.throughput)
                .collect();
            let first = c
                .trials
                .iter()
                .find(|t| t.round == 0)
                .and_then(|t| t.throughput);
            c.slow_first_trial = match (first, summarize(&rest)) {
                (Some(f), Some(r)) if r.n >= 2 => f < r.median * 0.9,
                _ => false,
            };
        }
        c.cpu_util_pct = median_of(&c.trials, |t| Some(t.cpu_util_pct));
        c.voluntary_cs_per_s = median_of(&c.trials, |t| Some(t.voluntary_cs_per_s));
        c.involuntary_cs_per_s = median_of(&c.trials, |t| Some(t.involuntary_cs_per_s));
        c.peak_rss_mib = median_of(&c.trials, |t| Some(t.peak_rss_mib));
        c.gpu_util_pct = median_of(&c.trials, |t| t.gpu_util_pct);
        c.gpu_mem_mib = c
            .trials
            .iter()
            .filter_map(|t| t.gpu_mem_mib)
            .reduce(f64::max);
    }
    let base = report
        .baseline
        .as_ref()
        .and_then(|b| report.configs.iter().find(|c| &c.name == b))
        .and_then(|c| c.throughput);
    for c in &mut report.configs {
        c.speedup = match (c.throughput, base) {
            (Some(t), Some(b)) if b.median > 0.0 => Some(t.median / b.median),
            _ => None,
        };
    }
    // A configuration halving dropped lost when both had as many trials; its
    // median is not compared with later rounds' (the machine drifts).
    let best_of = |dropped_too: bool| {
        report
            .configs
            .iter()
            .filter(|c| dropped_too || c.dropped_after_round.is_none())
            .filter_map(|c| Some((c.name.clone(), c.throughput?)))
            .max_by(|a, b| a.1.median.total_cmp(&b.1.median))
    };
    let best = best_of(false).or_else(|| best_of(true));
    report.winner = best.as_ref().map(|(n, _)| n.clone());
    for c in &mut report.configs {
        c.indistinguishable_from_winner = match (&best, c.throughput) {
            (Some((n, w)), Some(t)) => *n != c.name && overlaps(w, &t),
            _ => false,
        };
    }
}

/// After one measured round: configurations (not the baseline, which every
/// speed-up needs) whose trial is below FIRST_ROUND_CUT of the best trial.
fn far_behind(report: &TuneReport, active: &[usize]) -> Vec<usize> {
    let value = |i: usize| report.configs[i].throughput.map(|t| t.median);
    let Some(best) = active.iter().filter_map(|&i| value(i)).reduce(f64::max) else {
        return vec![];
    };
    active
        .iter()
        .copied()
        .filter(|&i| report.baseline.as_deref() != Some(report.configs[i].name.as_str()))
        .filter(|&i| value(i).is_some_and(|v| v < FIRST_ROUND_CUT * best))
        .collect()
}

/// Configurations that launch exactly as an earlier one are left out; the
/// earlier one lists their names (and takes over the axis of a default-search
/// row, so the combination still sees it).
fn merge_same_launch(
    configs: &[TuneConfig],
    runner: &dyn TrialRunner,
) -> (Vec<TuneConfig>, Vec<Vec<String>>) {
    let mut kept: Vec<(Option<String>, TuneConfig, Vec<String>)> = vec![];
    for c in configs {
        let key = runner.launch_key(c);
        let same = key
            .as_ref()
            .and_then(|k| kept.iter_mut().find(|(kk, _, _)| kk.as_ref() == Some(k)));
        match same {
            Some((_, first, names)) => {
                names.push(c.name.clone());
                if first.axis.is_none() {
                    first.axis = c.axis.clone();
                }
            }
            None => kept.push((key, c.clone(), vec![])),
        }
    }
    kept.into_iter().map(|(_, c, n)| (c, n)).unzip()
}

/// Configurations clearly worse than the best: their best trial is below the
/// best configuration's worst and their median more than CLEARLY_WORSE below
/// its median. Ranges alone are weak with two trials each: two equally fast
/// configurations fail to overlap one time in six (1 of the C(4,2) orders).
fn clearly_worse(report: &TuneReport, active: &[usize]) -> Vec<usize> {
    let best = active
        .iter()
        .filter_map(|&i| report.configs[i].throughput)
        .max_by(|a, b| a.median.total_cmp(&b.median));
    let Some(best) = best else { return vec![] };
    active
        .iter()
        .copied()
        .filter(|&i| {
            report.configs[i]
                .throughput
                .is_none_or(|t| t.max < best.min && t.median < CLEARLY_WORSE * best.median)
        })
        .collect()
}

/// The tuning loop's state between trials.
struct Session<'a> {
    configs: Vec<TuneConfig>,
    opts: &'a TuneOptions,
    report: TuneReport,
    /// How throughput is read, decided by the first trial that succeeds: from
    /// the output when it printed a rate, else (for every trial) 1 / wall time.
    mode: Option<MetricSource>,
}

impl Session<'_> {
    /// One round over `which`; false when the user interrupted.
    fn round(
        &mut self,
        which: &[usize],
        round: usize,
        runner: &mut dyn TrialRunner,
        on_event: &mut dyn FnMut(Event),
    ) -> bool {
        let warm = round < self.opts.warmup;
        for &i in which {
            on_event(Event::TrialStart {
                config: &self.configs[i].name.clone(),
                round,
                warmup: warm,
            });
            let o = runner.run(&self.configs[i], &self.opts.metric);
            if o.interrupted {
                self.report.warnings.push(Warning::Interrupted {
                    config: self.configs[i].name.clone(),
                    round,
                });
                finish(&mut self.report);
                on_event(Event::Updated(&self.report));
                return false;
            }
            if !warm {
                self.measured(i, round - self.opts.warmup, &o);
                on_event(Event::Updated(&self.report));
            }
        }
        true
    }

    fn measured(&mut self, i: usize, round: usize, o: &TrialOutcome) {
        let r = &mut self.report;
        let succeeded = o.error.is_none() && !o.timed_out && o.failure.is_none();
        if self.mode.is_none() && succeeded {
            let m = if o.hit.is_some() {
                MetricSource::Output
            } else {
                r.warnings.push(Warning::WallMetric);
                MetricSource::Wall
            };
            r.metric = m;
            r.unit = match (&m, &o.hit) {
                (MetricSource::Wall, _) => "runs/s".into(),
                (_, Some(h)) => h.unit.clone().unwrap_or_else(|| "per s".into()),
                _ => "per s".into(),
            };
            self.mode = Some(m);
        }
        let unit =
            (r.unit != "per s" && r.metric == MetricSource::Output).then_some(r.unit.as_str());
        let t = trial(
            o,
            round,
            self.opts.cpu_budget,
            self.mode.unwrap_or(MetricSource::Output),
            unit,
        );
        if t.status == TrialStatus::Ok && t.hit.is_some() {
            r.configs[i].read_from = t.hit.clone();
        }
        r.configs[i].trials.push(t);
        finish(r);
    }

    /// The default search's combination: every axis value whose median beat
    /// the plan's, the best per key; added as one more configuration unless
    /// it launches as one already measured.
    fn combine(
        &mut self,
        base: &crate::plan::PlanRequest,
        active: &mut Vec<usize>,
        runner: &dyn TrialRunner,
    ) -> Option<usize> {
        let r = &self.report;
        let plan = r.configs.iter().find(|c| c.name == "plan")?.throughput?;
        let mut better: Vec<(f64, (String, String))> = self
            .configs
            .iter()
            .zip(&r.configs)
            .filter_map(|(c, res)| {
                let m = res.throughput?.median;
                (m > plan.median)
                    .then(|| (m, c.axis.clone()))?
                    .1
                    .map(|a| (m, a))
            })
            .collect();
        better.sort_by(|a, b| b.0.total_cmp(&a.0));
        let axes: Vec<(String, String)> = better.into_iter().map(|(_, a)| a).collect();
        let c = grid::combined(base, &axes)?;
        let key = runner.launch_key(&c);
        if self.configs.iter().any(|x| {
            x.name == c.name
                || x.request == c.request
                || (key.is_some() && runner.launch_key(x) == key)
        }) {
            return None;
        }
        self.report
            .configs
            .push(ConfigResult::new(&c.name, describe(&c)));
        self.configs.push(c);
        let i = self.configs.len() - 1;
        active.push(i);
        Some(i)
    }

    /// The winner and the configurations it cannot be told apart from.
    fn close_race(&self, active: &[usize]) -> Vec<usize> {
        let r = &self.report;
        active
            .iter()
            .copied()
            .filter(|&i| {
                let c = &r.configs[i];
                r.winner.as_deref() == Some(c.name.as_str()) || c.indistinguishable_from_winner
            })
            .collect()
    }
}

/// Run every configuration `runs` times (after `warmup` rounds), interleaved;
/// then, up to `max_runs`, more rounds of the winner and the configurations it
/// cannot be told apart from, while there are any.
pub fn tune(
    configs: &[TuneConfig],
    mut report: TuneReport,
    opts: &TuneOptions,
    runner: &mut dyn TrialRunner,
    on_event: &mut dyn FnMut(Event),
) -> TuneReport {
    let (configs, same) = merge_same_launch(configs, runner);
    report.configs = configs
        .iter()
        .zip(same)
        .map(|(c, same)| ConfigResult {
            same_launch: same,
            ..ConfigResult::new(&c.name, describe(c))
        })
        .collect();
    report.baseline = configs
        .iter()
        .find(|c| c.name == "unset")
        .or(configs.first())
        .map(|c| c.name.clone());
    report.runs = opts.runs;
    report.warmup = opts.warmup;
    let mut total = configs.len() * (opts.runs + opts.warmup);
    on_event(Event::Start { total });
    let halving = match opts.strategy {
        Strategy::Auto => configs.len() > 8,
        s => s == Strategy::Halving,
    };
    let mut s = Session {
        configs: configs.clone(),
        opts,
        report,
        mode: None,
    };
    let mut active: Vec<usize> = (0..configs.len()).collect();
    let mut late: Option<usize> = None;
    for round in 0..opts.warmup + opts.runs {
        // Halving left one configuration (and no combination came): nothing
        // to compare it with, so no more rounds.
        if active.len() < 2 && active.len() < s.configs.len() && round > opts.warmup + 1 {
            total = s
                .report
                .configs
                .iter()
                .map(|c| c.trials.len())
                .sum::<usize>()
                + opts.warmup * s.configs.len();
            on_event(Event::Start { total });
            break;
        }
        if !s.round(&active.clone(), round, runner, on_event) {
            return s.report;
        }
        // One trial is no range: after the first measured round halving only
        // drops what is far behind; from the second, what is clearly worse.
        if round == opts.warmup && halving && round + 1 < opts.warmup + opts.runs {
            let far = far_behind(&s.report, &active);
            for &i in &far {
                s.report.configs[i].dropped_after_round = Some(0);
            }
            active.retain(|i| !far.contains(i));
        }
        if round == opts.warmup + 1 {
            if halving && round + 1 < opts.warmup + opts.runs {
                let worse = clearly_worse(&s.report, &active);
                for &i in &worse {
                    s.report.configs[i].dropped_after_round = Some(round - opts.warmup);
                }
                active.retain(|i| !worse.contains(i));
            }
            if let Some(base) = &opts.combine {
                late = s.combine(base, &mut active, &*runner);
                if late.is_some() {
                    total += opts.runs;
                    on_event(Event::Start { total });
                }
            }
        }
    }
    // A combination that joined late runs on beside the winner until it has
    // as many trials as the others.
    if let Some(c) = late {
        let mut round = opts.warmup + opts.runs;
        while s.report.configs[c].trials.len() < opts.runs {
            let winner = s
                .report
                .winner
                .as_ref()
                .and_then(|w| s.report.configs.iter().position(|x| &x.name == w));
            let mut which = vec![c];
            which.extend(winner.filter(|w| *w != c));
            total += which.len().saturating_sub(1);
            on_event(Event::Start { total });
            if !s.round(&which, round, runner, on_event) {
                return s.report;
            }
            round += 1;
        }
    }
    let first_extra = opts.warmup
        + s.report
            .configs
            .iter()
            .map(|c| c.trials.len())
            .max()
            .unwrap_or(0);
    for round in first_extra..opts.warmup + opts.max_runs.max(opts.runs) {
        let close = s.close_race(&active);
        if close.len() < 2 {
            break;
        }
        total += close.len();
        on_event(Event::Start { total });
        if !s.round(&close, round, runner, on_event) {
            return s.report;
        }
    }
    s.report.complete = true;
    finish(&mut s.report);
    on_event(Event::Updated(&s.report));
    s.report
}

/// An empty report for a run.
pub fn new_report(
    command: Vec<String>,
    nproc: usize,
    source: String,
    cpu_budget: f64,
) -> TuneReport {
    TuneReport {
        schema: TUNE_SCHEMA.to_string(),
        command,
        nproc,
        source,
        cpu_budget,
        runs: 0,
        warmup: 0,
        metric: MetricSource::Output,
        unit: "per s".into(),
        configs: vec![],
        baseline: None,
        winner: None,
        complete: false,
        warnings: vec![],
    }
}

#[cfg(test)]
mod tests;
