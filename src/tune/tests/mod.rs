mod model;
mod race;
use std::collections::HashMap;
use std::time::Duration;

use crate::measure::throughput::Metric;

use super::model::{MetricSource, Warning};
use super::*;
use crate::plan::PlanRequest;

/// Prints "N img/s" from a fixed list per configuration, in turn.
struct Fake {
    rates: HashMap<String, Vec<f64>>,
    calls: Vec<String>,
    interrupt_at: Option<usize>,
    /// What each configuration launches (launch_key); absent: unknown.
    keys: HashMap<String, String>,
}

impl TrialRunner for Fake {
    fn launch_key(&self, c: &TuneConfig) -> Option<LaunchKey> {
        self.keys.get(&c.name).map(|k| key_of(k))
    }

    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        self.calls.push(c.name.clone());
        if Some(self.calls.len()) == self.interrupt_at {
            return TrialOutcome {
                end: TrialEnd::Interrupted,
                ..Default::default()
            };
        }
        // Each configuration's list in turn, from the start again when used up.
        let done = self.calls.iter().filter(|n| **n == c.name).count() - 1;
        let list = &self.rates[&c.name];
        let r = list[done % list.len()];
        if r < 0.0 {
            return TrialOutcome {
                end: TrialEnd::RankFailed {
                    local_rank: 0,
                    pid: 4121,
                    exit: crate::job::Exit::Code(1),
                },
                stderr_tail: vec!["Traceback".into()],
                wall: Duration::from_secs(1),
                ..Default::default()
            };
        }
        TrialOutcome {
            hit: metric.scan(0, &format!("epoch done, {r} img/s")),
            wall: Duration::from_secs(2),
            cpu: Duration::from_secs(2),
            voluntary_cs: 100,
            involuntary_cs: 50,
            peak_rss_kib: 2048,
            ..Default::default()
        }
    }
}

/// A launch that stands for the string `k` (the fake's launch keys).
fn key_of(k: &str) -> LaunchKey {
    vec![crate::job::trial::RankLaunch {
        local_rank: 0,
        argv: vec![k.into()],
        program: None,
        env: Default::default(),
        env_remove: vec![],
        placement: Default::default(),
        cpus: String::new(),
        mem: String::new(),
        worker_mask: None,
        hold: None,
    }]
}

/// Configurations by name; `unset` is the baseline and `plan` the plan (their
/// roles), the rest grid points.
pub(super) fn configs(names: &[&str]) -> Vec<TuneConfig> {
    names
        .iter()
        .map(|n| {
            let (role, unset_threads) = match *n {
                "unset" => (grid::Role::Baseline, true),
                "plan" => (grid::Role::Plan, false),
                _ => (grid::Role::GridPoint, false),
            };
            TuneConfig {
                name: n.to_string(),
                role,
                request: PlanRequest {
                    unset_threads,
                    ..Default::default()
                },
                axis: None,
            }
        })
        .collect()
}

pub(super) fn opts(runs: usize, warmup: usize, strategy: Strategy) -> TuneOptions {
    TuneOptions {
        combine: None,
        runs,
        max_runs: runs,
        warmup,
        strategy,
        margin: 0.05,
        metric: Metric::new(None).unwrap(),
        cpu_budget: 2.0,
        seed: 7,
    }
}

/// `tune` over the named configurations with a fresh report and no events.
fn tuned(f: &mut Fake, names: &[&str], o: &TuneOptions) -> TuneReport {
    tune(
        &configs(names),
        new_report(vec![], 1, "x".into(), 2.0),
        o,
        f,
        &mut |_| {},
    )
}

fn fake(rates: &[(&str, &[f64])]) -> Fake {
    Fake {
        rates: rates
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect(),
        calls: vec![],
        interrupt_at: None,
        keys: HashMap::new(),
    }
}

#[test]
fn interleaved_rounds_stats_and_winner() {
    let mut f = fake(&[
        ("unset", &[9.0, 10.0, 11.0, 10.0]),
        ("plan", &[0.0, 50.0, 52.0, 48.0]),
        ("one", &[0.0, 49.0, 60.0, 45.0]),
    ]);
    let mut updates = 0;
    let r = tune(
        &configs(&["unset", "plan", "one"]),
        new_report(vec![], 2, "x".into(), 2.0),
        &opts(3, 1, Strategy::All),
        &mut f,
        &mut |e| {
            if let Event::Updated(_) = e {
                updates += 1
            }
        },
    );
    // Every round runs every configuration once, in an order that changes.
    for round in f.calls.chunks(3) {
        let mut names = round.to_vec();
        names.sort();
        assert_eq!(names, ["one", "plan", "unset"], "{:?}", f.calls);
    }
    assert_ne!(
        f.calls[..3],
        f.calls[3..6],
        "the order moves: {:?}",
        f.calls
    );
    assert_eq!(r.order_seed, 7);
    assert_eq!(updates, 9 + 1);
    assert!(r.complete);
    let plan = &r.configs[1];
    let t = plan.throughput.unwrap();
    assert_eq!((t.median, t.min, t.max, t.n), (50.0, 48.0, 52.0, 3));
    assert_eq!(r.baseline.as_deref(), Some("unset"));
    // The per-round ratios are 50/10, 52/11, 48/10; the speed-up is the
    // model's: on a complete table with every trial fully weighted, their
    // geometric mean.
    let ratios: Vec<f64> = plan.trials.iter().filter_map(|t| t.ratio).collect();
    assert_eq!(ratios, [5.0, 52.0 / 11.0, 4.8]);
    let a = r.analysis.as_ref().unwrap();
    assert_eq!((a.trials, a.df, a.down_weighted), (9, 4, 0));
    assert!(
        r.configs
            .iter()
            .flat_map(|c| &c.trials)
            .all(|t| t.weight == Some(1.0))
    );
    let geo = (5.0f64 * 52.0 / 11.0 * 4.8).powf(1.0 / 3.0);
    assert!(
        (plan.speedup.unwrap() - geo).abs() < 1e-9,
        "{:?}",
        plan.speedup
    );
    assert!(plan.speedup_low.unwrap() < geo && plan.speedup_high.unwrap() > geo);
    // one/plan per round: 0.98, 1.15, 0.94: not distinguishable; a tie the
    // rule gives to the plan.
    assert!(r.configs[2].indistinguishable_from_winner);
    assert_eq!(r.winner.as_deref(), Some("plan"));
    let tie = r.tie.as_ref().expect("a tie");
    assert_eq!(tie.configs, ["plan", "one"]);
    assert!(tie.rule.contains("the plan first"));
    assert!(!r.configs[0].indistinguishable_from_winner);
    assert_eq!(plan.cpu_util_pct, Some(50.0));
    assert_eq!(plan.voluntary_cs_per_s, Some(50.0));
    for c in &r.configs {
        let t = c.throughput.unwrap();
        assert!(t.min <= t.median && t.median <= t.max);
    }
}

#[test]
fn failures_are_reported_and_the_rest_goes_on() {
    let mut f = fake(&[("unset", &[10.0, 10.0]), ("bad", &[-1.0, 20.0])]);
    let r = tuned(&mut f, &["unset", "bad"], &opts(2, 0, Strategy::All));
    let bad = &r.configs[1];
    assert_eq!(bad.trials[0].status, TrialStatus::Failed);
    assert_eq!(bad.trials[0].stderr_tail, ["Traceback"]);
    assert_eq!(
        bad.trials[0].message.as_deref(),
        Some("rank 0 (pid 4121) exited with code 1")
    );
    assert_eq!(bad.throughput.unwrap().n, 1);
    assert_eq!(r.winner.as_deref(), Some("bad"));
}

#[test]
fn interrupted_tune_keeps_what_was_measured() {
    let mut f = fake(&[("unset", &[10.0, 10.0]), ("plan", &[20.0, 20.0])]);
    f.interrupt_at = Some(3);
    let mut last = None;
    let r = tune(
        &configs(&["unset", "plan"]),
        new_report(vec![], 1, "x".into(), 2.0),
        &opts(2, 0, Strategy::All),
        &mut f,
        &mut |e| {
            if let Event::Updated(r) = e {
                last = Some(r.clone())
            }
        },
    );
    assert!(!r.complete);
    assert_eq!(r.configs[0].trials.len(), 1);
    assert_eq!(r.configs[1].trials.len(), 1);
    assert_eq!(last.unwrap(), r);
    assert!(matches!(r.warnings[0], Warning::Interrupted { .. }));
    assert!(r.warnings[0].to_string().contains("interrupted"));
}

#[test]
fn no_metric_in_output_falls_back_to_wall_time() {
    struct Quiet;
    impl TrialRunner for Quiet {
        fn run(&mut self, _: &TuneConfig, _: &Metric) -> TrialOutcome {
            TrialOutcome {
                wall: Duration::from_millis(500),
                ..Default::default()
            }
        }
    }
    let r = tune(
        &configs(&["unset"]),
        new_report(vec![], 1, "x".into(), 2.0),
        &opts(1, 0, Strategy::All),
        &mut Quiet,
        &mut |_| {},
    );
    assert_eq!(r.metric, MetricSource::Wall);
    assert_eq!(r.configs[0].throughput.unwrap().median, 2.0);
    assert!(r.warnings.contains(&Warning::WallMetric));
}

#[test]
fn a_close_race_gets_more_trials_up_to_max_runs() {
    // b level with a but spread wide: neither the same within 5% nor slower,
    // and it might still overtake.
    let mut f = fake(&[
        ("unset", &[5.0, 5.0, 5.0]),
        ("a", &[10.0, 10.0, 10.0, 10.0, 10.0]),
        ("b", &[12.0, 8.5, 9.5, 11.0, 10.0]),
    ]);
    let o = TuneOptions {
        max_runs: 5,
        ..opts(3, 0, Strategy::All)
    };
    let r = tuned(&mut f, &["unset", "a", "b"], &o);
    let n = |i: usize| r.configs[i].trials.len();
    assert_eq!(
        (n(0), n(1), n(2)),
        (3, 5, 5),
        "the undecided row and the winner ran on; the reference is not needed"
    );
    let extra = |i: usize| (r.configs[i].extra_rounds, r.configs[i].extra_why.clone());
    assert_eq!(extra(0), (0, None));
    let w = r.index_of(r.winner.as_ref()).unwrap();
    let other = 3 - w;
    assert_eq!(extra(w).0, 2);
    assert!(extra(w).1.unwrap().contains("the winner"));
    assert_eq!(extra(other).0, 2);
    assert!(
        extra(other)
            .1
            .unwrap()
            .starts_with("not decided against the winner after "),
        "{:?}",
        extra(other)
    );
    assert!(r.complete);
}

#[test]
fn outliers_and_a_slow_first_trial_are_marked() {
    let mut f = fake(&[("unset", &[6.0, 10.0, 10.1, 9.9, 10.0, 3.0])]);
    let r = tuned(&mut f, &["unset"], &opts(6, 0, Strategy::All));
    let c = &r.configs[0];
    assert!(c.slow_first_trial);
    assert!(c.trials[5].outlier, "3.0 against a median near 10");
    assert!(!c.trials[2].outlier);
    let text = report::render(&r);
    assert!(
        text.contains("outlier") && text.contains("first trial was slow"),
        "{text}"
    );
}

/// The default search's shape: `rows`, then one `plan key=value` row per axis,
/// 3 runs each, combining what beat the plan.
fn default_search(f: &mut Fake, rows: &[&str], axes: &[(&str, &str)]) -> TuneReport {
    let base = PlanRequest::default();
    let mut cs = configs(rows);
    for (k, v) in axes {
        let word = format!("{k}={v}");
        let mut c = grid::from_words(
            &format!("plan {word}"),
            grid::Role::OneChange,
            &base,
            &[&word],
        )
        .unwrap();
        c.axis = Some(grid::Change::parse(k, v).unwrap());
        cs.push(c);
    }
    let o = TuneOptions {
        combine: Some(base),
        ..opts(3, 0, Strategy::All)
    };
    tune(
        &cs,
        new_report(vec![], 1, "x".into(), 2.0),
        &o,
        f,
        &mut |_| {},
    )
}

#[test]
fn the_default_search_combines_what_beat_the_plan() {
    let mut f = fake(&[
        ("unset", &[5.0, 5.0, 5.0, 5.0]),
        ("plan", &[10.0, 10.0, 10.0, 10.0]),
        ("plan workers=0", &[12.0, 12.0, 12.0, 12.0]),
        ("plan wait=passive", &[11.0, 11.0, 11.0, 11.0]),
        ("plan policy=none", &[9.0, 9.0, 9.0, 9.0]),
        ("plan workers=0 wait=passive", &[13.0, 13.1, 12.9]),
    ]);
    let r = default_search(
        &mut f,
        &["unset", "plan"],
        &[("workers", "0"), ("wait", "passive"), ("policy", "none")],
    );
    let combined = r
        .configs
        .iter()
        .find(|c| c.name == "plan workers=0 wait=passive")
        .expect("the combination was added");
    assert_eq!(combined.trials.len(), 3, "as many trials as the others");
    assert_eq!(r.winner.as_deref(), Some("plan workers=0 wait=passive"));
    assert!(r.complete);
    // policy=none lost to the plan: it is not in the combination.
    assert!(!combined.options.contains("policy none"));
}

#[test]
fn halving_drops_what_is_far_behind_after_one_round_but_never_the_baseline() {
    let mut f = fake(&[
        ("unset", &[3.0, 3.0, 3.0]),
        ("plan", &[10.0, 10.0, 10.0]),
        ("half", &[4.9, 10.0, 10.0]),
        ("close", &[5.1, 10.0, 10.0]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "plan", "half", "close"],
        &opts(3, 0, Strategy::Halving),
    );
    let calls = |n: &str| f.calls.iter().filter(|c| *c == n).count();
    assert_eq!(calls("half"), 1, "below half of the round's best");
    assert_eq!(r.configs[2].dropped_after_round, Some(0));
    assert_eq!(calls("close"), 3, "above half: kept, and not worse later");
    assert_eq!(calls("unset"), 3, "the reference is never dropped");
    assert_eq!(r.configs[0].dropped_after_round, None);
    let notes = report::notes(&r);
    assert!(
        notes.contains(
            "half: stopped after 1 round(s): its trial was below 50% of the round's best"
        ),
        "{notes}"
    );
    // --strategy all keeps everything.
    let mut f = fake(&[
        ("unset", &[3.0, 3.0]),
        ("plan", &[10.0, 10.0]),
        ("half", &[4.0, 4.0]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "plan", "half"],
        &opts(2, 0, Strategy::All),
    );
    assert!(r.configs.iter().all(|c| c.trials.len() == 2));
}

#[test]
fn configurations_that_launch_the_same_are_measured_once() {
    let mut f = fake(&[
        ("unset", &[5.0, 5.0, 5.0]),
        ("threads=1", &[12.0, 12.0, 12.0]),
        ("plan", &[10.0, 10.0, 10.0]),
        ("plan workers=0", &[11.0, 11.0, 11.0]),
        ("plan policy=none", &[]),
        ("plan policy=none workers=0", &[]),
    ]);
    for (n, k) in [
        ("unset", "a"),
        ("threads=1", "b"),
        ("plan", "c"),
        ("plan workers=0", "d"),
        ("plan policy=none", "b"),
        ("plan policy=none workers=0", "d"),
    ] {
        f.keys.insert(n.into(), k.into());
    }
    let r = default_search(
        &mut f,
        &["unset", "threads=1", "plan"],
        &[("workers", "0"), ("policy", "none")],
    );
    assert!(
        !f.calls.iter().any(|c| c == "plan policy=none"),
        "{:?}",
        f.calls
    );
    let t1 = r.configs.iter().find(|c| c.name == "threads=1").unwrap();
    assert_eq!(t1.same_launch, ["plan policy=none"]);
    assert_eq!(t1.trials.len(), 3);
    assert!(!r.configs.iter().any(|c| c.name == "plan policy=none"));
    // threads=1 carried policy=none's axis: the combination was formed, but it
    // launches as `plan workers=0` would with policy none ("d"), here the same
    // as a measured row, so it is not run again.
    assert!(
        !f.calls
            .iter()
            .any(|c| c.contains("workers=0 policy=none") || c.contains("policy=none workers=0")),
        "{:?}",
        f.calls
    );
    assert!(report::notes(&r).contains("threads=1: launches exactly as plan policy=none"));
}

#[test]
fn halving_keeps_a_close_config_whose_two_trials_do_not_overlap() {
    // 9.5-9.8 against 10-10.5: no overlap, but 5% apart, well within what
    // two trials of one configuration spread here.
    let mut f = fake(&[
        ("unset", &[5.0, 5.0, 5.0]),
        ("plan", &[10.0, 10.5, 10.0]),
        ("close", &[9.5, 9.8, 10.6]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "plan", "close"],
        &opts(3, 0, Strategy::Halving),
    );
    assert_eq!(r.configs[2].dropped_after_round, None);
    assert_eq!(r.configs[2].trials.len(), 3);
    assert_eq!(
        r.configs[0].dropped_after_round, None,
        "the reference stays, however slow"
    );
}

#[test]
fn a_dropped_config_never_wins() {
    // `b` loses on two trials each (7.9: below 10 and under 80% of it); then
    // the machine slows and the survivors' later trials fall below `b`'s old
    // median, which is no reason to pick it.
    let mut f = fake(&[
        ("unset", &[2.0, 2.0]),
        ("a", &[10.0, 10.0, 5.0, 5.0, 5.0]),
        ("b", &[7.9, 7.9]),
        ("c", &[9.5, 9.6, 5.0, 5.0, 5.0]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "a", "b", "c"],
        &opts(5, 0, Strategy::Halving),
    );
    assert_eq!(r.configs[2].dropped_after_round, Some(1));
    assert_eq!(r.configs[1].trials.len(), 5);
    assert!(
        matches!(r.winner.as_deref(), Some("a" | "c")),
        "{:?}",
        r.winner
    );
}

#[test]
fn the_reference_runs_beside_a_lone_survivor() {
    let mut f = fake(&[
        ("unset", &[2.0, 2.0]),
        ("a", &[10.0, 10.0, 10.0, 10.0, 10.0]),
        ("b", &[7.9, 7.9]),
    ]);
    let mut total = 0;
    let r = tune(
        &configs(&["unset", "a", "b"]),
        new_report(vec![], 1, "x".into(), 2.0),
        &opts(5, 0, Strategy::Halving),
        &mut f,
        &mut |e| {
            if let Event::Start { total: t } = e {
                total = t
            }
        },
    );
    assert_eq!(r.configs[2].dropped_after_round, Some(1));
    // The reference runs beside the survivor in every base round.
    assert_eq!(r.configs[0].trials.len(), 5, "{:?}", f.calls);
    assert_eq!(r.configs[1].trials.len(), 5, "{:?}", f.calls);
    assert_eq!(
        total,
        f.calls.len(),
        "the progress bar's total ends at what ran"
    );
    assert_eq!(r.winner.as_deref(), Some("a"));
    assert!(r.complete);
}

#[test]
fn a_speedup_from_two_rounds_shows_its_rounds_not_an_interval() {
    let mut f = fake(&[
        ("unset", &[10.0, 11.0, 9.0, 10.0]),
        ("a", &[20.0, 23.0, 19.0, 21.0]),
    ]);
    let r = tuned(&mut f, &["unset", "a"], &opts(2, 0, Strategy::All));
    let text = report::render(&r);
    assert!(text.contains("x (2 rounds)"), "{text}");
    let r = tuned(&mut f, &["unset", "a"], &opts(3, 0, Strategy::All));
    let text = report::render(&r);
    assert!(!text.contains("rounds)") && text.contains("x ["), "{text}");
}
