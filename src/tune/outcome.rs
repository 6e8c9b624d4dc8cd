//! Trials into figures: one launch's outcome classified once into a reported
//! trial, then every configuration's summaries, speed-ups and the winner.

use super::model::{MetricSource, TrialEnd, TrialOutcome, TrialStatus, TuneReport};
use super::stats::{self, overlaps, summarize};
use super::{Trial, TuneConfig};

/// The table's words for what a configuration sets.
pub(super) fn describe(c: &TuneConfig) -> String {
    let r = &c.request;
    if r.unset_threads {
        return format!("threads unset, policy {}", r.policy);
    }
    let mut s = format!(
        "threads {}, policy {}, workers {}",
        r.threads, r.policy, r.workers
    );
    if r.allocator != crate::plan::AllocatorChoice::None {
        s.push_str(&format!(", allocator {}", r.allocator));
    }
    if r.profile == crate::plan::Profile::Seed {
        s.push_str(", profile seed");
    }
    if r.smt {
        s.push_str(", smt");
    }
    if r.omp_wait != crate::plan::WaitPolicy::Default {
        s.push_str(&format!(", wait {}", r.omp_wait));
    }
    s
}

/// One measured trial. `mode` is how throughput is read, and `unit` the unit
/// every scored trial must share (rates in another unit are not comparable).
pub(super) fn trial(
    o: &TrialOutcome,
    round: usize,
    budget: f64,
    mode: MetricSource,
    unit: Option<&str>,
) -> Trial {
    let wall = o.wall.as_secs_f64().max(1e-9);
    let mut status = o.end.status();
    let mut message = o.end.message();
    let throughput = match mode {
        _ if o.end != TrialEnd::Ok => None,
        MetricSource::Wall => Some(1.0 / wall),
        MetricSource::Output => match &o.hit {
            Some(h) if unit.is_none() || h.unit.as_deref() == unit => Some(h.value),
            other => {
                message = Some(match other {
                    Some(h) => format!(
                        "printed {} {}, not {}: not comparable",
                        h.value,
                        h.unit.as_deref().unwrap_or("?"),
                        unit.unwrap_or("?")
                    ),
                    None => "printed no throughput".to_string(),
                });
                status = TrialStatus::NoMetric;
                None
            }
        },
    };
    let ok = status == TrialStatus::Ok;
    Trial {
        round,
        status,
        throughput,
        hit: o.hit.clone(),
        wall_s: wall,
        cpu_util_pct: 100.0 * o.cpu.as_secs_f64() / (wall * budget.max(1e-9)),
        voluntary_cs_per_s: o.voluntary_cs as f64 / wall,
        involuntary_cs_per_s: o.involuntary_cs as f64 / wall,
        peak_rss_mib: o.peak_rss_kib as f64 / 1024.0,
        gpu_util_pct: o.gpu_util_pct,
        gpu_mem_mib: o.gpu_mem_mib,
        message,
        stderr_tail: if ok { vec![] } else { o.stderr_tail.clone() },
        outlier: false,
    }
}

fn median_of(trials: &[Trial], f: impl Fn(&Trial) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Ok)
        .filter_map(f)
        .collect();
    summarize(&v).map(|s| s.median)
}

/// Recompute every summary, the baseline's speed-ups and the winner.
pub fn finish(report: &mut TuneReport) {
    for c in &mut report.configs {
        let v: Vec<f64> = c
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Ok)
            .filter_map(|t| t.throughput)
            .collect();
        c.throughput = summarize(&v);
        if let Some(sum) = c.throughput {
            for t in &mut c.trials {
                t.outlier = t.throughput.is_some_and(|x| stats::is_outlier(&sum, x));
            }
            // A first trial well below the others: warm caches, a cold disk.
            let rest: Vec<f64> = c
                .trials
                .iter()
                .filter(|t| t.round > 0 && t.status == TrialStatus::Ok)
                .filter_map(|t| t.throughput)
                .collect();
            let first = c
                .trials
                .iter()
                .find(|t| t.round == 0)
                .and_then(|t| t.throughput);
            c.slow_first_trial = match (first, summarize(&rest)) {
                (Some(f), Some(r)) if r.n >= 2 => f < r.median * 0.9,
                _ => false,
            };
        }
        c.cpu_util_pct = median_of(&c.trials, |t| Some(t.cpu_util_pct));
        c.voluntary_cs_per_s = median_of(&c.trials, |t| Some(t.voluntary_cs_per_s));
        c.involuntary_cs_per_s = median_of(&c.trials, |t| Some(t.involuntary_cs_per_s));
        c.peak_rss_mib = median_of(&c.trials, |t| Some(t.peak_rss_mib));
        c.gpu_util_pct = median_of(&c.trials, |t| t.gpu_util_pct);
        c.gpu_mem_mib = c
            .trials
            .iter()
            .filter_map(|t| t.gpu_mem_mib)
            .reduce(f64::max);
    }
    let base = report
        .baseline
        .as_ref()
        .and_then(|b| report.configs.iter().find(|c| &c.name == b))
        .and_then(|c| c.throughput);
    for c in &mut report.configs {
        c.speedup = match (c.throughput, base) {
            (Some(t), Some(b)) if b.median > 0.0 => Some(t.median / b.median),
            _ => None,
        };
    }
    // A configuration halving dropped lost when both had as many trials; its
    // median is not compared with later rounds' (the machine drifts).
    let best_of = |dropped_too: bool| {
        report
            .configs
            .iter()
            .filter(|c| dropped_too || c.dropped_after_round.is_none())
            .filter_map(|c| Some((c.name.clone(), c.throughput?)))
            .max_by(|a, b| a.1.median.total_cmp(&b.1.median))
    };
    let best = best_of(false).or_else(|| best_of(true));
    report.winner = best.as_ref().map(|(n, _)| n.clone());
    for c in &mut report.configs {
        c.indistinguishable_from_winner = match (&best, c.throughput) {
            (Some((n, w)), Some(t)) => *n != c.name && overlaps(w, &t),
            _ => false,
        };
    }
}
