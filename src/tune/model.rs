//! What tune measures and reports: how a trial ended, the trials and
//! configurations as reported, the report itself, and the runner's trait.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::TuneConfig;
use super::grid::Role;
use super::stats::{Paired, Summary};
use crate::measure::throughput::{self as metric, Metric};

fn default_level() -> f64 {
    0.95
}

fn default_role() -> Role {
    Role::User
}
use crate::job::Exit;

pub(crate) const TUNE_SCHEMA: &str = "threadwise.tune/1";

/// The unit shown before any trial has printed one.
pub(crate) const NO_UNIT_YET: &str = "per s";

/// How one launch of a configuration ended, from the runner to the report
/// (nextest's `ExecutionResult`): one value, never re-classified later.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum TrialEnd {
    /// Every rank exited 0.
    #[default]
    Ok,
    /// A rank exited non-zero or was killed: the first one that did.
    RankFailed {
        local_rank: usize,
        pid: i32,
        exit: Exit,
    },
    /// Stopped after --timeout.
    TimedOut,
    /// The user pressed Ctrl-C (or sent a signal): stop tuning.
    Interrupted,
    /// Could not start at all (a plan this machine cannot satisfy, a missing
    /// allocator...): why.
    NotStarted(String),
}

impl TrialEnd {
    /// The trial's status, before the metric is looked at.
    pub(crate) fn status(&self) -> TrialStatus {
        match self {
            TrialEnd::Ok => TrialStatus::Ok,
            TrialEnd::RankFailed { .. } => TrialStatus::Failed,
            TrialEnd::TimedOut => TrialStatus::Timeout,
            TrialEnd::Interrupted => TrialStatus::Interrupted,
            TrialEnd::NotStarted(_) => TrialStatus::Error,
        }
    }

    /// What the report says of an unsuccessful end.
    pub(crate) fn message(&self) -> Option<String> {
        match self {
            TrialEnd::Ok | TrialEnd::Interrupted => None,
            TrialEnd::RankFailed {
                local_rank,
                pid,
                exit,
            } => Some(format!("rank {local_rank} (pid {pid}) {}", exit.describe())),
            TrialEnd::TimedOut => Some("timed out".into()),
            TrialEnd::NotStarted(why) => Some(why.clone()),
        }
    }
}

/// What one launch of a configuration produced (from the runner).
#[derive(Debug, Clone, Default)]
pub(crate) struct TrialOutcome {
    pub end: TrialEnd,
    /// The last throughput the ranks printed (the metric applied as lines arrived).
    pub hit: Option<metric::Hit>,
    pub wall: Duration,
    pub cpu: Duration,
    pub voluntary_cs: i64,
    pub involuntary_cs: i64,
    pub peak_rss_kib: i64,
    pub stderr_tail: Vec<String>,
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_mib: Option<f64>,
    /// Memory the job's own processes held on its GPUs (NVML's process list).
    pub gpu_job_mem_mib: Option<f64>,
    /// Other processes seen on the job's GPUs during the trial.
    pub gpu_others: Vec<String>,
    /// CPU time the machine spent outside the job during the trial (all CPUs'
    /// busy time less the job's own), and time stolen by the hypervisor;
    /// None where /proc/stat could not be read.
    pub outside_cpu: Option<Duration>,
    pub steal: Option<Duration>,
    /// Multi-node trials: every node's report, by node rank.
    pub nodes: Vec<NodeUsage>,
    /// The figures global rank 0 printed (`threadwise: figure NAME=N`), the
    /// last of each name.
    pub figures: std::collections::BTreeMap<String, f64>,
}

impl TrialOutcome {
    /// An outcome of a trial that could not start.
    pub(crate) fn not_started(why: String) -> TrialOutcome {
        TrialOutcome {
            end: TrialEnd::NotStarted(why),
            ..Default::default()
        }
    }
}

pub(crate) use crate::measure::usage::NodeUsage;

/// A node's figures in one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeTrial {
    pub host: String,
    pub cpu_util_pct: f64,
    pub gpu_util_pct: Option<f64>,
}

/// A node's figures over a configuration's trials (medians).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeSummary {
    pub host: String,
    pub cpu_util_pct: Option<f64>,
    pub gpu_util_pct: Option<f64>,
}

/// Runs one configuration once, applying `metric` to the output as it streams.
pub(crate) trait TrialRunner {
    fn run(&mut self, config: &TuneConfig, metric: &Metric) -> TrialOutcome;
    /// What a configuration launches (environment, CPU and memory placement,
    /// argv of every rank), so that two configurations which launch the same
    /// thing are measured once. None: unknown, never merged.
    fn launch_key(&self, _config: &TuneConfig) -> Option<LaunchKey> {
        None
    }
}

/// What a configuration launches, compared whole (`Eq`): every rank's
/// environment, placement and argv, for a fixed port and run id.
pub(crate) type LaunchKey = Vec<crate::job::trial::RankLaunch>;

/// How one trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TrialStatus {
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
    pub(crate) fn name(self) -> &'static str {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Warning {
    /// Tuning stopped early; the report holds what was measured.
    Interrupted { config: String, round: usize },
    /// No throughput in the output: configurations are ranked by 1 / wall time.
    WallMetric,
    /// The machine's own speed moved this much during the tune.
    Drift { ratio: f64 },
    /// Processes outside the job used its GPUs during these trials.
    GpuShared { trials: usize, others: Vec<String> },
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
            Warning::Drift { ratio } => write!(
                f,
                "the machine's speed moved {ratio:.2}x during this tune; each round is a block of the model, so the move cancels"
            ),
            Warning::GpuShared { trials, others } => {
                let shown: Vec<&str> = others.iter().take(4).map(String::as_str).collect();
                write!(
                    f,
                    "another process used the job's GPUs during {trials} trial(s): {}{}; GPU % and memory include its load",
                    shown.join(", "),
                    if others.len() > 4 {
                        format!(" and {} more", others.len() - 4)
                    } else {
                        String::new()
                    }
                )
            }
        }
    }
}

/// Where the throughput came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MetricSource {
    /// Parsed from the ranks' output (--metric or the default shapes).
    Output,
    /// 1 / wall time, because the output had none.
    Wall,
}

/// One measured trial, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Trial {
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
    /// Memory the job's own processes held on its GPUs.
    #[serde(default)]
    pub gpu_job_mem_mib: Option<f64>,
    /// Other processes seen on the job's GPUs during this trial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_others: Vec<String>,
    pub message: Option<String>,
    pub stderr_tail: Vec<String>,
    /// The line the throughput was read from (rank, text, unit).
    #[serde(default)]
    pub hit: Option<metric::Hit>,
    /// Further than 3 scaled MADs from its configuration's median.
    #[serde(default)]
    pub outlier: bool,
    /// When it ran: 0 for the first measured trial of the tune, then 1, 2 ...
    #[serde(default)]
    pub seq: usize,
    /// This trial's throughput over the reference's in the same round.
    #[serde(default)]
    pub ratio: Option<f64>,
    /// CPU seconds the machine spent outside the job during the trial.
    #[serde(default)]
    pub outside_cpu_s: Option<f64>,
    /// CPU seconds the hypervisor stole during the trial (/proc/stat steal).
    #[serde(default)]
    pub steal_s: Option<f64>,
    /// (outside + steal) / (wall x CPU budget): the share of the machine that
    /// something else took.
    #[serde(default)]
    pub disturbance: Option<f64>,
    /// Multi-node trials: each node's CPU and GPU use, by node rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeTrial>,
    /// disturbance above DISTURBED.
    #[serde(default)]
    pub disturbed: bool,
    /// Its weight in the model's robust fit (1: fully counted; below 1: a
    /// trial far from what its round and configuration predict); None
    /// outside the fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// The figures the client printed beside its throughput.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub figures: std::collections::BTreeMap<String, f64>,
}

/// A trial is disturbed when something outside the job took more than this
/// share of the CPU budget during it (on this 2-core machine an idle
/// neighbourhood measures 0-3%).
pub(crate) const DISTURBED: f64 = 0.10;

/// Two configurations the data cannot tell apart, and which one was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Tie {
    /// The leader and every configuration not distinguishable from it.
    pub configs: Vec<String>,
    /// How the winner was chosen among them.
    pub rule: String,
}

/// One configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ConfigResult {
    pub name: String,
    /// Why it is in the table (baseline, guide, plan, one-change, ...).
    #[serde(default = "default_role")]
    pub role: Role,
    pub options: String,
    pub throughput: Option<Summary>,
    /// Against the reference (`baseline`): the model's estimate (tune::fit;
    /// the per-round ratios are each trial's `ratio`), with its interval at
    /// the report's level.
    pub speedup: Option<f64>,
    #[serde(default)]
    pub speedup_low: Option<f64>,
    #[serde(default)]
    pub speedup_high: Option<f64>,
    /// Against the winner, round by round (None for the winner itself).
    #[serde(default)]
    pub vs_winner: Option<Paired>,
    pub cpu_util_pct: Option<f64>,
    pub voluntary_cs_per_s: Option<f64>,
    pub involuntary_cs_per_s: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    /// Utilisation of the job's GPUs (median of trials); memory in use on
    /// them, every process's (peak); memory the job's own processes held (peak).
    pub gpu_util_pct: Option<f64>,
    pub gpu_mem_mib: Option<f64>,
    #[serde(default)]
    pub gpu_job_mem_mib: Option<f64>,
    /// Multi-node: each node's CPU and GPU use (medians of its trials).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSummary>,
    /// Its interval against the winner holds 1.00: the data cannot
    /// tell them apart.
    pub indistinguishable_from_winner: bool,
    /// Out of the race after this round (0: the first measured): it can
    /// never be the winner (far behind, or slower than the leader).
    pub dropped_after_round: Option<usize>,
    /// Why it stopped being measured before the race ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<super::race::Stopped>,
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
    /// Rounds it ran beyond --runs because its verdict against the winner
    /// was undecided (or because it was the winner those rows needed).
    #[serde(default)]
    pub extra_rounds: usize,
    /// Why it got them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_why: Option<String>,
    /// Each figure over its scored trials: median and its 95% interval.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub figures: std::collections::BTreeMap<String, Summary>,
    pub trials: Vec<Trial>,
}

/// The whole report (`--export-json`, schema threadwise.tune/1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TuneReport {
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
    /// The reference of every speed-up (the unset baseline where there is one).
    pub baseline: Option<String>,
    pub winner: Option<String>,
    /// False while running and when interrupted.
    pub complete: bool,
    pub warnings: Vec<Warning>,
    /// The seed of each round's order (the same seed gives the same orders).
    #[serde(default)]
    pub order_seed: u64,
    /// The two-sided level of every interval: 95% over the whole run
    /// of looks at the rows (race::Looks): the last look's.
    #[serde(default = "default_level")]
    pub interval_level: f64,
    /// Set when the winner could not be told apart from others.
    #[serde(default)]
    pub tie: Option<Tie>,
    /// Two configurations within ±margin of each other are the same (a
    /// fraction: 0.05 is ±5%; --margin).
    #[serde(default)]
    pub margin: f64,
    /// The most measured trials a row could get (--max-runs).
    #[serde(default)]
    pub max_runs: usize,
    /// The machine's speed changed during the run (see stats::drift).
    #[serde(default)]
    pub drift: Option<super::stats::Drift>,
    /// Multi-node: the hosts that took part, by node rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// The model every interval and verdict came from.
    #[serde(default)]
    pub analysis: Option<Analysis>,
}

/// The model behind the intervals, as the report states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Analysis {
    /// In words: "log throughput = round + configuration + noise ...".
    pub model: String,
    /// Scored trials in the fit.
    pub trials: usize,
    /// Residual degrees of freedom (trials less blocks less configurations
    /// plus one).
    pub df: usize,
    /// The noise of one trial, as a fraction (exp(sigma) - 1).
    pub noise: Option<f64>,
    /// Trials the robust fit gave a weight below 1/2.
    pub down_weighted: usize,
    /// Rounds split in two blocks at the machine's step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split_rounds: Vec<usize>,
    /// How the level of each look was set.
    pub correction: String,
}

impl TuneReport {
    /// The index of the configuration a report field names (`baseline`, `winner`).
    pub(crate) fn index_of(&self, name: Option<&String>) -> Option<usize> {
        let name = name?;
        self.configs.iter().position(|c| &c.name == name)
    }

    /// Whether `c` is the winner (how the others compare is `vs_winner`).
    pub(crate) fn is_winner(&self, c: &ConfigResult) -> bool {
        self.winner.as_deref() == Some(c.name.as_str())
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Strategy ("a strategy,") {
        /// The race; with more than 8 configurations, halving's first-round cut too.
        Auto => "auto",
        /// Every configuration in every base round; the race stops rows from the last on.
        All => "all",
        /// The race, and after the first round drop what is below half of the round's best.
        Halving => "halving",
    }
}

/// How to tune.
#[derive(Debug, Clone)]
pub(crate) struct TuneOptions {
    /// With the default search: the plan's request, to combine the axis
    /// values that beat the plan into one more configuration.
    pub combine: Option<crate::plan::PlanRequest>,
    pub runs: usize,
    /// Extra rounds, up to this many trials, for rows undecided against the
    /// winner (>= runs).
    pub max_runs: usize,
    pub warmup: usize,
    pub strategy: Strategy,
    /// Rows whose interval against the leader lies within ±margin stop as
    /// the same (a fraction; 0 never).
    pub margin: f64,
    pub metric: Metric,
    pub cpu_budget: f64,
    /// The seed of the rounds' orders (printed in the report).
    pub seed: u64,
}

/// Progress events for the caller (progress bar, file rewrites).
pub(crate) enum Event<'a> {
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
    pub(crate) fn new(name: &str, role: Role, options: String) -> ConfigResult {
        ConfigResult {
            name: name.to_string(),
            role,
            options,
            throughput: None,
            nodes: vec![],
            speedup: None,
            speedup_low: None,
            speedup_high: None,
            vs_winner: None,
            cpu_util_pct: None,
            voluntary_cs_per_s: None,
            involuntary_cs_per_s: None,
            peak_rss_mib: None,
            gpu_util_pct: None,
            gpu_mem_mib: None,
            gpu_job_mem_mib: None,
            indistinguishable_from_winner: false,
            dropped_after_round: None,
            stopped: None,
            same_launch: vec![],
            read_from: None,
            slow_first_trial: false,
            extra_rounds: 0,
            extra_why: None,
            figures: Default::default(),
            trials: vec![],
        }
    }
}

/// An empty report for a run.
pub(crate) fn new_report(
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
        unit: NO_UNIT_YET.into(),
        configs: vec![],
        baseline: None,
        winner: None,
        complete: false,
        warnings: vec![],
        order_seed: 0,
        interval_level: 0.95,
        tie: None,
        margin: 0.0,
        max_runs: 0,
        drift: None,
        hosts: vec![],
        analysis: None,
    }
}
