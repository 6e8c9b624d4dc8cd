//! The tune loop on a simulated machine, on every CI run: the real `tune()`
//! (rounds, shuffled orders, halving, the undecided rows' extra rounds, the model's
//! intervals, ties, drift) fed by a runner whose throughput is a true speed
//! per configuration x the machine's speed at that moment x log-normal noise.
//! Thousands of seeded scenarios in seconds; the rates docs/tune.md quotes.

use std::collections::HashMap;
use std::time::Duration;

use super::grid::Role;
use super::{Strategy, TrialOutcome, TrialRunner, TuneConfig, TuneOptions, TuneReport};
use crate::measure::throughput::Metric;
use crate::plan::PlanRequest;

/// splitmix64: small, seeded, good enough for noise.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// How the machine's own speed moves over the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Drift {
    Steady,
    /// 1.5x faster or slower from a random trial on (in the middle 80%).
    Step,
    /// Linearly to 1.5x faster or slower over the first `expected` trials.
    Ramp,
    /// A random walk whose typical end point is 1.5x away.
    Walk,
}

/// A machine: its speed per trial (in the order trials run) and the noise:
/// `sigma` of each trial's true rate, `line` of the line it is read from
/// (a rate printed over a window has its own noise), printed to 0.1.
struct Machine {
    speeds: Vec<f64>,
    sigma: f64,
    line: f64,
}

impl Machine {
    fn new(drift: Drift, expected: usize, sigma: f64, rng: &mut Rng) -> Machine {
        let n = expected * 4; // room for the extra rounds
        let up = if rng.unit() < 0.5 { 1.5f64 } else { 1.0 / 1.5 };
        let speeds = match drift {
            Drift::Steady => vec![1.0; n],
            Drift::Step => {
                let at = (expected as f64 * (0.1 + 0.8 * rng.unit())) as usize;
                (0..n).map(|i| if i >= at { up } else { 1.0 }).collect()
            }
            Drift::Ramp => (0..n)
                .map(|i| up.powf((i as f64 / expected as f64).min(1.0)))
                .collect(),
            Drift::Walk => {
                let step = 1.5f64.ln() / (expected as f64).sqrt();
                let mut level = 0.0;
                (0..n)
                    .map(|_| {
                        level += step * rng.normal();
                        level.exp()
                    })
                    .collect()
            }
        };
        Machine {
            speeds,
            sigma,
            line: 0.0,
        }
    }
}

/// A runner that prints `threadwise: throughput=...` as the machine gives it.
struct SimRunner {
    truth: HashMap<String, f64>,
    machine: Machine,
    rng: Rng,
    trials: usize,
}

impl TrialRunner for SimRunner {
    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let at = self.trials.min(self.machine.speeds.len() - 1);
        self.trials += 1;
        let v = 100.0
            * self.truth[&c.name]
            * self.machine.speeds[at]
            * (self.machine.sigma * self.rng.normal()).exp()
            * (self.machine.line * self.rng.normal()).exp();
        TrialOutcome {
            hit: metric.scan(0, &format!("threadwise: throughput={v:.1} img/s")),
            wall: Duration::from_secs(2),
            cpu: Duration::from_secs(2),
            outside_cpu: Some(Duration::from_millis(20)),
            steal: Some(Duration::ZERO),
            ..Default::default()
        }
    }
}

/// What a simulated tune is made of.
pub(super) struct Spec<'a> {
    /// (name, true speed, role).
    pub configs: &'a [(&'a str, f64, Role)],
    pub drift: Drift,
    /// Each trial's noise (log-normal sigma), drawn per tune from this range.
    pub sigma: (f64, f64),
    /// The noise of the line the rate is read from (log-normal sigma).
    pub line: f64,
    pub runs: usize,
}

impl<'a> Spec<'a> {
    /// The first simulation's machine: sigma 0.05-0.15, no line noise, 5 rounds.
    pub(super) fn old(configs: &'a [(&'a str, f64, Role)], drift: Drift) -> Spec<'a> {
        Spec {
            configs,
            drift,
            sigma: (0.05, 0.15),
            line: 0.0,
            runs: 5,
        }
    }
}

/// One seeded tune over `configs` (name, true speed, role) on `drift`.
pub(super) fn scenario(seed: u64, configs: &[(&str, f64, Role)], drift: Drift) -> TuneReport {
    simulate(seed, &Spec::old(configs, drift))
}

/// One seeded tune of `spec`.
pub(super) fn simulate(seed: u64, spec: &Spec) -> TuneReport {
    let mut rng = Rng(seed);
    let sigma = spec.sigma.0 + (spec.sigma.1 - spec.sigma.0) * rng.unit();
    let runs = spec.runs;
    let configs = spec.configs;
    let mut machine = Machine::new(spec.drift, configs.len() * runs, sigma, &mut rng);
    machine.line = spec.line;
    let cs: Vec<TuneConfig> = configs
        .iter()
        .map(|(name, _, role)| TuneConfig {
            name: name.to_string(),
            role: *role,
            request: PlanRequest {
                unset_threads: *role == Role::Baseline,
                ..Default::default()
            },
            axis: None,
        })
        .collect();
    let mut runner = SimRunner {
        truth: configs
            .iter()
            .map(|(n, v, _)| (n.to_string(), *v))
            .collect(),
        machine,
        rng,
        trials: 0,
    };
    let opts = TuneOptions {
        combine: None,
        runs,
        max_runs: super::DEFAULT_BLOCKS * runs,
        warmup: 0,
        strategy: Strategy::Auto,
        margin: super::DEFAULT_MARGIN_PCT.parse::<f64>().unwrap() / 100.0,
        metric: Metric::new(None).unwrap(),
        cpu_budget: 2.0,
        seed,
    };
    super::tune(
        &cs,
        super::new_report(vec![], 2, "sim".into(), 2.0),
        &opts,
        &mut runner,
        &mut |_| {},
    )
}

/// The share of `seeds` scenarios for which `ok` holds, over the drifts.
pub(super) fn rate(
    seeds: u64,
    configs: &[(&str, f64, Role)],
    drifts: &[Drift],
    ok: impl Fn(&TuneReport) -> bool,
) -> f64 {
    let mut good = 0;
    for seed in 0..seeds {
        let drift = drifts[(seed as usize) % drifts.len()];
        if ok(&scenario(seed * 7919 + 1, configs, drift)) {
            good += 1;
        }
    }
    good as f64 / seeds as f64
}

/// The issue-44 grid: `unset`, then threads=1 and threads=2 under two wait
/// policies that change nothing (two A/A pairs); threads=2 is `slower` times
/// threads=1's speed.
/// With `wide`, three rows more (8 in all): threads=3 at 0.95 and threads=4
/// under both policies at 0.6.
pub(super) fn grid(slower: f64, wide: bool) -> Vec<(&'static str, f64, Role)> {
    let mut v = vec![
        ("unset", 0.7, Role::Baseline),
        ("t1-active", 1.0, Role::GridPoint),
        ("t1-passive", 1.0, Role::GridPoint),
        ("t2-active", slower, Role::GridPoint),
        ("t2-passive", slower, Role::GridPoint),
    ];
    if wide {
        v.extend([
            ("t3", 0.95, Role::GridPoint),
            ("t4-active", 0.6, Role::GridPoint),
            ("t4-passive", 0.6, Role::GridPoint),
        ]);
    }
    v
}

/// What a batch of grid tunes showed.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct GridFigures {
    pub tunes: usize,
    /// The winner is a threads=1 row.
    pub winner_right: usize,
    /// threads=2 rows against the winner: called slower, of `comparisons`.
    pub slower_called: usize,
    pub comparisons: usize,
    /// Of those, called within the base rounds (no extra round for it).
    pub called_in_base: usize,
    /// The other threads=1 row called different from the winner.
    pub aa_different: usize,
    pub drift_reported: usize,
    /// Trials run, all tunes together.
    pub trials: usize,
}

/// n of `of`, as a fraction (0 of none).
fn share(n: usize, of: usize) -> f64 {
    n as f64 / of.max(1) as f64
}

impl GridFigures {
    pub(super) fn called(&self) -> f64 {
        share(self.slower_called, self.comparisons)
    }
    pub(super) fn aa(&self) -> f64 {
        share(self.aa_different, self.tunes)
    }
    pub(super) fn drift(&self) -> f64 {
        share(self.drift_reported, self.tunes)
    }
    pub(super) fn right(&self) -> f64 {
        share(self.winner_right, self.tunes)
    }
    pub(super) fn in_base(&self) -> f64 {
        share(self.called_in_base, self.comparisons)
    }
    pub(super) fn trials_per_tune(&self) -> f64 {
        share(self.trials, self.tunes)
    }
}

/// `seeds` tunes of the grid (5 rows, 8 with `wide`) with threads=2 at `slower`, trial noise 3-10%,
/// a line noise of 2%, on `drift`.
pub(super) fn grid_figures(seeds: u64, slower: f64, drift: Drift, wide: bool) -> GridFigures {
    use crate::tune::stats::Verdict;
    let configs = grid(slower, wide);
    let spec = Spec {
        configs: &configs,
        drift,
        sigma: (0.03, 0.10),
        line: 0.02,
        runs: 5,
    };
    let mut f = GridFigures::default();
    for seed in 0..seeds {
        let r = simulate(seed * 104_729 + 17, &spec);
        f.tunes += 1;
        f.trials += r.configs.iter().map(|c| c.trials.len()).sum::<usize>();
        f.drift_reported += usize::from(r.drift.is_some());
        let w = r.winner.as_deref().unwrap_or("");
        if w.starts_with("t1") {
            f.winner_right += 1;
            let other = if w == "t1-active" {
                "t1-passive"
            } else {
                "t1-active"
            };
            let config = |name: &str| r.configs.iter().find(|c| c.name == name);
            let verdict = |name: &str| {
                config(name)
                    .and_then(|c| c.vs_winner.as_ref())
                    .map(|p| p.verdict())
            };
            if verdict(other).is_some_and(|v| v != Verdict::NotDistinguishable) {
                f.aa_different += 1;
            }
            for t2 in ["t2-active", "t2-passive"] {
                f.comparisons += 1;
                if verdict(t2) == Some(Verdict::Slower) {
                    f.slower_called += 1;
                    if config(t2).is_some_and(|c| c.extra_rounds == 0) {
                        f.called_in_base += 1;
                    }
                }
            }
        } else {
            f.comparisons += 2;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::stats::Verdict;

    const DRIFTING: [Drift; 3] = [Drift::Step, Drift::Ramp, Drift::Walk];
    const SEEDS: u64 = 600;

    fn config<'a>(r: &'a TuneReport, name: &str) -> &'a crate::tune::ConfigResult {
        r.configs.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn a_true_10_percent_is_ranked_right_under_drift() {
        let cs = [
            ("unset", 0.5, Role::Baseline),
            ("a", 1.0, Role::GridPoint),
            ("b", 1.1, Role::GridPoint),
        ];
        let right = rate(SEEDS, &cs, &DRIFTING, |r| r.winner.as_deref() == Some("b"));
        eprintln!("10% difference ranked right: {:.1}%", right * 100.0);
        assert!(right >= 0.95, "{right}");
    }

    #[test]
    fn a_true_20_percent_is_called() {
        let cs = [("unset", 1.0, Role::Baseline), ("c", 1.2, Role::GridPoint)];
        let called = rate(SEEDS, &cs, &DRIFTING, |r| {
            config(r, "c").speedup_low.is_some_and(|l| l > 1.0)
        });
        eprintln!("20% difference called: {:.1}%", called * 100.0);
        assert!(called >= 0.85, "{called}");
    }

    #[test]
    fn identical_configurations_are_not_distinguishable() {
        let cs = [
            ("unset", 0.5, Role::Baseline),
            ("a", 1.0, Role::GridPoint),
            ("a2", 1.0, Role::GridPoint),
        ];
        let same = rate(SEEDS, &cs, &DRIFTING, |r| {
            let other = if r.winner.as_deref() == Some("a") {
                "a2"
            } else {
                "a"
            };
            config(r, other)
                .vs_winner
                .as_ref()
                .is_some_and(|p| p.verdict() == Verdict::NotDistinguishable)
        });
        eprintln!("A/A not distinguishable: {:.1}%", same * 100.0);
        assert!(same >= 0.93, "{same}");
    }

    /// The figures docs/tune.md quotes, 1,000 tunes each:
    /// `cargo test --release --lib grid_figures -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn grid_figures_for_the_docs() {
        for (what, slower, drift, wide) in [
            ("20%, steady", 1.0 / 1.2, Drift::Steady, false),
            ("20%, 1.5x step", 1.0 / 1.2, Drift::Step, false),
            ("10%, steady", 1.0 / 1.1, Drift::Steady, false),
            ("10%, 1.5x step", 1.0 / 1.1, Drift::Step, false),
            ("8 rows, 20%, steady", 1.0 / 1.2, Drift::Steady, true),
            ("8 rows, 20%, 1.5x step", 1.0 / 1.2, Drift::Step, true),
        ] {
            let tunes = std::env::var("SIM_TUNES").map_or(1000, |v| v.parse().unwrap());
            let f = grid_figures(tunes, slower, drift, wide);
            eprintln!(
                "{what}: threads=2 called slower {:.1}% ({:.1}% in the base rounds), \
                 A/A called different {:.1}%, winner right {:.1}%, drift reported {:.1}%, \
                 {:.1} trials per tune",
                f.called() * 100.0,
                f.in_base() * 100.0,
                f.aa() * 100.0,
                f.right() * 100.0,
                f.drift() * 100.0,
                f.trials_per_tune()
            );
        }
    }

    /// A shape like the main job's (docs/tune.md): 13 rows, nine within 5% of
    /// each other, three slow ones, 300 tunes at three noise levels, the
    /// winner within 5% of the best in 99% at least:
    /// `cargo test --release --lib main_job_shape -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn main_job_shape_figures() {
        let cs = [
            ("unset", 0.67, Role::Baseline),
            ("threads=4", 0.69, Role::GridPoint),
            ("threads=2", 0.72, Role::GridPoint),
            ("threads=1", 0.96, Role::GridPoint),
            ("seed", 0.95, Role::GridPoint),
            ("plan", 1.0, Role::Plan),
            ("workers=0", 0.92, Role::GridPoint),
            ("workers=1", 0.95, Role::GridPoint),
            ("workers=4", 0.93, Role::GridPoint),
            ("tcmalloc", 1.03, Role::GridPoint),
            ("jemalloc", 0.95, Role::GridPoint),
            ("passive", 0.98, Role::GridPoint),
            ("active", 1.0, Role::GridPoint),
        ];
        let best = cs.iter().map(|c| c.1).fold(0.0, f64::max);
        let speed = |name: &str| cs.iter().find(|c| c.0 == name).map_or(0.0, |c| c.1);
        for sigma in [(0.02, 0.04), (0.03, 0.10), (0.10, 0.17)] {
            let spec = Spec {
                configs: &cs,
                drift: Drift::Steady,
                sigma,
                line: 0.02,
                runs: 5,
            };
            let (mut trials, mut near, n) = (0, 0, 300);
            for seed in 0..n {
                let r = simulate(seed * 104_729 + 17, &spec);
                trials += r.configs.iter().map(|c| c.trials.len()).sum::<usize>();
                near += usize::from(speed(r.winner.as_deref().unwrap_or("")) >= best * 0.95);
            }
            eprintln!(
                "noise {:.0}-{:.0}%: {:.1} trials per tune, the winner within 5% of the best in {:.1}%",
                sigma.0 * 100.0,
                sigma.1 * 100.0,
                trials as f64 / n as f64,
                near as f64 * 100.0 / n as f64
            );
            assert!(near as u64 * 100 >= n * 99, "{sigma:?}: {near} of {n}");
        }
    }

    /// The issue-44 and issue-62 targets on fewer tunes (the ignored test
    /// above runs the 1,000 the docs quote): a 20% difference against the
    /// winner called in 95% of steady tunes (95% within the base rounds: 95.3%
    /// here, 95.9% on 1,000) and 90% with a step, 10% in 60%, the A/A pair beside the
    /// winner called different in at most 5%, the winner right, at most 28
    /// trials a tune.
    #[test]
    fn the_grid_calls_real_differences_and_not_an_aa_pair() {
        let steady = grid_figures(150, 1.0 / 1.2, Drift::Steady, false);
        let step = grid_figures(150, 1.0 / 1.2, Drift::Step, false);
        let ten = grid_figures(150, 1.0 / 1.1, Drift::Steady, false);
        eprintln!("{steady:?}\n{step:?}\n{ten:?}");
        assert!(steady.called() >= 0.95, "{steady:?}");
        assert!(step.called() >= 0.90, "{step:?}");
        assert!(ten.called() >= 0.60, "{ten:?}");
        let aa = (steady.aa_different + step.aa_different + ten.aa_different) as f64 / 450.0;
        assert!(aa <= 0.05, "A/A called different in {aa}");
        assert!(steady.in_base() >= 0.95, "{steady:?}");
        for f in [steady, step] {
            assert!(f.right() >= 0.99, "{f:?}");
            assert!(f.trials_per_tune() <= 28.0, "{f:?}");
        }
        assert!(ten.right() >= 0.98, "{ten:?}");
        assert!(
            step.drift() >= 0.90 && steady.drift() <= 0.05,
            "{step:?} {steady:?}"
        );
    }

    #[test]
    fn a_step_is_reported_and_a_steady_machine_is_not() {
        let cs = [
            ("unset", 1.0, Role::Baseline),
            ("a", 1.2, Role::GridPoint),
            ("b", 0.9, Role::GridPoint),
        ];
        let found = rate(SEEDS, &cs, &[Drift::Step], |r| r.drift.is_some());
        let invented = rate(SEEDS, &cs, &[Drift::Steady], |r| r.drift.is_some());
        eprintln!(
            "1.5x step reported: {:.1}%; drift invented on a steady machine: {:.1}%",
            found * 100.0,
            invented * 100.0
        );
        assert!(found >= 0.92, "{found}");
        assert!(invented <= 0.05, "{invented}");
    }
}
