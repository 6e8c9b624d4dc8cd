//! The tuning loop: a race over the configurations. Rounds each in an order
//! shuffled from the report's seed (so drift hits all alike); after every
//! round from the second a look (race.rs) stops each row the model has
//! decided; the default search's combination joins after the second round;
//! rows still open after the base rounds run on beside the leader. Pure over
//! a `TrialRunner`, so tests (and the simulation) drive it.

use super::grid::{self, Role};
use super::model::{
    ConfigResult, Event, LaunchKey, MetricSource, NO_UNIT_YET, Strategy, TrialOutcome, TrialRunner,
    TuneOptions, TuneReport, Warning,
};
use super::outcome::{describe, finish, trial};
use super::race::{self, StopWhy, Stopped};
use super::{TrialEnd, TuneConfig};

/// The default search drops, after its first measured round, a configuration
/// whose trial is below this fraction of the round's best: a factor of two is
/// more than one trial moved between rounds in any measurement behind the
/// docs/tune.md (1.5 at most).
pub(crate) const FIRST_ROUND_CUT: f64 = 0.5;

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
    /// When the race looks, and at which level.
    looks: race::Looks,
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

/// The race: every configuration in each of the `runs` base rounds (after
/// `warmup` rounds), each round in a shuffled order; a look after every
/// measured round from the second stops each row the model has decided
/// (slower than the leader, or the same within the margin); after the base
/// rounds, the rows still open run beside the leader, up to `max_runs`
/// trials each. The reference is measured in every base round.
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
    let mut p = Progress { total, on_event };
    for round in 0..opts.warmup {
        if !s.round(&active.clone(), round, runner, p.on_event) {
            return s.report;
        }
    }
    let looks = s.looks;
    let halving = match opts.strategy {
        Strategy::Auto => s.configs.len() > 8,
        x => x == Strategy::Halving,
    };
    let mut m = 0;
    let mut late = None;
    loop {
        // One row left of several (or, after the base rounds, of any):
        // nothing to race. A late combination still gets its base rounds.
        let short = late
            .is_some_and(|c| active.contains(&c) && s.report.configs[c].trials.len() < opts.runs);
        if m >= looks.max && !short {
            break;
        }
        if active.len() < 2 && (m >= opts.runs || active.len() < s.configs.len()) {
            let done: usize = s.report.configs.iter().map(|c| c.trials.len()).sum();
            p.set(done + opts.warmup * s.configs.len());
            break;
        }
        if m >= opts.runs {
            s.extra_round(&active, m, &mut p);
        }
        if !s.round(&active.clone(), opts.warmup + m, runner, p.on_event) {
            return s.report;
        }
        m += 1;
        let left = opts.runs.saturating_sub(m);
        // One trial is no interval: after the first round halving drops only
        // what is far behind.
        if m == 1 && halving && left > 0 {
            let far = far_behind(&s.report, &active);
            for &i in &far {
                s.report.configs[i].dropped_after_round = Some(0);
                s.report.configs[i].stopped = Some(Stopped {
                    after_round: 1,
                    why: StopWhy::FarBehind,
                    leader: None,
                    vs_leader: None,
                });
            }
            active.retain(|i| !far.contains(i));
            p.less(far.len() * left);
        }
        if m == 2
            && let Some(base) = &opts.combine
        {
            late = s.combine(base, &mut active, &*runner);
            if late.is_some() {
                p.add(left);
            }
        }
        if let Some(level) = looks.level(m) {
            s.report.interval_level = level;
            finish(&mut s.report);
            let hold = m < opts.runs && opts.strategy == Strategy::All;
            let stopped = s.look(&active, m, hold);
            active.retain(|i| !stopped.contains(i));
            p.less(stopped.len() * left);
        }
    }
    s.report.complete = true;
    finish(&mut s.report);
    (p.on_event)(Event::Updated(&s.report));
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
        report.margin = opts.margin;
        report.max_runs = opts.max_runs.max(opts.runs);
        let looks = race::Looks::new(opts.runs, opts.max_runs);
        report.interval_level = looks.level(opts.runs).unwrap_or(1.0 - race::ALPHA);
        Session {
            configs,
            opts,
            report,
            mode: None,
            unit: None,
            seq: 0,
            looks,
        }
    }

    /// The look after `m` measured rounds: every row the model has decided
    /// against the leader stops (the leader never; the reference not before
    /// the base rounds end; with `hold`, none). Returns the rows stopped.
    fn look(&mut self, active: &[usize], m: usize, hold: bool) -> Vec<usize> {
        let looks = self.looks;
        let reference = self.reference();
        let r = &mut self.report;
        let Some(w) = r.index_of(r.winner.as_ref()) else {
            return vec![];
        };
        let leader = r.configs[w].name.clone();
        let mut out = vec![];
        for &i in active {
            if hold || i == w || (m < self.opts.runs && Some(i) == reference) {
                continue;
            }
            let c = &mut r.configs[i];
            let Some(p) = c.vs_winner.clone().filter(|p| p.ratios.len() >= 2) else {
                // Its trials failed: after the base rounds, nothing more to learn.
                let failed =
                    !c.trials.is_empty() && c.trials.iter().all(|t| t.throughput.is_none());
                if m >= self.opts.runs && failed && Some(i) != reference {
                    c.stopped = Some(Stopped {
                        after_round: m,
                        why: StopWhy::Unscored,
                        leader: Some(leader.clone()),
                        vs_leader: None,
                    });
                    c.dropped_after_round = Some(m - 1);
                    out.push(i);
                }
                continue;
            };
            let df = r.analysis.as_ref().map_or(0, |a| a.df);
            let estimate = p.estimate.unwrap_or(p.median);
            let call = race::call(
                estimate,
                (p.low, p.high),
                r.interval_level,
                df,
                self.opts.margin,
            );
            let why = match call {
                race::Call::Slower => StopWhy::Slower,
                race::Call::Same => StopWhy::Same,
                // The reference stays while undecided: every speed-up needs it.
                race::Call::Open
                    if m >= self.opts.runs
                        && Some(i) != reference
                        && race::cannot_overtake(
                            estimate,
                            (p.low, p.high),
                            (r.interval_level, looks.level(looks.max).unwrap_or(0.95)),
                            (c.trials.len(), looks.max),
                            df,
                        ) =>
                {
                    StopWhy::CannotOvertake
                }
                race::Call::Open => continue,
            };
            // The reference is never dropped: every speed-up is against it.
            if why == StopWhy::Slower && Some(i) != reference {
                c.dropped_after_round = Some(m - 1);
            }
            c.stopped = Some(Stopped {
                after_round: m,
                why,
                leader: Some(leader.clone()),
                vs_leader: Some(p),
            });
            out.push(i);
        }
        out
    }

    /// Before an extra round (after `m` measured rounds): the rows still open
    /// and the leader say why they run again.
    fn extra_round(&mut self, active: &[usize], m: usize, p: &mut Progress) {
        let r = &mut self.report;
        let w = r.index_of(r.winner.as_ref());
        for &i in active {
            let c = &mut r.configs[i];
            c.extra_rounds += 1;
            c.extra_why = Some(if Some(i) == w {
                "the winner, beside the undecided rows".to_string()
            } else {
                let v = c.vs_winner.as_ref();
                format!(
                    "not decided against the winner after {m} rounds{}",
                    v.map_or(String::new(), |v| format!(" [{:.2}-{:.2}]", v.low, v.high))
                )
            });
        }
        p.add(active.len());
    }
}
