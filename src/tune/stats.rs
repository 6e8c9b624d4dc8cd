//! Summary statistics of repeated trials: the median with min-max, the median
//! absolute deviation, and a 95% bootstrap interval of the median. Two
//! configurations are "not distinguishable" when their intervals overlap: the
//! stated test behind every mark in the table. Outliers are trials further
//! than 3 scaled MADs from their configuration's median.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// Median absolute deviation from the median.
    #[serde(default)]
    pub mad: f64,
    /// 95% bootstrap interval of the median (percentile method, 2000 resamples).
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

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    median_sorted(&s)
}

/// A small deterministic generator: the same trials give the same interval.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const RESAMPLES: usize = 2000;

/// The 95% percentile-bootstrap interval of the median.
fn bootstrap(v: &[f64]) -> (f64, f64) {
    let seed = v.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = XorShift(seed | 1);
    let mut meds = Vec::with_capacity(RESAMPLES);
    let mut sample = vec![0.0; v.len()];
    for _ in 0..RESAMPLES {
        for s in sample.iter_mut() {
            *s = v[(rng.next() % v.len() as u64) as usize];
        }
        meds.push(median(&sample));
    }
    meds.sort_by(f64::total_cmp);
    let at = |q: f64| meds[((meds.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

/// Median, min, max, MAD and the median's interval; None when there are none.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let med = median_sorted(&v);
    let dev: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
    let (ci_low, ci_high) = bootstrap(&v);
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

/// The stated test: two medians' 95% intervals overlap, so the data cannot
/// tell the configurations apart.
pub fn overlaps(a: &Summary, b: &Summary) -> bool {
    a.ci_low <= b.ci_high && b.ci_low <= a.ci_high
}

/// Whether `x` lies further than 3 scaled MADs (1.4826 MAD estimates the
/// standard deviation) from the median; never with fewer than 4 trials.
pub fn is_outlier(s: &Summary, x: f64) -> bool {
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
    fn intervals_decide_distinguishable() {
        let a = summarize(&[100.0, 101.0, 99.0, 100.5, 99.5]).unwrap();
        let b = summarize(&[100.2, 100.8, 99.9, 101.1, 100.0]).unwrap();
        let c = summarize(&[110.0, 111.0, 109.5, 110.5, 110.2]).unwrap();
        assert!(overlaps(&a, &b));
        assert!(!overlaps(&a, &c));
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

    proptest! {
        #[test]
        fn median_and_interval_within_min_max(v in proptest::collection::vec(0.0f64..1e9, 1..20)) {
            let s = summarize(&v).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert!(s.min <= s.ci_low && s.ci_low <= s.ci_high && s.ci_high <= s.max);
            prop_assert_eq!(s.n, v.len());
        }
    }
}
