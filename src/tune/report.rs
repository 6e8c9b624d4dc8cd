//! The terminal table, like a benchmark paper's: configuration, throughput
//! median (min-max), speed-up against the unset baseline, CPU %, GPU %, GPU
//! memory, context switches per second; the winner marked, and the rows the
//! data cannot tell apart from it.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use super::{ConfigResult, TrialStatus, TuneReport};

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(crate) fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

/// Speed-up, CPU %, GPU %, GPU memory (with `mem_unit`) and context switches:
/// the cells the table and the Markdown export share.
pub(crate) fn metric_cells(c: &ConfigResult, mem_unit: &str) -> [String; 5] {
    [
        opt(c.speedup, |v| format!("{v:.2}x")),
        opt(c.cpu_util_pct, |v| format!("{v:.0}")),
        opt(c.gpu_util_pct, |v| format!("{v:.0}")),
        opt(c.gpu_mem_mib, |v| format!("{v:.0}{mem_unit}")),
        match (c.voluntary_cs_per_s, c.involuntary_cs_per_s) {
            (Some(a), Some(b)) => format!("{a:.0}/{b:.0}"),
            _ => "n/a".into(),
        },
    ]
}

fn row(r: &TuneReport, c: &ConfigResult) -> Vec<String> {
    let thr = match c.throughput {
        Some(s) => format!(
            "{} [{}-{}] n={}",
            num(s.median),
            num(s.min),
            num(s.max),
            s.n
        ),
        None => "-".to_string(),
    };
    let count = |f: &dyn Fn(TrialStatus) -> bool| c.trials.iter().filter(|t| f(t.status)).count();
    let failed = count(&|s| s != TrialStatus::Ok && s != TrialStatus::NoMetric);
    let missing = count(&|s| s == TrialStatus::NoMetric);
    let mut name = c.name.clone();
    if failed > 0 {
        name.push_str(&format!(" ({failed} failed)"));
    }
    if missing > 0 {
        name.push_str(&format!(" ({missing} no metric)"));
    }
    let mut cells = vec![name, thr];
    cells.extend(metric_cells(c, " MiB"));
    cells.extend([
        opt(c.peak_rss_mib, |v| format!("{v:.0}")),
        r.mark(c).name().to_string(),
    ]);
    cells
}

/// Dropped configurations, failed trials with their stderr, warnings, the winner.
pub(super) fn notes(r: &TuneReport) -> String {
    let mut out = String::new();
    for c in &r.configs {
        if let Some(round) = c.dropped_after_round {
            // Dropped on the trials it had then; say so when the winner's
            // later trials made the two overlap after all.
            let now = if c.indistinguishable_from_winner {
                "; the winner's later trials overlap it now: --strategy all measures every row fully"
            } else {
                ""
            };
            let why = if round == 0 {
                format!(
                    "its trial was below {:.0}% of the round's best",
                    super::FIRST_ROUND_CUT * 100.0
                )
            } else {
                "its best trial was below the leader's worst then".to_string()
            };
            out.push_str(&format!(
                "{}: dropped after round {round}: {why}{now}\n",
                c.name
            ));
        }
        if !c.same_launch.is_empty() {
            out.push_str(&format!(
                "{}: launches exactly as {} (every rank's environment, CPUs, memory and argv): measured once\n",
                c.name,
                c.same_launch.join(", ")
            ));
        }
        if c.slow_first_trial {
            out.push_str(&format!(
                "{}: the first trial was slow (warm caches?); --warmup 1 leaves it out\n",
                c.name
            ));
        }
        for tr in c.trials.iter().filter(|t| t.outlier) {
            out.push_str(&format!(
                "{} round {}: outlier ({} against a median of {})\n",
                c.name,
                tr.round,
                tr.throughput.map_or("-".into(), num),
                c.throughput.map_or("-".into(), |s| num(s.median))
            ));
        }
        for tr in c.trials.iter().filter(|t| t.status != TrialStatus::Ok) {
            let why = tr
                .message
                .as_ref()
                .map_or(String::new(), |m| format!(" ({m})"));
            out.push_str(&format!(
                "{} round {}: {}{why}\n",
                c.name, tr.round, tr.status
            ));
            for l in &tr.stderr_tail {
                out.push_str(&format!("  | {l}\n"));
            }
        }
    }
    for w in &r.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out.push_str(&read_from(r));
    if let Some(w) = &r.winner {
        let same: Vec<&str> = r
            .configs
            .iter()
            .filter(|c| c.indistinguishable_from_winner)
            .map(|c| c.name.as_str())
            .collect();
        out.push_str(&format!("winner: {w}"));
        if !same.is_empty() {
            out.push_str(&format!(
                " (not distinguishable from {}: the 95% bootstrap intervals of the medians overlap; \
                 --runs or --max-runs give a close race more trials)",
                same.join(", ")
            ));
        }
        out.push('\n');
    }
    out
}

/// Which line each configuration's throughput was read from.
fn read_from(r: &TuneReport) -> String {
    let hits: Vec<String> = r
        .configs
        .iter()
        .filter_map(|c| {
            let h = c.read_from.as_ref()?;
            Some(format!(
                "  {}: [rank {}] {} ({})\n",
                c.name,
                h.rank,
                h.line,
                h.unit.as_deref().unwrap_or("--metric")
            ))
        })
        .collect();
    if hits.is_empty() {
        String::new()
    } else {
        format!(
            "throughput read from (last scored trial):\n{}",
            hits.concat()
        )
    }
}

/// The table and what to know about it.
pub fn render(r: &TuneReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "configuration",
        &format!("throughput ({}) median [min-max]", r.unit),
        "speed-up",
        "CPU %",
        "GPU %",
        "GPU mem",
        "ctx sw/s vol/invol",
        "RSS MiB",
        "",
    ]);
    for c in &r.configs {
        t.add_row(row(r, c));
    }
    format!(
        "{} rank(s) on {}, CPU budget {:.2}, {} run(s) each after {} warm-up; CPU % is of the budget\n{t}\n{}",
        r.nproc,
        r.source,
        r.cpu_budget,
        r.runs,
        r.warmup,
        notes(r)
    )
}
