//! Statistics of repeated trials. Per configuration: the median with min-max,
//! the median absolute deviation, and a distribution-free 95% interval of the
//! median (order statistics). Between configurations: paired comparisons,
//! one ratio per round in which both ran (drift between rounds cancels), with
//! a 95% interval from the t distribution of the log ratios; "faster",
//! "slower" and "not distinguishable" come from that interval alone. And
//! drift: a change point in the trials' residuals over time. Outliers are
//! trials further than 3 scaled MADs from their configuration's median.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// Median absolute deviation from the median.
    #[serde(default)]
    pub mad: f64,
    /// 95% distribution-free interval of the median (order statistics).
    #[serde(default)]
    pub ci_low: f64,
    #[serde(default)]
    pub ci_high: f64,
}

fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median of `v` (not empty).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    median_sorted(&s)
}

/// The 95% distribution-free interval of the median of sorted `v`: the order
/// statistics (k, n+1-k) with k the largest index whose binomial tail keeps
/// the coverage >= 95% (below 6 values, no such k: min-max).
fn median_interval(v: &[f64]) -> (f64, f64) {
    let n = v.len();
    // P(Binomial(n, 1/2) < k), accumulated until it passes 2.5%.
    let mut k = 0usize;
    let mut tail = 0.0;
    let mut term = 0.5f64.powi(n as i32); // C(n, 0) / 2^n
    for i in 0..n {
        if tail + term > 0.025 {
            break;
        }
        tail += term;
        k = i + 1;
        term *= (n - i) as f64 / (i + 1) as f64;
    }
    let k = k.max(1);
    (v[k - 1], v[n - k])
}

/// Median, min, max, MAD and the median's interval; None when there are none.
pub(crate) fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let med = median_sorted(&v);
    let dev: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
    let (ci_low, ci_high) = median_interval(&v);
    Some(Summary {
        median: med,
        min: v[0],
        max: v[v.len() - 1],
        n: v.len(),
        mad: median(&dev),
        ci_low,
        ci_high,
    })
}

/// The standard normal quantile (Acklam's rational approximation, relative
/// error below 1.2e-9).
pub(crate) fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        let q = (-2.0 * q.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail(p)
    } else if p > 1.0 - 0.02425 {
        -tail(1.0 - p)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// P(|T| < t) for Student's t with `df` degrees of freedom: the closed form
/// for whole degrees of freedom (Abramowitz & Stegun 26.7.3/26.7.4).
fn t_central(t: f64, df: usize) -> f64 {
    let theta = (t / (df as f64).sqrt()).atan();
    let (s, c2) = (theta.sin(), theta.cos().powi(2));
    if df % 2 == 1 {
        let mut sum = 0.0;
        if df > 1 {
            let (mut term, mut k) = (1.0, 2usize);
            sum = 1.0;
            while k < df - 1 {
                term *= c2 * k as f64 / (k + 1) as f64;
                sum += term;
                k += 2;
            }
        }
        2.0 / std::f64::consts::PI * (theta + s * theta.cos() * sum)
    } else {
        let (mut term, mut sum, mut k) = (1.0, 1.0, 1usize);
        while k < df - 1 {
            term *= c2 * k as f64 / (k + 1) as f64;
            sum += term;
            k += 2;
        }
        s * sum
    }
}

/// Student's t quantile (p > 0.5): the closed-form CDF inverted by bisection,
/// up to 1000 degrees of freedom; the normal quantile beyond.
pub(crate) fn t_quantile(p: f64, df: usize) -> f64 {
    if df == 0 {
        return f64::INFINITY;
    }
    if df > 1000 {
        return normal_quantile(p);
    }
    let want = 2.0 * p - 1.0;
    let (mut lo, mut hi) = (0.0, 1.0);
    while t_central(hi, df) < want {
        hi *= 2.0;
        if hi > 1e9 {
            return hi;
        }
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if t_central(mid, df) < want {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// How `a` compares with `b`: the ratios round by round, and the interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Paired {
    /// a / b in each round both were scored, in round order.
    pub ratios: Vec<f64>,
    /// The median of the ratios.
    pub median: f64,
    /// The interval of the ratio at the report's level: in a report, the
    /// model's (tune::fit, whose estimate is `estimate`); from `paired`
    /// alone, exp(mean ± t·sd/√n) of the log ratios (the paired t-interval;
    /// unbounded with fewer than 2 rounds).
    pub low: f64,
    pub high: f64,
    /// The model's estimate of a / b (None: the paired t-interval's alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<f64>,
}

/// What a paired interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Verdict {
    Faster,
    Slower,
    NotDistinguishable,
}

impl Paired {
    pub(crate) fn verdict(&self) -> Verdict {
        if self.low > 1.0 {
            Verdict::Faster
        } else if self.high < 1.0 {
            Verdict::Slower
        } else {
            Verdict::NotDistinguishable
        }
    }
}

/// `a` against `b` over the rounds both have a value for (index = round),
/// with an interval at two-sided confidence `level`.
pub(crate) fn paired(a: &[Option<f64>], b: &[Option<f64>], level: f64) -> Option<Paired> {
    let ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some(x.as_ref()? / y.as_ref()?))
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let n = ratios.len() as f64;
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / n;
    let (low, high) = if ratios.len() < 2 {
        (0.0, f64::INFINITY)
    } else {
        let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let p = 1.0 - (1.0 - level) / 2.0;
        let half = t_quantile(p, ratios.len() - 1) * (var / n).sqrt();
        ((mean - half).exp(), (mean + half).exp())
    };
    Some(Paired {
        median: median(&ratios),
        ratios,
        low,
        high,
        estimate: None,
    })
}

/// How strong a change point must be to count as drift.
pub(crate) const DRIFT_Z: f64 = 3.5;

/// A change in the machine's speed during the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Drift {
    /// How far the speed moved: after / before the change (or its inverse), >= 1.
    pub ratio: f64,
    /// The change lies before this trial: from `drift`, an index into the
    /// residuals; in a report, the trial's `seq`.
    pub at_trial: usize,
    /// Its strength: the difference of the two levels over its standard error.
    pub z: f64,
}

/// A change point in `residuals` (log throughput minus its configuration's
/// mean, in the order the trials ran): the split that best separates two
/// levels. Reported when the levels differ by z >= DRIFT_Z (a steady machine
/// gets there in about 1% of runs: the simulation tests) and by at least
/// `min_ratio`.
pub(crate) fn drift(residuals: &[f64], min_ratio: f64) -> Option<Drift> {
    let n = residuals.len();
    if n < 6 {
        return None;
    }
    let total: f64 = residuals.iter().sum();
    let squares: f64 = residuals.iter().map(|r| r * r).sum();
    let mut best: Option<(f64, usize, f64)> = None;
    let mut before = residuals[0];
    for k in 2..=n - 2 {
        before += residuals[k - 1];
        let (m1, m2) = (before / k as f64, (total - before) / (n - k) as f64);
        let diff = m2 - m1;
        // The pooled spread around the two levels: sum of squares less each
        // side's mean square.
        let ss = (squares - k as f64 * m1 * m1 - (n - k) as f64 * m2 * m2).max(0.0);
        let sd = (ss / (n - 2) as f64).sqrt().max(1e-9);
        let z = diff.abs() / (sd * (1.0 / k as f64 + 1.0 / (n - k) as f64).sqrt());
        if best.is_none_or(|b| z > b.0) {
            best = Some((z, k, diff));
        }
    }
    let (z, at_trial, diff) = best?;
    let ratio = diff.abs().exp();
    (z >= DRIFT_Z && ratio >= min_ratio).then_some(Drift { ratio, at_trial, z })
}

/// Whether `x` lies further than 3 scaled MADs (1.4826 MAD estimates the
/// standard deviation) from the median; never with fewer than 4 trials.
pub(crate) fn is_outlier(s: &Summary, x: f64) -> bool {
    s.n >= 4 && s.mad > 0.0 && (x - s.median).abs() > 3.0 * 1.4826 * s.mad
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_odd_even_and_empty() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(s.mad, 1.0);
        assert_eq!(summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
    }

    #[test]
    fn the_median_interval_holds_the_median_and_is_deterministic() {
        let a = summarize(&[100.0, 101.0, 99.0, 100.5, 99.5]).unwrap();
        assert!(a.ci_low <= a.median && a.median <= a.ci_high);
        assert_eq!(
            summarize(&[1.0, 2.0, 3.0]),
            summarize(&[3.0, 1.0, 2.0]),
            "deterministic"
        );
    }

    #[test]
    fn outliers_need_four_trials_and_a_spread() {
        let s = summarize(&[100.0, 101.0, 99.0, 100.0, 60.0]).unwrap();
        assert!(is_outlier(&s, 60.0));
        assert!(!is_outlier(&s, 99.0));
        let three = summarize(&[100.0, 101.0, 60.0]).unwrap();
        assert!(!is_outlier(&three, 60.0));
    }

    #[test]
    fn median_interval_by_order_statistics() {
        let v: Vec<f64> = (1..=5).map(f64::from).collect();
        let s = summarize(&v).unwrap();
        assert_eq!((s.ci_low, s.ci_high), (1.0, 5.0), "n < 6: min-max");
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = summarize(&v).unwrap();
        // Binomial(20, 1/2): P(X < 6) = 2.1%, P(X < 7) = 5.8%.
        assert_eq!((s.ci_low, s.ci_high), (6.0, 15.0));
    }

    #[test]
    fn paired_ratios_cancel_what_both_share() {
        // b is a at 10% less every round; the machine moves 1.5x between rounds.
        let a = [Some(100.0), Some(150.0), Some(102.0), None, Some(149.0)];
        let b = [Some(90.0), Some(135.5), Some(91.5), Some(80.0), Some(134.0)];
        let p = paired(&a, &b, 0.95).unwrap();
        assert_eq!(p.ratios.len(), 4, "round 3 has no a");
        assert!((p.median - 1.11).abs() < 0.01, "{p:?}");
        assert!(p.low > 1.0 && p.high < 1.2, "{p:?}");
        assert_eq!(p.verdict(), Verdict::Faster);
        let q = paired(&b, &a, 0.95).unwrap();
        assert_eq!(q.verdict(), Verdict::Slower);
        let one = paired(&[Some(2.0)], &[Some(1.0)], 0.95).unwrap();
        assert_eq!(
            one.verdict(),
            Verdict::NotDistinguishable,
            "one round is no interval"
        );
        assert!(paired(&[None], &[Some(1.0)], 0.95).is_none());
    }

    #[test]
    fn quantiles_match_the_tables() {
        assert!((normal_quantile(0.975) - 1.959964).abs() < 1e-6);
        assert!((normal_quantile(0.005) + 2.575829).abs() < 1e-6);
        for (df, want) in [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045)] {
            let t = t_quantile(0.975, df);
            assert!((t - want).abs() < 0.001, "t({df}) = {t}, want {want}");
        }
        assert!((t_quantile(0.995, 4) - 4.604).abs() < 0.001);
        assert!((t_quantile(0.995, 15) - 2.947).abs() < 0.001);
        assert!((t_quantile(0.975, 3) - 3.182).abs() < 0.001);
    }

    #[test]
    fn drift_finds_a_step_and_not_noise() {
        let noise = [
            0.02, -0.03, 0.01, 0.0, -0.02, 0.03, -0.01, 0.02, -0.02, 0.01,
        ];
        assert_eq!(drift(&noise, 1.2), None);
        let step: Vec<f64> = noise
            .iter()
            .enumerate()
            .map(|(i, r)| r + if i >= 6 { 0.4 } else { 0.0 })
            .collect();
        let d = drift(&step, 1.2).unwrap();
        assert_eq!(d.at_trial, 6);
        assert!((d.ratio - 0.4f64.exp()).abs() < 0.05, "{d:?}");
        assert_eq!(drift(&step, 2.0), None, "below the ratio asked for");
    }

    proptest! {
        #[test]
        fn median_and_interval_within_min_max(v in proptest::collection::vec(0.0f64..1e9, 1..20)) {
            let s = summarize(&v).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert!(s.min <= s.ci_low && s.ci_low <= s.ci_high && s.ci_high <= s.max);
            prop_assert!(s.ci_low <= s.median && s.median <= s.ci_high);
            prop_assert_eq!(s.n, v.len());
        }
    }
}
