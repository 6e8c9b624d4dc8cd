//! The tune loop on a simulated machine, on every CI run: the real `tune()`
//! (rounds, shuffled orders, halving, the close pair's extra rounds, paired
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

/// A machine: its speed per trial (in the order trials run) and the noise.
struct Machine {
    speeds: Vec<f64>,
    sigma: f64,
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
        Machine { speeds, sigma }
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
        let v = self.truth[&c.name]
            * self.machine.speeds[at]
            * (self.machine.sigma * self.rng.normal()).exp();
        TrialOutcome {
            hit: metric.scan(0, &format!("threadwise: throughput={v} img/s")),
            wall: Duration::from_secs(2),
            cpu: Duration::from_secs(2),
            outside_cpu: Some(Duration::from_millis(20)),
            steal: Some(Duration::ZERO),
            ..Default::default()
        }
    }
}

/// One seeded tune over `configs` (name, true speed, role) on `drift`.
pub(super) fn scenario(seed: u64, configs: &[(&str, f64, Role)], drift: Drift) -> TuneReport {
    let mut rng = Rng(seed);
    let sigma = 0.05 + 0.10 * rng.unit();
    let runs = 5;
    let machine = Machine::new(drift, configs.len() * runs, sigma, &mut rng);
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
        assert!(called >= 0.90, "{called}");
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
        assert!(same >= 0.95, "{same}");
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
        assert!(found >= 0.95, "{found}");
        assert!(invented <= 0.05, "{invented}");
    }
}
