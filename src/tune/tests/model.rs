//! The model's tests through the whole tune loop: a round that straddles
//! the machine's step, and one wild trial.

use std::collections::HashMap;
use std::time::Duration;

use super::super::*;
use super::{configs, opts};
use crate::measure::throughput::Metric;

/// A machine whose speed steps 1.5x before trial `step`: each configuration's
/// true rate times the machine's speed times a fixed pattern of +-1.5% noise.
struct Stepping {
    truth: HashMap<String, f64>,
    step: usize,
    calls: usize,
    /// A trial (by call) at this fraction of what it should be.
    wild: Option<(usize, f64)>,
}

impl TrialRunner for Stepping {
    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let n = self.calls;
        self.calls += 1;
        let noise = [0.0, 0.015, -0.01, 0.005, -0.015, 0.01, -0.005][(n * 3) % 7];
        let mut v = self.truth[&c.name] * (1.0 + noise);
        if n >= self.step {
            v *= 1.5;
        }
        if let Some((at, f)) = self.wild
            && at == n
        {
            v *= f;
        }
        TrialOutcome {
            hit: metric.scan(0, &format!("{v:.3} img/s")),
            wall: Duration::from_secs(2),
            cpu: Duration::from_secs(2),
            ..Default::default()
        }
    }
}

/// unset, a and b (at 50, 100 and 90) in five rounds on a `Stepping` machine.
fn stepped(step: usize, wild: Option<(usize, f64)>) -> TuneReport {
    let mut s = Stepping {
        truth: [("unset", 50.0), ("a", 100.0), ("b", 90.0)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
        step,
        calls: 0,
        wild,
    };
    tune(
        &configs(&["unset", "a", "b"]),
        new_report(vec![], 1, "x".into(), 2.0),
        &opts(5, 0, Strategy::All),
        &mut s,
        &mut |_| {},
    )
}

#[test]
fn a_round_that_straddles_a_step_is_split_and_the_comparison_stands() {
    // Three configurations, five rounds: the step falls inside round 2
    // (trials 6, 7, 8).
    let r = stepped(7, None);
    let a = r.analysis.as_ref().unwrap();
    assert_eq!(a.split_rounds, [2], "{a:?}");
    // 15 trials, 6 blocks (round 2 is two), 3 configurations: 15 - 6 - 2.
    assert_eq!(a.df, 7);
    let d = r.drift.expect("the step is reported");
    assert_eq!(d.at_trial, 7);
    assert_eq!(r.winner.as_deref(), Some("a"));
    let b = r.configs.iter().find(|c| c.name == "b").unwrap();
    let p = b.vs_winner.as_ref().unwrap();
    assert_eq!(p.verdict(), stats::Verdict::Slower, "{p:?}");
    assert!(
        (p.estimate.unwrap() - 0.9).abs() < 0.02,
        "the step does not bias it: {p:?}"
    );
    let text = report::render(&r);
    assert!(
        text.contains("round(s) 2 split in two blocks at the machine's step"),
        "{text}"
    );
}

#[test]
fn a_wild_trial_is_down_weighted_and_said() {
    // No step; trial 10 (round 3) at 55% of its rate.
    let r = stepped(usize::MAX, Some((10, 0.55)));
    let a = r.analysis.as_ref().unwrap();
    assert_eq!(a.down_weighted, 1, "{a:?}");
    let wild = r
        .configs
        .iter()
        .flat_map(|c| &c.trials)
        .find(|t| t.seq == 10)
        .unwrap();
    assert!(wild.weight.unwrap() < 0.3, "{wild:?}");
    let b = r.configs.iter().find(|c| c.name == "b").unwrap();
    assert_eq!(
        b.vs_winner.as_ref().unwrap().verdict(),
        stats::Verdict::Slower
    );
    let text = report::render(&r);
    assert!(text.contains("down-weighted to"), "{text}");
    assert!(text.contains("1 trial(s) down-weighted"), "{text}");
}
