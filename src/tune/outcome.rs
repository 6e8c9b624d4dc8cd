//! Trials into figures: one launch's outcome classified once into a reported
//! trial, then every configuration's summaries, speed-ups and the winner.

use super::fit;
use super::model::{
    Analysis, ConfigResult, DISTURBED, MetricSource, NodeSummary, NodeTrial, Tie, TrialEnd,
    TrialOutcome, TrialStatus, TuneReport, Warning,
};
use super::stats::{self, Verdict, summarize};
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
    let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
    let (outside_cpu_s, steal_s) = (secs(o.outside_cpu), secs(o.steal));
    let disturbance = match (outside_cpu_s, steal_s) {
        (Some(x), Some(y)) => Some((x + y) / (wall * budget.max(1e-9))),
        _ => None,
    };
    // Multi-node: CPU % of every node's budget together, and each node's own.
    let cpu_util_pct = if o.nodes.is_empty() {
        100.0 * o.cpu.as_secs_f64() / (wall * budget.max(1e-9))
    } else {
        let cpu: f64 = o.nodes.iter().map(|n| n.cpu_s).sum();
        let capacity: f64 = o.nodes.iter().map(|n| n.wall_s * n.cpu_budget).sum();
        100.0 * cpu / capacity.max(1e-9)
    };
    Trial {
        round,
        status,
        throughput,
        hit: o.hit.clone(),
        wall_s: wall,
        cpu_util_pct,
        nodes: o
            .nodes
            .iter()
            .map(|n| NodeTrial {
                host: n.host.clone(),
                cpu_util_pct: n.cpu_util_pct(),
                gpu_util_pct: n.gpu_util_pct,
            })
            .collect(),
        voluntary_cs_per_s: o.voluntary_cs as f64 / wall,
        involuntary_cs_per_s: o.involuntary_cs as f64 / wall,
        peak_rss_mib: o.peak_rss_kib as f64 / 1024.0,
        gpu_util_pct: o.gpu_util_pct,
        gpu_mem_mib: o.gpu_mem_mib,
        gpu_job_mem_mib: o.gpu_job_mem_mib,
        gpu_others: o.gpu_others.clone(),
        message,
        stderr_tail: if ok { vec![] } else { o.stderr_tail.clone() },
        outlier: false,
        figures: if ok {
            o.figures.clone()
        } else {
            Default::default()
        },
        seq: 0,
        ratio: None,
        outside_cpu_s,
        steal_s,
        disturbance,
        disturbed: disturbance.is_some_and(|d| d > DISTURBED),
        weight: None,
    }
}

/// Each node's medians over the successful trials, by node rank (the first
/// trial's hosts).
fn node_summaries(trials: &[Trial]) -> Vec<NodeSummary> {
    let Some(first) = trials.iter().find(|t| !t.nodes.is_empty()) else {
        return vec![];
    };
    first
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let of = |f: &dyn Fn(&NodeTrial) -> Option<f64>| {
                median_of(trials, |t| t.nodes.get(i).and_then(f))
            };
            NodeSummary {
                host: n.host.clone(),
                cpu_util_pct: of(&|n| Some(n.cpu_util_pct)),
                gpu_util_pct: of(&|n| n.gpu_util_pct),
            }
        })
        .collect()
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
pub(crate) fn finish(report: &mut TuneReport) {
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
        c.gpu_job_mem_mib = c
            .trials
            .iter()
            .filter_map(|t| t.gpu_job_mem_mib)
            .reduce(f64::max);
        c.nodes = node_summaries(&c.trials);
        c.figures = figure_summaries(&c.trials);
    }
    if let Some(t) = report
        .configs
        .iter()
        .flat_map(|c| &c.trials)
        .find(|t| !t.nodes.is_empty())
    {
        report.hosts = t.nodes.iter().map(|n| n.host.clone()).collect();
    }
    compare(report);
}

/// Each figure the scored trials printed, over those trials.
fn figure_summaries(
    trials: &[crate::tune::model::Trial],
) -> std::collections::BTreeMap<String, stats::Summary> {
    let mut by: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for t in trials.iter().filter(|t| t.status == TrialStatus::Ok) {
        for (k, v) in &t.figures {
            by.entry(k.clone()).or_default().push(*v);
        }
    }
    by.into_iter()
        .filter_map(|(k, v)| Some((k, summarize(&v)?)))
        .collect()
}

/// A configuration's scored throughput by round (None where it has none).
pub(super) fn by_round(c: &ConfigResult, skip_disturbed: bool) -> Vec<Option<f64>> {
    let rounds = c.trials.iter().map(|t| t.round + 1).max().unwrap_or(0);
    let mut v = vec![None; rounds];
    for t in &c.trials {
        if t.status == TrialStatus::Ok && !(skip_disturbed && t.disturbed) {
            v[t.round] = t.throughput;
        }
    }
    v
}

/// Speed-ups against the reference, the winner (ties chosen by rule), each
/// configuration against the winner, and drift: every interval from one
/// model of the whole table (`fit`), the per-round ratios kept beside it.
fn compare(report: &mut TuneReport) {
    let level = report.interval_level;
    let rounds: Vec<Vec<Option<f64>>> = report.configs.iter().map(|c| by_round(c, false)).collect();
    let reference = report.index_of(report.baseline.as_ref());
    let (step, reported) = machine_drift(report);
    let model = model(report, step);
    // a against b: the rounds' ratios, the model's estimate and interval
    // (the paired t-interval where the model cannot compare them).
    let cmp = |a: usize, b: usize| -> Option<stats::Paired> {
        let contrast = model.as_ref().and_then(|f| f.contrast(a, b, level));
        match (stats::paired(&rounds[a], &rounds[b], level), contrast) {
            (Some(p), Some(c)) => Some(stats::Paired {
                low: c.low,
                high: c.high,
                estimate: Some(c.estimate),
                ..p
            }),
            (None, Some(c)) => Some(stats::Paired {
                ratios: vec![],
                median: c.estimate,
                low: c.low,
                high: c.high,
                estimate: Some(c.estimate),
            }),
            (p, None) => p,
        }
    };
    for i in 0..report.configs.len() {
        let p = reference.and_then(|r| cmp(i, r));
        let c = &mut report.configs[i];
        c.speedup = p.as_ref().map(|p| p.estimate.unwrap_or(p.median));
        c.speedup_low = p.as_ref().map(|p| p.low).filter(|x| *x > 0.0);
        c.speedup_high = p.as_ref().map(|p| p.high).filter(|x| x.is_finite());
        for t in &mut c.trials {
            let base = reference.and_then(|r| *rounds[r].get(t.round)?);
            t.ratio = match (t.throughput, base) {
                (Some(x), Some(b)) if t.status == TrialStatus::Ok && b > 0.0 => Some(x / b),
                _ => None,
            };
        }
    }
    let effects: Option<Vec<Option<f64>>> = model.as_ref().map(|f| f.effects.clone());
    let Some(winner) = choose_winner(report, effects.as_deref(), reference.is_some(), &cmp) else {
        report.winner = None;
        report.tie = None;
        return;
    };
    for i in 0..report.configs.len() {
        let c = &report.configs[i];
        // A row the race stopped keeps the comparison that decided it.
        let p = match c.stopped.as_ref().and_then(|s| s.vs_leader.clone()) {
            Some(p) if i != winner => Some(p),
            _ => (i != winner).then(|| cmp(i, winner)).flatten(),
        };
        let c = &mut report.configs[i];
        // One round beside the winner: no mark either way.
        c.indistinguishable_from_winner = p
            .as_ref()
            .is_some_and(|p| p.ratios.len() >= 2 && p.verdict() == Verdict::NotDistinguishable);
        c.vs_winner = p;
    }
    report.drift = reported;
    report
        .warnings
        .retain(|w| !matches!(w, Warning::Drift { .. }));
    if let Some(d) = report.drift {
        report.warnings.push(Warning::Drift { ratio: d.ratio });
    }
    gpu_shared_warning(report);
}

/// What the report says of the model.
pub(super) const MODEL: &str = "log throughput = round + configuration + noise \
     (a randomized complete block design), Huber-weighted";

/// A step smaller than this is noise to the model: no round is split for it.
const MODEL_STEP: f64 = 1.05;

/// The model over every scored trial: each round a block, a round that
/// straddles `step` two blocks. Writes each trial's weight and the report's
/// analysis.
fn model(report: &mut TuneReport, step: Option<stats::Drift>) -> Option<fit::Fit> {
    let mut obs = vec![];
    let mut at = vec![];
    // Rounds with scored trials on both sides of the step.
    let mut sides: std::collections::HashMap<usize, (bool, bool)> = Default::default();
    for c in &report.configs {
        for t in c.trials.iter().filter(|t| scored(t)) {
            if let Some(s) = step {
                let e = sides.entry(t.round).or_default();
                if t.seq < s.at_trial {
                    e.0 = true;
                } else {
                    e.1 = true;
                }
            }
        }
    }
    let mut split: Vec<usize> = sides
        .iter()
        .filter(|(_, (a, b))| *a && *b)
        .map(|(r, _)| *r)
        .collect();
    split.sort_unstable();
    for (ci, c) in report.configs.iter().enumerate() {
        for (ti, t) in c.trials.iter().enumerate() {
            if !scored(t) {
                continue;
            }
            let after = step.is_some_and(|s| t.seq >= s.at_trial) && split.contains(&t.round);
            obs.push(fit::Obs {
                config: ci,
                block: 2 * t.round + usize::from(after),
                y: t.throughput.unwrap_or(1.0).ln(),
            });
            at.push((ci, ti));
        }
    }
    for c in &mut report.configs {
        for t in &mut c.trials {
            t.weight = None;
        }
    }
    let f = fit::fit(&obs, report.configs.len());
    let Some(f) = f else {
        report.analysis = None;
        return None;
    };
    let mut down = 0;
    for (&(ci, ti), w) in at.iter().zip(&f.weights) {
        report.configs[ci].trials[ti].weight = *w;
        down += usize::from(w.is_some_and(|w| w < 0.5));
    }
    let looks = super::race::Looks::new(report.runs, report.max_runs);
    report.analysis = Some(Analysis {
        model: MODEL.into(),
        trials: f.n,
        df: f.df,
        noise: f.sigma.is_finite().then(|| f.sigma.exp() - 1.0),
        down_weighted: down,
        split_rounds: split,
        correction: looks.describe(report.interval_level),
    });
    Some(f)
}

/// Scored: it ran, printed a positive throughput.
fn scored(t: &Trial) -> bool {
    t.status == TrialStatus::Ok && t.throughput.is_some_and(|x| x > 0.0)
}

/// The winner's index, the tie (if any) written into the report.
///
/// The leader: the highest effect in the model (without one, the highest
/// speed-up, or median without a reference) among configurations still
/// measured; a dropped one lost when both had as many trials, and is only a
/// candidate when nothing else is. Tied with the leader: measured beside it
/// in two rounds at least (a configuration that never was cannot be
/// compared) and its interval holds 1.00; the tie rule picks among them.
fn choose_winner(
    report: &mut TuneReport,
    effects: Option<&[Option<f64>]>,
    has_reference: bool,
    cmp: &dyn Fn(usize, usize) -> Option<stats::Paired>,
) -> Option<usize> {
    let score = |i: usize| {
        let c = &report.configs[i];
        match effects {
            Some(e) => e[i],
            None if has_reference => c.speedup,
            None => c.throughput.map(|t| t.median),
        }
    };
    let best = |dropped_too: bool| {
        (0..report.configs.len())
            .filter(|&i| dropped_too || report.configs[i].stopped.is_none())
            .filter_map(|i| Some((i, score(i)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    };
    let leader = best(false).or_else(|| best(true))?;
    let mut tied: Vec<usize> = (0..report.configs.len())
        .filter(|&i| {
            i == leader
                || (report.configs[i].dropped_after_round.is_none()
                    // While the race runs its leader is a row still measured.
                    && (report.complete || report.configs[i].stopped.is_none())
                    && cmp(i, leader).is_some_and(|p| {
                        p.ratios.len() >= 2 && p.verdict() == Verdict::NotDistinguishable
                    }))
        })
        .collect();
    tied.sort_by(|&a, &b| {
        let (ca, cb) = (&report.configs[a], &report.configs[b]);
        (ca.role.tie_rank(), score(b).unwrap_or(f64::MIN))
            .partial_cmp(&(cb.role.tie_rank(), score(a).unwrap_or(f64::MIN)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let winner = tied[0];
    report.winner = Some(report.configs[winner].name.clone());
    report.tie = (tied.len() > 1).then(|| Tie {
        configs: tied
            .iter()
            .map(|&i| report.configs[i].name.clone())
            .collect(),
        rule: TIE_RULE.into(),
    });
    Some(winner)
}

/// One warning naming every other process seen on the job's GPUs.
fn gpu_shared_warning(report: &mut TuneReport) {
    report
        .warnings
        .retain(|w| !matches!(w, Warning::GpuShared { .. }));
    let shared: Vec<&Trial> = report
        .configs
        .iter()
        .flat_map(|c| &c.trials)
        .filter(|t| !t.gpu_others.is_empty())
        .collect();
    if !shared.is_empty() {
        let mut others: Vec<String> = shared.iter().flat_map(|t| t.gpu_others.clone()).collect();
        others.sort();
        others.dedup();
        report.warnings.push(Warning::GpuShared {
            trials: shared.len(),
            others,
        });
    }
}

/// How a tie is decided, as the report says it.
pub(super) const TIE_RULE: &str =
    "the plan first, then the fewest changes from it, then the highest speed-up";

/// The machine's speed moved by at least this much before it is reported.
pub(super) const DRIFT_REPORTED: f64 = 1.2;

/// A change in the machine's speed, from every scored trial: its log
/// throughput less its configuration's mean, in the order the trials ran.
/// The change the model takes out (at least MODEL_STEP), and the one the
/// report states (at least DRIFT_REPORTED); `at_trial` is the `seq` of the
/// first trial after it.
fn machine_drift(report: &TuneReport) -> (Option<stats::Drift>, Option<stats::Drift>) {
    let mut points: Vec<(usize, f64)> = vec![];
    for c in &report.configs {
        let scored: Vec<&Trial> = c.trials.iter().filter(|t| scored(t)).collect();
        if scored.len() < 2 {
            continue;
        }
        let logs: Vec<f64> = scored
            .iter()
            .filter_map(|t| Some(t.throughput?.ln()))
            .collect();
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        points.extend(scored.iter().zip(&logs).map(|(t, l)| (t.seq, l - mean)));
    }
    points.sort_by_key(|p| p.0);
    let residuals: Vec<f64> = points.iter().map(|p| p.1).collect();
    let Some(d) = stats::drift(&residuals, MODEL_STEP) else {
        return (None, None);
    };
    let d = stats::Drift {
        at_trial: points[d.at_trial].0,
        ..d
    };
    (Some(d), (d.ratio >= DRIFT_REPORTED).then_some(d))
}
