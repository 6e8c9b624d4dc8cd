//! What a run says at its end: the per-rank summary, and the failing rank's
//! report (which rank, its pid, how it ended, its recorded exception or its
//! stderr tail), on one node or as one node of many.

use super::supervise::Outcome;

/// The end-of-run summary, one line per rank.
pub(crate) fn summary(o: &Outcome) -> String {
    let mut s = format!(
        "threadwise: {} rank(s) in {:.2} s\n{:<5} {:>8}  {:<34} {:>9} {:>9} {:>10} {:>9} {:>9}\n",
        o.results.len(),
        o.wall.as_secs_f64(),
        "rank",
        "pid",
        "end",
        "wall s",
        "cpu s",
        "max rss",
        "vol cs",
        "invol cs"
    );
    for r in &o.results {
        s.push_str(&format!(
            "{:<5} {:>8}  {:<34} {:>9.2} {:>9.2} {:>6.1} MiB {:>9} {:>9}\n",
            r.local_rank,
            r.pid,
            r.exit.describe(),
            r.wall.as_secs_f64(),
            r.cpu.as_secs_f64(),
            r.max_rss_kib as f64 / 1024.0,
            r.voluntary_cs,
            r.involuntary_cs
        ));
    }
    s
}

/// What to say about a failure: which rank, its pid, how, and its stderr tail.
/// With `errors`, the directory of the ranks' TORCHELASTIC_ERROR_FILEs: the
/// exception the failing rank recorded is its root cause, as torchrun says.
pub(crate) fn failure_report(o: &Outcome, errors: Option<&std::path::Path>) -> Option<String> {
    failure_report_on(o, errors, None)
}

/// `failure_report`; on one node of many (`host`) the line names the host
/// and calls the rank local: "host1: error: local rank 1 (pid ...)".
pub(crate) fn failure_report_on(
    o: &Outcome,
    errors: Option<&std::path::Path>,
    host: Option<&str>,
) -> Option<String> {
    let i = o.first_failure?;
    let r = &o.results[i];
    let who = match host {
        Some(h) => format!("{h}: error: local rank"),
        None => "error: rank".into(),
    };
    let mut s = format!(
        "{who} {} (pid {}) {}\n",
        r.local_rank,
        r.pid,
        r.exit.describe()
    );
    let recorded = errors.and_then(|d| {
        let f = super::env::error_file(d, r.local_rank);
        Some((super::env::recorded_error(&f)?, f))
    });
    let tail = o.tails.get(i).cloned().unwrap_or_default();
    if let Some((cause, file)) = recorded {
        s.push_str(&format!(
            "root cause (recorded by rank {} in {}):\n",
            r.local_rank,
            file.display()
        ));
        for l in cause.lines() {
            s.push_str(&format!("  | {l}\n"));
        }
    } else if tail.is_empty() {
        s.push_str("  (its stderr was empty)\n");
    } else {
        s.push_str(&format!("last {} line(s) of its stderr:\n", tail.len()));
        for l in tail {
            s.push_str(&format!("  | {l}\n"));
        }
    }
    Some(s)
}
