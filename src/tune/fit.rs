//! One model over the whole table: log throughput = block + configuration +
//! noise, a randomized complete block design in which each round is a block
//! (a round the machine's speed stepped in is two blocks, split at the step).
//! Every configuration's trials estimate the noise together, so a comparison
//! has (trials - blocks - configurations + 1) degrees of freedom, not
//! (rounds - 1) as a paired t-interval has, and a round some configurations
//! skipped (halving, the extra rounds of the undecided rows) still counts.
//!
//! The fit is robust: Huber's M-estimator by iteratively reweighted least
//! squares, the scale a MAD of the residuals, so one disturbed trial is
//! down-weighted instead of deciding an interval. Its covariance is Huber's (as R's `summary.rlm` computes it):
//! the residual spread of psi, over the mean of psi' squared, times Huber's
//! small-sample factor kappa, times the design's own (X'X)^-1.
//!
//! The block effects are absorbed (intrablock analysis), so the work is the
//! configurations' reduced normal equations, k x k, whatever the rounds.

/// One scored trial.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Obs {
    pub config: usize,
    pub block: usize,
    /// Log throughput.
    pub y: f64,
}

/// Huber's tuning constant. 2.0 rather than the textbook 1.345: on normal
/// noise it clips about 5% of trials instead of 18%, so the t-intervals keep
/// their level at a tune's few degrees of freedom (with 1.345 the simulation's
/// A/A pair was called different in 6.5% of drifting tunes, with 2.0 in
/// 4.7%), while a trial at half speed still gets a weight near 0.2.
const HUBER_K: f64 = 2.0;

/// The fitted model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fit {
    /// Each configuration's effect (log scale), relative to one of them;
    /// None where no block joins it to the rest.
    pub effects: Vec<Option<f64>>,
    /// (X'X)^-1 of the effects (the fixed one's row and column are zero).
    cov: Vec<Vec<f64>>,
    /// The noise's standard deviation as the intervals use it (log scale).
    pub sigma: f64,
    /// Residual degrees of freedom: trials less parameters.
    pub df: usize,
    /// Trials in the fit.
    pub n: usize,
    /// Each observation's Huber weight (1: fully counted), in input order;
    /// None for one outside the fit.
    pub weights: Vec<Option<f64>>,
}

/// An estimate of exp(effect a - effect b) with its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Contrast {
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
}

impl Fit {
    /// a over b, with an interval at two-sided confidence `level` (unbounded
    /// without degrees of freedom); None when either is not estimable.
    pub(crate) fn contrast(&self, a: usize, b: usize, level: f64) -> Option<Contrast> {
        let d = self.effects.get(a).copied()?? - self.effects.get(b).copied()??;
        if self.df == 0 || !self.sigma.is_finite() {
            return Some(Contrast {
                estimate: d.exp(),
                low: 0.0,
                high: f64::INFINITY,
            });
        }
        let v = (self.cov[a][a] + self.cov[b][b] - 2.0 * self.cov[a][b]).max(0.0);
        let t = super::stats::t_quantile(1.0 - (1.0 - level) / 2.0, self.df);
        let half = t * self.sigma * v.sqrt();
        Some(Contrast {
            estimate: d.exp(),
            low: (d - half).exp(),
            high: (d + half).exp(),
        })
    }
}

/// The configurations joined to `root` through shared blocks.
fn component(obs: &[Obs], k: usize, root: usize) -> Vec<bool> {
    let mut inside = vec![false; k];
    inside[root] = true;
    loop {
        let blocks: std::collections::HashSet<usize> = obs
            .iter()
            .filter(|o| inside[o.config])
            .map(|o| o.block)
            .collect();
        let mut grew = false;
        for o in obs {
            if blocks.contains(&o.block) && !inside[o.config] {
                inside[o.config] = true;
                grew = true;
            }
        }
        if !grew {
            return inside;
        }
    }
}

/// The inverse of a small symmetric positive definite matrix (Gauss-Jordan
/// with partial pivoting); None when singular.
fn invert(mut a: Vec<Vec<f64>>) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let mut inv: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    let scale = a
        .iter()
        .flatten()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-300);
    for col in 0..n {
        let p = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[p][col].abs() < 1e-10 * scale {
            return None;
        }
        a.swap(col, p);
        inv.swap(col, p);
        let d = a[col][col];
        for j in 0..n {
            a[col][j] /= d;
            inv[col][j] /= d;
        }
        for r in 0..n {
            if r != col {
                let f = a[r][col];
                if f != 0.0 {
                    for j in 0..n {
                        a[r][j] -= f * a[col][j];
                        inv[r][j] -= f * inv[col][j];
                    }
                }
            }
        }
    }
    Some(inv)
}

/// The reduced normal equations of the configurations (blocks absorbed),
/// weighted by `w`: C and Q, and each block's total weight.
fn reduced(
    obs: &[(usize, usize, f64)],
    w: &[f64],
    blocks: usize,
    k: usize,
) -> (Vec<Vec<f64>>, Vec<f64>, Vec<f64>) {
    // Per block: total weight, weighted sum, and per configuration.
    let mut wb = vec![0.0; blocks];
    let mut sb = vec![0.0; blocks];
    let mut nbc = vec![vec![0.0; k]; blocks];
    let mut c = vec![vec![0.0; k]; k];
    let mut q = vec![0.0; k];
    for (&(cfg, b, y), &wi) in obs.iter().zip(w) {
        wb[b] += wi;
        sb[b] += wi * y;
        nbc[b][cfg] += wi;
        c[cfg][cfg] += wi;
        q[cfg] += wi * y;
    }
    for b in 0..blocks {
        if wb[b] <= 0.0 {
            continue;
        }
        for i in 0..k {
            if nbc[b][i] == 0.0 {
                continue;
            }
            q[i] -= nbc[b][i] * sb[b] / wb[b];
            for j in 0..k {
                c[i][j] -= nbc[b][i] * nbc[b][j] / wb[b];
            }
        }
    }
    (c, q, wb)
}

/// A weighted least-squares solution.
struct Solved {
    /// The effects (configuration 0 fixed at 0).
    tau: Vec<f64>,
    /// Each observation's residual.
    resid: Vec<f64>,
    /// (X'WX)^-1 of the effects.
    cov: Vec<Vec<f64>>,
}

/// Least squares with weights `w` over `obs` (configuration, block, y).
fn solve(obs: &[(usize, usize, f64)], w: &[f64], blocks: usize, k: usize) -> Option<Solved> {
    let (c, q, wb) = reduced(obs, w, blocks, k);
    // Configuration 0 is fixed: solve for 1..k.
    let m: Vec<Vec<f64>> = (1..k).map(|i| (1..k).map(|j| c[i][j]).collect()).collect();
    let inv = if k > 1 { invert(m)? } else { vec![] };
    let mut tau = vec![0.0; k];
    let mut cov = vec![vec![0.0; k]; k];
    for i in 1..k {
        tau[i] = (1..k).map(|j| inv[i - 1][j - 1] * q[j]).sum();
        for j in 1..k {
            cov[i][j] = inv[i - 1][j - 1];
        }
    }
    // Block effects: each block's weighted mean of what the effects leave.
    let mut left = vec![0.0; blocks];
    for (&(cfg, b, y), &wi) in obs.iter().zip(w) {
        left[b] += wi * (y - tau[cfg]);
    }
    let beta: Vec<f64> = left
        .iter()
        .zip(&wb)
        .map(|(l, w)| if *w > 0.0 { l / w } else { 0.0 })
        .collect();
    let resid = obs
        .iter()
        .map(|&(cfg, b, y)| y - beta[b] - tau[cfg])
        .collect();
    Some(Solved { tau, resid, cov })
}

/// Fit the model to `obs` over `k` configurations: the configurations joined
/// to the best-measured one through shared blocks. None when fewer than two
/// configurations are joined.
pub(crate) fn fit(obs: &[Obs], k: usize) -> Option<Fit> {
    let mut count = vec![0usize; k];
    for o in obs {
        count[o.config] += 1;
    }
    let root = (0..k).max_by_key(|&i| (count[i], std::cmp::Reverse(i)))?;
    let inside = component(obs, k, root);
    // Renumber what is inside: configurations (root first) and blocks.
    let mut cfg_ix = vec![None; k];
    let mut m = 0;
    for i in std::iter::once(root).chain((0..k).filter(|&i| i != root)) {
        if inside[i] && count[i] > 0 {
            cfg_ix[i] = Some(m);
            m += 1;
        }
    }
    if m < 2 {
        return None;
    }
    let mut block_ix = std::collections::HashMap::new();
    let mut used = vec![];
    let mut data = vec![];
    for (at, o) in obs.iter().enumerate() {
        if let Some(c) = cfg_ix[o.config] {
            let n = block_ix.len();
            let b = *block_ix.entry(o.block).or_insert(n);
            data.push((c, b, o.y));
            used.push(at);
        }
    }
    let blocks = block_ix.len();
    let n = data.len();
    // Blocks of one trial say nothing about the configurations.
    let mut size = vec![0usize; blocks];
    for d in &data {
        size[d.1] += 1;
    }
    let informative: Vec<usize> = (0..n).filter(|&i| size[data[i].1] >= 2).collect();
    let p = blocks + m - 1;
    let df = n.saturating_sub(p);

    let ones = vec![1.0; n];
    // (X'X)^-1 is the unweighted design's, as in Huber's covariance.
    let Solved {
        mut tau,
        mut resid,
        cov: cov_m,
    } = solve(&data, &ones, blocks, m)?;
    let mut w = ones.clone();
    let mut s = 0.0;
    // The MAD of informative residuals, corrected for their leverage (on
    // average 1 - h = df / informative).
    let leverage = if df > 0 {
        (informative.len() as f64 / df as f64).sqrt()
    } else {
        1.0
    };
    if df > 0 {
        for _ in 0..50 {
            // Not empty: df > 0 needs a block of two trials.
            let abs: Vec<f64> = informative.iter().map(|&i| resid[i].abs()).collect();
            let mad = super::stats::median(&abs);
            s = 1.4826 * mad * leverage;
            if s <= 1e-12 {
                // Over half the residuals are exactly 0 (repeated values):
                // the least-squares spread is the scale.
                let ss: f64 = informative.iter().map(|&i| resid[i] * resid[i]).sum();
                s = (ss / df as f64).sqrt();
            }
            if s <= 1e-12 {
                break;
            }
            let next: Vec<f64> = resid
                .iter()
                .map(|r| {
                    let u = (r / s).abs();
                    if u <= HUBER_K { 1.0 } else { HUBER_K / u }
                })
                .collect();
            let again = solve(&data, &next, blocks, m)?;
            let moved = again
                .tau
                .iter()
                .zip(&tau)
                .fold(0.0f64, |x, (a, b)| x.max((a - b).abs()));
            tau = again.tau;
            resid = again.resid;
            w = next;
            if moved < 1e-9 {
                break;
            }
        }
    }
    // Huber's covariance: s^2 sum psi^2 / df, over mean(psi')^2, times kappa.
    let sigma = if df == 0 {
        f64::INFINITY
    } else if s <= 1e-12 {
        0.0
    } else {
        let u: Vec<f64> = informative.iter().map(|&i| resid[i] / s).collect();
        let psi2: f64 = u.iter().map(|x| x.clamp(-HUBER_K, HUBER_K).powi(2)).sum();
        let d: Vec<f64> = u
            .iter()
            .map(|x| f64::from(u8::from(x.abs() <= HUBER_K)))
            .collect();
        let nn = d.len() as f64;
        let mean = d.iter().sum::<f64>() / nn;
        if mean <= 0.0 {
            f64::INFINITY
        } else {
            let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / nn;
            let kappa = 1.0 + p as f64 / n as f64 * var / (mean * mean);
            s * (psi2 / df as f64).sqrt() * kappa / mean
        }
    };
    let mut effects = vec![None; k];
    let mut cov = vec![vec![0.0; k]; k];
    for i in 0..k {
        if let Some(a) = cfg_ix[i] {
            effects[i] = Some(tau[a]);
            for j in 0..k {
                if let Some(b) = cfg_ix[j] {
                    cov[i][j] = cov_m[a][b];
                }
            }
        }
    }
    let mut weights = vec![None; obs.len()];
    for (d, &at) in used.iter().enumerate() {
        weights[at] = Some(w[d]);
    }
    Some(Fit {
        effects,
        cov,
        sigma,
        df,
        n,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(table: &[&[Option<f64>]]) -> Vec<Obs> {
        // table[round][config]: throughput.
        let mut v = vec![];
        for (b, row) in table.iter().enumerate() {
            for (c, x) in row.iter().enumerate() {
                if let Some(x) = x {
                    v.push(Obs {
                        config: c,
                        block: b,
                        y: x.ln(),
                    });
                }
            }
        }
        v
    }

    #[test]
    fn a_complete_table_has_rounds_less_one_times_configs_less_one_df() {
        let s = |x: f64| Some(x);
        let t: Vec<Vec<Option<f64>>> = (0..5)
            .map(|r| {
                let m = 1.0 + 0.3 * r as f64; // the machine drifts between rounds
                let e = [1.0, 1.02, 0.98, 1.01, 0.99][r];
                vec![s(100.0 * m * e), s(120.0 * m / e), s(90.0 * m * e * e)]
            })
            .collect();
        let rows: Vec<&[Option<f64>]> = t.iter().map(|r| r.as_slice()).collect();
        let f = fit(&obs(&rows), 3).unwrap();
        assert_eq!(f.df, 4 * 2);
        assert_eq!(f.n, 15);
        let c = f.contrast(1, 0, 0.95).unwrap();
        assert!((c.estimate - 1.2).abs() < 0.03, "{c:?}");
        assert!(c.low > 1.0 && c.high < 1.45, "{c:?}");
        let same = f.contrast(0, 0, 0.95).unwrap();
        assert_eq!((same.estimate, same.low, same.high), (1.0, 1.0, 1.0));
    }

    /// Least squares on a balanced table equals the textbook: effect
    /// differences are differences of column means, sigma^2 the residual
    /// mean square of the two-way table.
    #[test]
    fn balanced_least_squares_matches_the_two_way_table() {
        let y = [
            [1.0, 2.0, 4.0],
            [2.0, 2.5, 5.5],
            [0.5, 2.0, 3.0],
            [1.5, 3.5, 4.5],
        ];
        let mut o = vec![];
        for (b, row) in y.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                o.push(Obs {
                    config: c,
                    block: b,
                    y: *v,
                });
            }
        }
        let f = fit(&o, 3).unwrap();
        let col = |c: usize| y.iter().map(|r| r[c]).sum::<f64>() / 4.0;
        let d = f.effects[2].unwrap() - f.effects[0].unwrap();
        assert!((d - (col(2) - col(0))).abs() < 1e-9);
        // Var(effect difference) = 2 sigma^2 / rounds.
        let v = f.cov[2][2] + f.cov[0][0] - 2.0 * f.cov[2][0];
        assert!((v - 0.5).abs() < 1e-9, "{v}");
        assert_eq!(f.df, 6);
    }

    #[test]
    fn one_wild_trial_is_down_weighted_not_deciding() {
        // Four configurations, eight rounds, small noise; one trial of
        // configuration 1 at half speed (a disturbed trial).
        let noise: [f64; 8] = [0.01, -0.02, 0.015, 0.0, -0.01, 0.02, -0.015, 0.005];
        let mut t = vec![];
        for r in 0..8 {
            let e = noise[r];
            let e2 = noise[(r + 3) % 8];
            let e3 = noise[(r + 5) % 8];
            let mut row = vec![
                Some(100.0 * (e).exp()),
                Some(110.0 * (e2).exp()),
                Some(100.0 * (e3).exp()),
                Some(95.0 * (-e).exp()),
            ];
            if r == 4 {
                row[1] = Some(55.0);
            }
            t.push(row);
        }
        let rows: Vec<&[Option<f64>]> = t.iter().map(|r| r.as_slice()).collect();
        let o = obs(&rows);
        let f = fit(&o, 4).unwrap();
        let c = f.contrast(1, 0, 0.95).unwrap();
        assert!(c.low > 1.0, "one wild trial must not decide: {c:?}");
        let wild = o
            .iter()
            .position(|x| x.config == 1 && x.block == 4)
            .unwrap();
        assert!(f.weights[wild].unwrap() < 0.2, "{:?}", f.weights[wild]);
    }

    #[test]
    fn rounds_that_skip_configurations_still_count() {
        // Round 0-4 all three; rounds 5-9 only 0 and 1 (the extra rounds).
        let mut t = vec![];
        for r in 0..10 {
            let e: f64 = [0.01, -0.02, 0.015, 0.0, -0.01][r % 5] * if r >= 5 { -1.0 } else { 1.0 };
            let m = 1.0 + 0.1 * r as f64;
            t.push(vec![
                Some(100.0 * m * e.exp()),
                Some(104.0 * m * (-e).exp()),
                (r < 5).then_some(80.0 * m),
            ]);
        }
        let rows: Vec<&[Option<f64>]> = t.iter().map(|r| r.as_slice()).collect();
        let f = fit(&obs(&rows), 3).unwrap();
        assert_eq!(f.n, 25);
        assert_eq!(f.df, 25 - 10 - 2);
        let c = f.contrast(1, 0, 0.95).unwrap();
        assert!((c.estimate - 1.04).abs() < 0.01 && c.low > 1.0, "{c:?}");
    }

    /// Observations from (configuration, block, y).
    fn at(v: &[(usize, usize, f64)]) -> Vec<Obs> {
        v.iter()
            .map(|&(config, block, y)| Obs { config, block, y })
            .collect()
    }

    #[test]
    fn a_configuration_no_block_joins_is_not_estimable() {
        let o = at(&[
            (0, 0, 1.0),
            (1, 0, 1.1),
            (0, 1, 1.0),
            (1, 1, 1.2),
            (2, 2, 5.0),
        ]);
        let f = fit(&o, 3).unwrap();
        assert!(f.effects[2].is_none() && f.contrast(2, 0, 0.95).is_none());
        assert!(f.contrast(1, 0, 0.95).is_some());
        assert!(
            fit(&o[..1], 3).is_none(),
            "one configuration: nothing to compare"
        );
    }

    #[test]
    fn one_round_has_no_interval() {
        let o = at(&[(0, 0, 1.0), (1, 0, 1.1)]);
        let f = fit(&o, 2).unwrap();
        let c = f.contrast(1, 0, 0.95).unwrap();
        assert_eq!((c.low, c.high), (0.0, f64::INFINITY));
        assert!((c.estimate - 0.1f64.exp()).abs() < 1e-12);
    }
}
