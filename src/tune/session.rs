//! The tuning loop: rounds over the configurations, each in an order shuffled
//! from the report's seed (so drift hits all alike), halving, the default
//! search's combination, and more rounds, in blocks, for every row still
//! undecided against the winner. Pure
//! over a `TrialRunner`, so tests (and the simulation) drive it.

use super::grid::{self, Role};
use super::model::{
    ConfigResult, Event, LaunchKey, MetricSource, NO_UNIT_YET, Strategy, TrialOutcome, TrialRunner,
    TuneOptions, TuneReport, Warning,
};
use super::outcome::{by_round, describe, finish, trial};
use super::stats;
use super::{TrialEnd, TuneConfig};

/// The default search drops, after its first measured round, a configuration
/// whose trial is below this fraction of the round's best: a factor of two is
/// more than one trial moved between rounds in any measurement behind the
/// docs/tune.md (1.5 at most).
pub(crate) const FIRST_ROUND_CUT: f64 = 0.5;

/// Halving's second-round cut: a configuration below this fraction of the
/// leader in every round both ran. One trial's spread here is about 10%, so
/// two trials of equal configurations differ by up to about 20%.
pub(crate) const CLEARLY_WORSE: f64 = 0.8;

/// After one measured round: configurations (not the baseline, which every
/// speed-up needs) whose trial is below FIRST_ROUND_CUT of the best trial.
fn far_behind(report: &TuneReport, active: &[usize]) -> Vec<usize> {
    let value = |i: usize| report.configs[i].throughput.map(|t| t.median);
    let Some(best) = active.iter().filter_map(|&i| value(i)).reduce(f64::max) else {
        return vec![];
    };
    // A trial something else disturbed is no reason to drop its configuration.
    let disturbed = |i: usize| report.configs[i].trials.iter().any(|t| t.disturbed);
    active
        .iter()
        .copied()
        .filter(|&i| report.baseline.as_deref() != Some(report.configs[i].name.as_str()))
        .filter(|&i| !disturbed(i) && value(i).is_some_and(|v| v < FIRST_ROUND_CUT * best))
        .collect()
}

/// Configurations that launch exactly as an earlier one are left out; the
/// earlier one lists their names (and takes over the axis of a default-search
/// row, so the combination still sees it).
fn merge_same_launch(
    configs: &[TuneConfig],
    runner: &dyn TrialRunner,
) -> (Vec<TuneConfig>, Vec<Vec<String>>) {
    let mut kept: Vec<(Option<LaunchKey>, TuneConfig, Vec<String>)> = vec![];
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

/// Configurations clearly worse than the leader (not the baseline): in every
/// round both ran undisturbed (two at least), below CLEARLY_WORSE of the
/// leader's trial in that round. Paired, so drift between rounds cannot make
/// a configuration look worse; all rounds, so one trial never decides.
fn clearly_worse(report: &TuneReport, active: &[usize]) -> Vec<usize> {
    let Some(leader) = report.index_of(report.winner.as_ref()) else {
        return vec![];
    };
    let lead = by_round(&report.configs[leader], true);
    active
        .iter()
        .copied()
        .filter(|&i| i != leader)
        .filter(|&i| report.baseline.as_deref() != Some(report.configs[i].name.as_str()))
        .filter(|&i| {
            stats::paired(&by_round(&report.configs[i], true), &lead, 0.95)
                .is_some_and(|p| p.ratios.len() >= 2 && p.ratios.iter().all(|r| *r < CLEARLY_WORSE))
        })
        .collect()
}

/// Round `round`'s order of `which`: shuffled from the report's seed, so drift
/// within a round touches every configuration alike over the rounds.
fn order(which: &[usize], seed: u64, round: usize) -> Vec<usize> {
    let mut v = which.to_vec();
    let mut x = (seed ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// The tuning loop's state between trials.
struct Session<'a> {
    configs: Vec<TuneConfig>,
    opts: &'a TuneOptions,
    report: TuneReport,
    /// How throughput is read, decided by the first trial that succeeds: from
    /// the output when it printed a rate, else (for every trial) 1 / wall time.
    mode: Option<MetricSource>,
    /// The unit every scored trial must share, from that first trial (None:
    /// not decided yet, or a --metric pattern, which has none).
    unit: Option<String>,
    /// Measured trials so far: the next one's `seq`.
    seq: usize,
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
        let mut ordered = order(which, self.report.order_seed, round);
        // The first measured trial that succeeds decides how throughput is
        // read: let it be the reference's, whatever the shuffle says.
        if round == self.opts.warmup
            && let Some(r) = self.reference()
            && let Some(at) = ordered.iter().position(|&i| i == r)
        {
            let r = ordered.remove(at);
            ordered.insert(0, r);
        }
        for i in ordered {
            on_event(Event::TrialStart {
                config: &self.configs[i].name.clone(),
                round,
                warmup: warm,
            });
            let o = runner.run(&self.configs[i], &self.opts.metric);
            if o.end == TrialEnd::Interrupted {
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
        if self.mode.is_none() && o.end == TrialEnd::Ok {
            let m = if o.hit.is_some() {
                MetricSource::Output
            } else {
                r.warnings.push(Warning::WallMetric);
                MetricSource::Wall
            };
            self.unit = match m {
                MetricSource::Wall => Some("runs/s".into()),
                MetricSource::Output => o.hit.as_ref().and_then(|h| h.unit.clone()),
            };
            r.metric = m;
            r.unit = self.unit.clone().unwrap_or_else(|| NO_UNIT_YET.into());
            self.mode = Some(m);
        }
        let unit = match self.mode {
            Some(MetricSource::Output) => self.unit.as_deref(),
            _ => None,
        };
        let t = trial(
            o,
            round,
            self.opts.cpu_budget,
            self.mode.unwrap_or(MetricSource::Output),
            unit,
        );
        if t.status == super::TrialStatus::Ok && t.hit.is_some() {
            r.configs[i].read_from = t.hit.clone();
        }
        r.configs[i]
            .trials
            .push(super::Trial { seq: self.seq, ..t });
        self.seq += 1;
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
        let at = self.configs.iter().position(|c| c.role == Role::Plan)?;
        let plan = r.configs[at].throughput?;
        let mut better: Vec<(f64, grid::Change)> = self
            .configs
            .iter()
            .zip(&r.configs)
            .filter_map(|(c, res)| {
                let m = res.throughput?.median;
                Some((m, c.axis.clone()?)).filter(|_| m > plan.median)
            })
            .collect();
        better.sort_by(|a, b| b.0.total_cmp(&a.0));
        let axes: Vec<grid::Change> = better.into_iter().map(|(_, a)| a).collect();
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
            .push(ConfigResult::new(&c.name, c.role, describe(&c)));
        self.configs.push(c);
        let i = self.configs.len() - 1;
        active.push(i);
        Some(i)
    }

    /// The reference's index (every trial's `ratio` is to its trial in the round).
    fn reference(&self) -> Option<usize> {
        self.report.index_of(self.report.baseline.as_ref())
    }

    /// The rows still undecided against the winner (their interval holds
    /// 1.00), with the winner; nothing when every verdict is in. The
    /// reference runs only if it is one of them: the model compares rows
    /// whatever else ran in their rounds.
    fn undecided(&self, active: &[usize]) -> Vec<usize> {
        let r = &self.report;
        let Some(w) = r.index_of(r.winner.as_ref()) else {
            return vec![];
        };
        let open: Vec<usize> = active
            .iter()
            .copied()
            .filter(|&i| i != w)
            .filter(|&i| {
                r.configs[i]
                    .vs_winner
                    .as_ref()
                    .is_some_and(|p| p.verdict() == stats::Verdict::NotDistinguishable)
            })
            .collect();
        if open.is_empty() {
            return vec![];
        }
        std::iter::once(w).chain(open).collect()
    }
}

/// The progress total, said again whenever it changes.
struct Progress<'e> {
    total: usize,
    on_event: &'e mut dyn FnMut(Event),
}

impl Progress<'_> {
    fn set(&mut self, total: usize) {
        self.total = total;
        (self.on_event)(Event::Start { total });
    }
    fn add(&mut self, n: usize) {
        self.set(self.total + n);
    }
    fn less(&mut self, n: usize) {
        self.set(self.total - n);
    }
}

/// Run every configuration in `runs` rounds (after `warmup` rounds), each in a
/// shuffled order; then, while rows cannot be told apart from the winner,
/// blocks of `runs` more rounds of those rows and the winner, up to
/// `max_runs` trials each.
pub(crate) fn tune(
    configs: &[TuneConfig],
    report: TuneReport,
    opts: &TuneOptions,
    runner: &mut dyn TrialRunner,
    on_event: &mut dyn FnMut(Event),
) -> TuneReport {
    let mut s = Session::start(configs, report, opts, runner);
    let mut active: Vec<usize> = (0..s.configs.len()).collect();
    let total = s.configs.len() * (opts.runs + opts.warmup);
    on_event(Event::Start { total });
    let mut progress = Progress { total, on_event };
    let Some(late) = s.base_rounds(&mut active, runner, &mut progress) else {
        return s.report;
    };
    if let Some(c) = late
        && s.late_rounds(c, runner, &mut progress).is_none()
    {
        return s.report;
    }
    if s.undecided_rounds(&active, runner, &mut progress).is_none() {
        return s.report;
    }
    s.report.complete = true;
    finish(&mut s.report);
    (progress.on_event)(Event::Updated(&s.report));
    s.report
}

impl<'a> Session<'a> {
    /// The session over `configs`, those that launch alike merged, the
    /// report's frame filled in.
    fn start(
        configs: &[TuneConfig],
        mut report: TuneReport,
        opts: &'a TuneOptions,
        runner: &dyn TrialRunner,
    ) -> Session<'a> {
        let (configs, same) = merge_same_launch(configs, runner);
        report.configs = configs
            .iter()
            .zip(same)
            .map(|(c, same)| ConfigResult {
                same_launch: same,
                ..ConfigResult::new(&c.name, c.role, describe(c))
            })
            .collect();
        report.baseline = configs
            .iter()
            .find(|c| c.role == Role::Baseline)
            .or(configs.first())
            .map(|c| c.name.clone());
        report.runs = opts.runs;
        report.warmup = opts.warmup;
        report.order_seed = opts.seed;
        // The undecided rows are looked at after the base rounds and after each block
        // of as many more: every interval is at the level that keeps the whole
        // sequence of looks at 95%.
        report.interval_level =
            stats::per_look_level(opts.max_runs.max(opts.runs).div_ceil(opts.runs));
        Session {
            configs,
            opts,
            report,
            mode: None,
            unit: None,
            seq: 0,
        }
    }

    /// The base rounds, halving dropping configurations as it goes and the
    /// default search adding its combination after the second measured
    /// round; returns the combination that joined late, None if interrupted.
    fn base_rounds(
        &mut self,
        active: &mut Vec<usize>,
        runner: &mut dyn TrialRunner,
        p: &mut Progress,
    ) -> Option<Option<usize>> {
        let opts = self.opts;
        let rounds = opts.warmup + opts.runs;
        let halving = match opts.strategy {
            Strategy::Auto => self.configs.len() > 8,
            s => s == Strategy::Halving,
        };
        let mut late: Option<usize> = None;
        for round in 0..rounds {
            // Halving left one configuration (and no combination came): nothing
            // to compare it with, so no more rounds.
            if active.len() < 2 && active.len() < self.configs.len() && round > opts.warmup + 1 {
                let done: usize = self.report.configs.iter().map(|c| c.trials.len()).sum();
                p.set(done + opts.warmup * self.configs.len());
                break;
            }
            if !self.round(&active.clone(), round, runner, p.on_event) {
                return None;
            }
            let left = rounds - round - 1;
            // One trial is no range: after the first measured round halving only
            // drops what is far behind; from the second, what is clearly worse.
            if round == opts.warmup && halving && left > 0 {
                let far = far_behind(&self.report, active);
                for &i in &far {
                    self.report.configs[i].dropped_after_round = Some(0);
                }
                active.retain(|i| !far.contains(i));
                // The progress total loses the rounds they will not run.
                p.less(far.len() * left);
            }
            if round == opts.warmup + 1 {
                if halving && left > 0 {
                    let worse = clearly_worse(&self.report, active);
                    for &i in &worse {
                        self.report.configs[i].dropped_after_round = Some(round - opts.warmup);
                    }
                    active.retain(|i| !worse.contains(i));
                    p.less(worse.len() * left);
                }
                if let Some(base) = &opts.combine {
                    late = self.combine(base, active, &*runner);
                    if late.is_some() {
                        p.add(opts.runs);
                    }
                }
            }
        }
        Some(late)
    }

    /// A combination that joined late runs on beside the winner until it has
    /// as many trials as the others; None if interrupted.
    fn late_rounds(
        &mut self,
        c: usize,
        runner: &mut dyn TrialRunner,
        p: &mut Progress,
    ) -> Option<()> {
        let mut round = self.opts.warmup + self.opts.runs;
        while self.report.configs[c].trials.len() < self.opts.runs {
            let winner = self.report.index_of(self.report.winner.as_ref());
            let mut which = vec![c];
            which.extend(winner.filter(|w| *w != c));
            which.extend(self.reference().filter(|x| !which.contains(x)));
            p.add(which.len().saturating_sub(1));
            if !self.round(&which, round, runner, p.on_event) {
                return None;
            }
            round += 1;
        }
        Some(())
    }

    /// More rounds for every row still undecided against the winner, in
    /// blocks of --runs, up to --max-runs: the intervals' level counts on
    /// looks at block ends only. None if interrupted.
    fn undecided_rounds(
        &mut self,
        active: &[usize],
        runner: &mut dyn TrialRunner,
        p: &mut Progress,
    ) -> Option<()> {
        let opts = self.opts;
        let measured = self.report.configs.iter().map(|c| c.trials.len()).max();
        let last = opts.warmup + opts.max_runs.max(opts.runs);
        let mut round = opts.warmup + measured.unwrap_or(0);
        while round < last {
            let open = self.undecided(active);
            if open.len() < 2 {
                break;
            }
            let block = opts.runs.min(last - round);
            let look = round - opts.warmup;
            for (n, &i) in open.iter().enumerate() {
                let c = &mut self.report.configs[i];
                c.extra_rounds += block;
                c.extra_why = Some(if n == 0 {
                    "the winner, beside the undecided rows".to_string()
                } else {
                    let v = c.vs_winner.as_ref();
                    format!(
                        "not distinguishable from the winner after {look} rounds{}",
                        v.map_or(String::new(), |v| format!(" [{:.2}-{:.2}]", v.low, v.high))
                    )
                });
            }
            p.add(open.len() * block);
            for _ in 0..block {
                if !self.round(&open, round, runner, p.on_event) {
                    return None;
                }
                round += 1;
            }
        }
        Some(())
    }
}
