//! `tune`: run the user's command (or the built-in workload) under several
//! configurations, in rounds of shuffled order (each round a block of one
//! model, so drift between rounds cancels), and report throughput, CPU and
//! GPU use with honest statistics.
//! The parts: `grid` (which configurations, typed), `model` (trials, results,
//! the report), `fit` (the model of the whole table behind every interval), `session` (the loop, pure over a `TrialRunner`, so tests drive
//! it with a mock), `outcome` (trials into figures), `runner` (the real runner,
//! launching ranks through `launch`), `export` (report files).

pub(crate) mod export;
mod fit;
pub(crate) mod grid;
mod model;
mod outcome;
mod race;
pub(crate) mod report;
pub(crate) mod runner;
mod session;
#[cfg(test)]
mod sim;
pub(crate) mod srun;
pub(crate) mod stats;
mod trial;

pub(crate) use grid::TuneConfig;
pub(crate) use model::{
    ConfigResult, Event, LaunchKey, NodeUsage, Strategy, Trial, TrialEnd, TrialOutcome,
    TrialRunner, TrialStatus, TuneOptions, TuneReport, new_report,
};
pub(crate) use race::DEFAULT_MARGIN_PCT;
pub(crate) use session::{FIRST_ROUND_CUT, tune};

/// The undecided rows' budget: up to this many blocks of --runs rounds (the base
/// rounds are the first), so `--max-runs` defaults to 4 x `--runs`.
pub(crate) const DEFAULT_BLOCKS: usize = 4;

#[cfg(test)]
mod tests;
