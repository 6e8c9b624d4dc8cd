//! Summary statistics of repeated trials: median with min-max, and whether two
//! configurations can be told apart (their min-max ranges do not overlap).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// Median, min and max of the values; None when there are none.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// Whether two ranges overlap: then the data cannot tell the two apart.
pub fn overlaps(a: &Summary, b: &Summary) -> bool {
    a.min <= b.max && b.min <= a.max
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_odd_even_and_empty() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
        let a = summarize(&[1.0, 2.0]).unwrap();
        let b = summarize(&[2.0, 3.0]).unwrap();
        let c = summarize(&[2.5, 3.0]).unwrap();
        assert!(overlaps(&a, &b));
        assert!(!overlaps(&a, &c));
    }

    proptest! {
        #[test]
        fn median_is_within_min_max(v in proptest::collection::vec(0.0f64..1e9, 1..20)) {
            let s = summarize(&v).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert_eq!(s.n, v.len());
        }
    }
}
