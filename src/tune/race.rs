//! The race: when tune looks at its rows, at which level, and what a look
//! decides. A row stops as soon as the model says what the final table would
//! say of it: slower than the leader, or the same within the margin.
//!
//! Every look spends a share of one error budget (`ALPHA`): the shares add up
//! to it, so the whole sequence of looks calls two equal configurations
//! different at most 5% of the time (Bonferroni: true whatever the looks'
//! correlation, conservative because they are correlated).

use serde::{Deserialize, Serialize};

use super::stats::Paired;

/// Why a configuration stopped being measured before the race ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Stopped {
    /// After this many measured rounds.
    pub after_round: usize,
    pub why: StopWhy,
    /// The leader it was compared with then, and how (not for
    /// `far-behind`): the comparison that decided stays its `vs_winner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_leader: Option<Paired>,
}

/// The rule that stopped a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StopWhy {
    /// Halving: its first trial below half of the round's best.
    FarBehind,
    /// Its interval against the leader lay below 1.
    Slower,
    /// Its interval against the leader lay within ±margin.
    Same,
    /// After the base rounds, no two scored trials beside the leader (its
    /// trials failed): nothing to compare, nothing more to learn.
    Unscored,
    /// Not distinguishable, not callable by --max-runs at its estimate, and
    /// the trials --max-runs leaves could not carry it more than 2% past the
    /// leader (race::cannot_overtake).
    CannotOvertake,
}

/// The two-sided error of the whole race.
pub(crate) const ALPHA: f64 = 0.05;

/// Of ALPHA: the looks inside the base rounds, before the last one. Early
/// looks stop only what is clearly behind, so they get little.
const EARLY: f64 = 0.05;
/// Of ALPHA: the look after the last base round, where most verdicts fall.
const BASE: f64 = 0.65;
// The rest (0.30) goes to the looks after extra rounds.

/// The default margin of a tie, as `--margin` spells it: two configurations
/// whose interval against each other lies within ±5% are the same for a
/// training job.
pub(crate) const DEFAULT_MARGIN_PCT: &str = "5";

/// When the race looks: after measured round m (1-based), for m in
/// 2..runs (early), at m = runs (base), and after each extra round up to
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Looks {
    pub runs: usize,
    pub max: usize,
}

impl Looks {
    pub(crate) fn new(runs: usize, max: usize) -> Looks {
        let runs = runs.max(1);
        Looks {
            runs,
            max: max.max(runs),
        }
    }

    fn early(&self) -> usize {
        self.runs.saturating_sub(2)
    }

    fn extra(&self) -> usize {
        self.max - self.runs
    }

    /// The error a look after measured round `m` spends (None: no look then).
    pub(crate) fn alpha(&self, m: usize) -> Option<f64> {
        let (early, extra) = (self.early(), self.extra());
        let base = BASE
            + if early == 0 { EARLY } else { 0.0 }
            + if extra == 0 { 1.0 - EARLY - BASE } else { 0.0 };
        let share = if m >= 2 && m < self.runs {
            EARLY / early as f64
        } else if m == self.runs {
            base
        } else if m > self.runs && m <= self.max {
            (1.0 - EARLY - BASE) / extra as f64
        } else {
            return None;
        };
        Some(ALPHA * share)
    }

    /// The two-sided level of the intervals at that look.
    pub(crate) fn level(&self, m: usize) -> Option<f64> {
        self.alpha(m).map(|a| 1.0 - a)
    }

    /// How the report states the correction.
    pub(crate) fn describe(&self, level: f64) -> String {
        format!(
            "a race with looks after rounds 2-{} spending {:.0}% in all (Bonferroni): \
             each interval at {:.2}%",
            self.max,
            ALPHA * 100.0,
            level * 100.0
        )
    }
}

/// What a look said of one row against the leader.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Call {
    /// Its interval lies below 1: slower.
    Slower,
    /// Its interval lies within ±margin: the same for the job.
    Same,
    Open,
}

/// A row against the leader: its interval [low, high] at the look's `level`
/// (`df` degrees of freedom behind it) and its estimate. Slower when the
/// interval lies below 1. The same when the two one-sided tests of an
/// equivalence (TOST) at 5% each both pass: the 90% interval lies within
/// ±margin (the race's budget is for calling equal rows different; calling
/// rows the same has its own 5% at each look).
pub(crate) fn call(
    estimate: f64,
    (low, high): (f64, f64),
    level: f64,
    df: usize,
    margin: f64,
) -> Call {
    if high < 1.0 {
        return Call::Slower;
    }
    if margin > 0.0 && df > 0 && low > 0.0 && high.is_finite() && estimate > 0.0 {
        let t = |p: f64| super::stats::t_quantile(p, df);
        let se = (high.ln() - low.ln()) / (2.0 * t(1.0 - (1.0 - level) / 2.0));
        let half = t(0.95) * se;
        let d = estimate.ln();
        if d - half >= -margin.ln_1p() && d + half <= margin.ln_1p() {
            return Call::Same;
        }
    }
    Call::Open
}

/// A lead smaller than this is no lead: a row that cannot end more than
/// this far ahead of the leader stops.
pub(crate) const OVERTAKE: f64 = 0.02;
/// "Cannot": in under 10% of cases (the normal quantile 1.28 of how far the
/// trials left can move its estimate). Not split among the rows open beside
/// the leader: that Bonferroni split took the 8-row simulation's winner from
/// 97.6% to 99.0% right but cost a shape like the main job's (nine rows
/// within 5% of each other) 15-30% more trials at 3-17% noise.
const OVERTAKE_Z: f64 = 1.2816;

/// Whether a row still open against the leader is done: more trials could
/// neither call it nor change the winner. Its estimate `estimate` and
/// interval [low, high] at `level` after `n` of at most `max` trials, `df`
/// degrees of freedom behind it, the last look at `last_level`.
///
/// - Callable: if the estimate stays where it is, the last look's interval
///   (its half-width shrinks as 1/sqrt(trials)) lies below 1. Such a row
///   runs on to be called.
/// - Cannot overtake: the trials left move its estimate by one standard error
///   times sqrt(1 - n/max); if even a move 1.28 times that size leaves it
///   less than OVERTAKE ahead of the leader, more trials cannot change the
///   winner.
pub(crate) fn cannot_overtake(
    estimate: f64,
    (low, high): (f64, f64),
    (level, last_level): (f64, f64),
    (n, max): (usize, usize),
    df: usize,
) -> bool {
    if n >= max || df == 0 || !(low > 0.0 && high.is_finite() && estimate > 0.0) {
        return false;
    }
    let q = |l: f64| super::stats::normal_quantile(1.0 - (1.0 - l) / 2.0);
    let t = super::stats::t_quantile(1.0 - (1.0 - level) / 2.0, df);
    let se = (high.ln() - low.ln()) / (2.0 * t);
    let at = |k: usize| se * (n as f64 / k as f64).sqrt();
    let d = estimate.ln();
    let callable = d.abs() >= q(last_level) * at(max);
    let moves = se * (1.0 - n as f64 / max as f64).sqrt();
    !callable && d + OVERTAKE_Z * moves < OVERTAKE.ln_1p()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_looks_spend_alpha_and_no_more() {
        for (runs, max) in [(5, 20), (5, 5), (1, 1), (2, 8), (3, 3), (1, 4), (10, 40)] {
            let l = Looks::new(runs, max);
            let spent: f64 = (0..=max + 2).filter_map(|m| l.alpha(m)).sum();
            assert!((spent - ALPHA).abs() < 1e-12, "{runs} {max}: {spent}");
            assert_eq!(l.alpha(max + 1), None);
        }
        let l = Looks::new(5, 20);
        assert_eq!(l.alpha(1), None, "one round is no interval");
        assert!((l.level(5).unwrap() - 0.9675).abs() < 1e-12);
    }

    #[test]
    fn calls() {
        let c = |e: f64, l: f64, h: f64, m: f64| call(e, (l, h), 0.975, 16, m);
        assert_eq!(c(0.87, 0.8, 0.95, 0.05), Call::Slower);
        // 1.00x [0.94-1.064] at 97.5% is [0.958-1.045] at 90%: the same.
        assert_eq!(c(1.0, 0.94, 1.064, 0.05), Call::Same);
        assert_eq!(c(1.0, 0.94, 1.064, 0.0), Call::Open, "no margin");
        // 0.97x [0.88-1.07]: 90% is [0.91-1.03], outside -5%.
        assert_eq!(c(0.97, 0.88, 1.07, 0.05), Call::Open);
    }

    #[test]
    fn a_row_stops_when_it_cannot_overtake() {
        let last = 1.0 - 0.05 * 0.3 / 15.0;
        let done = |e: f64, l: f64, h: f64, n: usize| {
            cannot_overtake(e, (l, h), (0.975, last), (n, 20), 16)
        };
        // 0.96x [0.90-1.03] at 97.5% after 5 of 20 trials: se 0.027, the 15
        // trials left move it by 0.024; 0.96 * e^(1.28 * 0.024) < 1.02, and
        // 20 trials would not call it (3.2 x 0.014 > 0.04).
        assert!(done(0.96, 0.90, 1.03, 5));
        // 0.90x [0.84-0.97]: 20 trials would call it: it runs on.
        assert!(!done(0.90, 0.84, 0.97, 5));
        // Level with the leader: it might still overtake.
        assert!(!done(1.0, 0.85, 1.18, 5));
        assert!(!done(1.0, 0.94, 1.064, 5));
        // No trials left, or no interval: never.
        assert!(!done(0.96, 0.90, 1.03, 20));
        assert!(!done(0.96, 0.0, f64::INFINITY, 5));
    }
}
