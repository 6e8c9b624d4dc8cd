//! One place that turns a supervised trial into a `TrialOutcome`, for both
//! runners: how it ended, the throughput, what its processes used (the ranks'
//! own wait4 figures on this machine, or the nodes' reports across nodes)
//! and the stderr tail worth showing. Each runner adds what only it knows
//! (GPU samples, the machine's other load).

use std::time::Duration;

use super::{NodeUsage, TrialEnd, TrialOutcome};
use crate::job::Outcome;
use crate::measure::throughput::Hit;

/// What a trial's processes used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Used {
    pub cpu: Duration,
    pub voluntary_cs: i64,
    pub involuntary_cs: i64,
    pub peak_rss_kib: i64,
}

impl Used {
    /// The ranks supervised here (and their waited-for children).
    pub(crate) fn of_ranks(o: &Outcome) -> Used {
        Used {
            cpu: o.results.iter().map(|r| r.cpu).sum(),
            voluntary_cs: o.results.iter().map(|r| r.voluntary_cs).sum(),
            involuntary_cs: o.results.iter().map(|r| r.involuntary_cs).sum(),
            peak_rss_kib: o.results.iter().map(|r| r.max_rss_kib).sum(),
        }
    }

    /// Every node's ranks, as the nodes reported them.
    pub(crate) fn of_nodes(nodes: &[NodeUsage]) -> Used {
        Used {
            cpu: Duration::from_secs_f64(nodes.iter().map(|n| n.cpu_s).sum()),
            voluntary_cs: nodes.iter().map(|n| n.voluntary_cs).sum(),
            involuntary_cs: nodes.iter().map(|n| n.involuntary_cs).sum(),
            peak_rss_kib: nodes.iter().map(|n| n.peak_rss_kib).sum(),
        }
    }
}

/// How the trial ended: a signal, the timeout, the first failing process, or well.
pub(super) fn end_of(o: &Outcome) -> TrialEnd {
    if o.signal.is_some() {
        TrialEnd::Interrupted
    } else if o.timed_out {
        TrialEnd::TimedOut
    } else if let Some(i) = o.first_failure {
        let r = &o.results[i];
        TrialEnd::RankFailed {
            local_rank: r.local_rank,
            pid: r.pid,
            exit: r.exit,
        }
    } else {
        TrialEnd::Ok
    }
}

/// The failing process's last stderr lines; on a timeout with no failure,
/// the first process's.
fn tail_of(o: &Outcome) -> Vec<String> {
    let tail = o
        .first_failure
        .and_then(|i| o.tails.get(i).cloned())
        .unwrap_or_default();
    if o.timed_out && tail.is_empty() {
        o.tails.first().cloned().unwrap_or_default()
    } else {
        tail
    }
}

impl TrialOutcome {
    /// A trial that ran: its end, throughput, use and stderr tail; no GPU
    /// figures, no outside load, no nodes (the runner adds those it has).
    pub(crate) fn of(o: &Outcome, hit: Option<Hit>, used: Used) -> TrialOutcome {
        TrialOutcome {
            end: end_of(o),
            hit,
            wall: o.wall,
            cpu: used.cpu,
            voluntary_cs: used.voluntary_cs,
            involuntary_cs: used.involuntary_cs,
            peak_rss_kib: used.peak_rss_kib,
            stderr_tail: tail_of(o),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Exit;
    use crate::job::RankResult;

    fn result(rank: usize, exit: Exit, cpu_ms: u64) -> RankResult {
        RankResult {
            local_rank: rank,
            pid: 100 + rank as i32,
            exit,
            cpu: Duration::from_millis(cpu_ms),
            voluntary_cs: 2,
            involuntary_cs: 3,
            max_rss_kib: 1000,
            wall: Duration::ZERO,
        }
    }

    #[test]
    fn the_first_failure_ends_it_with_its_tail_and_use_adds_up() {
        let o = Outcome {
            results: vec![
                result(0, Exit::Code(0), 500),
                result(1, Exit::Signal(9), 250),
            ],
            first_failure: Some(1),
            tails: vec![vec!["zero".into()], vec!["one".into()]],
            wall: Duration::from_secs(2),
            ..Default::default()
        };
        let t = TrialOutcome::of(&o, None, Used::of_ranks(&o));
        assert_eq!(
            t.end,
            TrialEnd::RankFailed {
                local_rank: 1,
                pid: 101,
                exit: Exit::Signal(9)
            }
        );
        assert_eq!(t.stderr_tail, vec!["one".to_string()]);
        assert_eq!(t.cpu, Duration::from_millis(750));
        assert_eq!(
            (t.voluntary_cs, t.involuntary_cs, t.peak_rss_kib),
            (4, 6, 2000)
        );
        assert_eq!(t.wall, Duration::from_secs(2));
    }

    #[test]
    fn a_timeout_shows_the_first_tail_and_a_signal_beats_both() {
        let mut o = Outcome {
            results: vec![result(0, Exit::Signal(9), 0)],
            tails: vec![vec!["slow".into()]],
            timed_out: true,
            ..Default::default()
        };
        let t = TrialOutcome::of(&o, None, Used::default());
        assert_eq!(
            (t.end, t.stderr_tail),
            (TrialEnd::TimedOut, vec!["slow".into()])
        );
        o.signal = Some(2);
        assert_eq!(end_of(&o), TrialEnd::Interrupted);
        let ok = Outcome::default();
        assert_eq!(end_of(&ok), TrialEnd::Ok);
        assert!(
            TrialOutcome::of(&ok, None, Used::default())
                .stderr_tail
                .is_empty()
        );
    }

    #[test]
    fn nodes_use_adds_their_reports() {
        let n = |cpu_s: f64| NodeUsage {
            host: "h".into(),
            node_rank: 0,
            ranks: 1,
            wall_s: 1.0,
            cpu_s,
            cpu_budget: 1.0,
            voluntary_cs: 1,
            involuntary_cs: 2,
            peak_rss_kib: 10,
            gpu_util_pct: None,
        };
        let u = Used::of_nodes(&[n(0.5), n(1.25)]);
        assert_eq!(u.cpu, Duration::from_millis(1750));
        assert_eq!(
            (u.voluntary_cs, u.involuntary_cs, u.peak_rss_kib),
            (2, 4, 20)
        );
    }
}
