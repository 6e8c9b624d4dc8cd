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
    // Two paired rounds give an interval that says nothing ([0.00-2971.94]
    // was seen): below three, the number of rounds is shown instead.
    let rounds = c.trials.iter().filter(|t| t.ratio.is_some()).count();
    let speedup = match (c.speedup, c.speedup_low, c.speedup_high) {
        (Some(v), Some(_), Some(_)) if rounds < 3 => format!("{v:.2}x ({rounds} rounds)"),
        (Some(v), Some(lo), Some(hi)) if hi > lo => format!("{v:.2}x [{lo:.2}-{hi:.2}]"),
        (v, _, _) => opt(v, |v| format!("{v:.2}x")),
    };
    [
        speedup,
        opt(c.cpu_util_pct, |v| format!("{v:.0}")),
        opt(c.gpu_util_pct, |v| format!("{v:.0}")),
        match (c.gpu_job_mem_mib, c.gpu_mem_mib) {
            // The ranks' own memory beside all that is in use on their GPUs.
            (Some(own), Some(all)) => format!("{own:.0}/{all:.0}{mem_unit}"),
            (_, all) => opt(all, |v| format!("{v:.0}{mem_unit}")),
        },
        match (c.voluntary_cs_per_s, c.involuntary_cs_per_s) {
            (Some(a), Some(b)) => format!("{a:.0}/{b:.0}"),
            _ => "n/a".into(),
        },
    ]
}

/// Against the winner: "winner", or the model's ratio with its interval and
/// the verdict ("slower", "faster", "not distinguishable").
pub(crate) fn against_winner(r: &TuneReport, c: &ConfigResult) -> String {
    use super::stats::Verdict;
    if r.is_winner(c) {
        return "winner".into();
    }
    let Some(p) = &c.vs_winner else {
        return String::new();
    };
    let est = p.estimate.unwrap_or(p.median);
    let verdict = match p.verdict() {
        Verdict::Faster => "faster",
        Verdict::Slower => "slower",
        Verdict::NotDistinguishable => "not distinguishable",
    };
    if p.high.is_finite() && p.low > 0.0 {
        format!("{est:.2}x [{:.2}-{:.2}] {verdict}", p.low, p.high)
    } else {
        format!("{est:.2}x {verdict}")
    }
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
    let disturbed = c.trials.iter().filter(|t| t.disturbed).count();
    let mut name = c.name.clone();
    if failed > 0 {
        name.push_str(&format!(" ({failed} failed)"));
    }
    if missing > 0 {
        name.push_str(&format!(" ({missing} no metric)"));
    }
    if disturbed > 0 {
        name.push_str(&format!(" ({disturbed} disturbed)"));
    }
    let mut cells = vec![name, thr];
    cells.extend(metric_cells(c, " MiB"));
    cells.extend([
        opt(c.peak_rss_mib, |v| format!("{v:.0}")),
        against_winner(r, c),
    ]);
    cells
}

/// Dropped configurations, failed trials with their stderr, warnings, the winner.
pub(super) fn notes(r: &TuneReport) -> String {
    let mut out = String::new();
    for c in &r.configs {
        config_notes(c, r.margin, &mut out);
    }
    for w in &r.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out.push_str(&read_from(r));
    if let Some(m) = model_line(r) {
        out.push_str(&m);
        out.push('\n');
    }
    if let Some(w) = &r.winner {
        match &r.tie {
            Some(t) => out.push_str(&format!(
                "winner: {w}, by rule: the data cannot tell apart {} ({})\n",
                t.configs.join(", "),
                t.rule
            )),
            None => out.push_str(&format!(
                "winner: {w} (the data tells it apart from every other row)\n"
            )),
        }
    }
    out
}

/// Which model decided, in one paragraph: what speed-ups are against, the
/// fit, the noise, the degrees of freedom, the split rounds, the level.
pub(crate) fn model_line(r: &TuneReport) -> Option<String> {
    let a = r.analysis.as_ref()?;
    let against = r
        .baseline
        .as_ref()
        .map_or(String::new(), |b| format!("speed-ups are against {b}; "));
    let down = match a.down_weighted {
        0 => String::new(),
        n => format!(", {n} trial(s) down-weighted"),
    };
    let split = if a.split_rounds.is_empty() {
        String::new()
    } else {
        let rounds: Vec<String> = a.split_rounds.iter().map(|r| r.to_string()).collect();
        format!(
            "; round(s) {} split in two blocks at the machine's step",
            rounds.join(", ")
        )
    };
    Some(format!(
        "{against}every interval and verdict comes from one model: {} over {} trials{down}, \
         noise {} per trial, {} degrees of freedom{split}; {}; each round's order shuffled from seed {}",
        a.model,
        a.trials,
        a.noise
            .map_or("unknown".into(), |n| format!("{:.1}%", n * 100.0)),
        a.df,
        a.correction,
        r.order_seed
    ))
}

/// Why a row stopped before the race ended, in the notes' words.
pub(crate) fn stop_note(st: &super::race::Stopped, margin: f64) -> String {
    use super::race::StopWhy;
    let at = st.vs_leader.as_ref().map_or(String::new(), |p| {
        format!(
            " ({:.2}x [{:.2}-{:.2}])",
            p.estimate.unwrap_or(p.median),
            p.low,
            p.high
        )
    });
    let leader = st.leader.as_deref().unwrap_or("the leader");
    let why = match st.why {
        StopWhy::FarBehind => format!(
            "its trial was below {:.0}% of the round's best",
            super::FIRST_ROUND_CUT * 100.0
        ),
        StopWhy::Slower => format!("slower than {leader}{at}"),
        StopWhy::CannotOvertake => format!(
            "not distinguishable from {leader}{at}, and the trials --max-runs leaves could \
             neither tell them apart nor carry it more than {:.0}% past it",
            super::race::OVERTAKE * 100.0
        ),
        StopWhy::Unscored => format!("no scored trial to compare with {leader}"),
        StopWhy::Same => format!(
            "the same as {leader} within ±{:.0}%{at} (--margin)",
            margin * 100.0
        ),
    };
    let round = st.after_round;
    format!("stopped after {round} round(s): {why}")
}

/// One configuration's notes: stopped, merged, extra rounds, a slow first
/// trial, outliers, down-weighted, disturbed and failed trials with their stderr.
fn config_notes(c: &ConfigResult, margin: f64, out: &mut String) {
    if let Some(st) = &c.stopped {
        out.push_str(&format!("{}: {}\n", c.name, stop_note(st, margin)));
    }
    if !c.same_launch.is_empty() {
        out.push_str(&format!(
            "{}: launches exactly as {} (every rank's environment, CPUs, memory and argv): measured once\n",
            c.name,
            c.same_launch.join(", ")
        ));
    }
    if c.extra_rounds > 0 {
        out.push_str(&format!(
            "{}: {} extra round(s): {}\n",
            c.name,
            c.extra_rounds,
            c.extra_why.as_deref().unwrap_or("undecided")
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
    for tr in c
        .trials
        .iter()
        .filter(|t| t.weight.is_some_and(|w| w < 0.5))
    {
        out.push_str(&format!(
            "{} round {}: down-weighted to {:.2} in the model ({} is far from what its round and configuration predict)\n",
            c.name,
            tr.round,
            tr.weight.unwrap_or(1.0),
            tr.throughput.map_or("-".into(), num),
        ));
    }
    for tr in c.trials.iter().filter(|t| t.disturbed) {
        out.push_str(&format!(
            "{} round {}: disturbed: {:.0}% of the CPU budget went to other processes or the hypervisor\n",
            c.name,
            tr.round,
            tr.disturbance.unwrap_or(0.0) * 100.0
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
/// Multi-node: CPU % (and GPU %) per node and in total, per configuration
/// (medians of its trials; each node's CPU % of its own budget).
pub(crate) fn node_table(r: &TuneReport) -> String {
    let gpus = r
        .configs
        .iter()
        .flat_map(|c| &c.nodes)
        .any(|n| n.gpu_util_pct.is_some());
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut head = vec!["configuration".to_string()];
    for h in &r.hosts {
        head.push(format!("CPU % {h}"));
    }
    head.push("CPU % total".into());
    if gpus {
        for h in &r.hosts {
            head.push(format!("GPU % {h}"));
        }
        head.push("GPU % total".into());
    }
    t.set_header(head);
    for c in &r.configs {
        let mut row = vec![c.name.clone()];
        let cell = |i: usize, gpu: bool| {
            let n = c.nodes.get(i);
            opt(
                n.and_then(|n| if gpu { n.gpu_util_pct } else { n.cpu_util_pct }),
                |v| format!("{v:.0}"),
            )
        };
        for i in 0..r.hosts.len() {
            row.push(cell(i, false));
        }
        row.push(opt(c.cpu_util_pct, |v| format!("{v:.0}")));
        if gpus {
            for i in 0..r.hosts.len() {
                row.push(cell(i, true));
            }
            row.push(opt(c.gpu_util_pct, |v| format!("{v:.0}")));
        }
        t.add_row(row);
    }
    format!("per node:\n{t}\n")
}

pub(crate) fn render(r: &TuneReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "configuration",
        &format!("throughput ({}) median [min-max]", r.unit),
        "speed-up",
        "CPU %",
        "GPU %",
        "GPU mem own/all",
        "ctx sw/s vol/invol",
        "RSS MiB",
        "against the winner",
    ]);
    for c in &r.configs {
        t.add_row(row(r, c));
    }
    if !r.hosts.is_empty() {
        return format!(
            "{} node(s) ({}), {} rank(s) per node, {} run(s) each after {} warm-up; CPU % is of \
             every node's budget together\n{t}\n{}{}",
            r.hosts.len(),
            r.hosts.join(", "),
            r.nproc,
            r.runs,
            r.warmup,
            node_table(r),
            notes(r)
        );
    }
    format!(
        "{} rank(s) on {}, CPU budget {:.2}, {} run(s) each after {} warm-up; CPU % is of the budget\n{t}\n{}{}",
        r.nproc,
        r.source,
        r.cpu_budget,
        r.runs,
        r.warmup,
        figure_table(r),
        notes(r)
    )
}

/// The figures the client printed beside its throughput (`threadwise:
/// figure NAME=N`), per configuration: median [95% interval of the median]
/// over its scored trials; empty when none printed any.
pub(crate) fn figure_table(r: &TuneReport) -> String {
    let names: std::collections::BTreeSet<&String> =
        r.configs.iter().flat_map(|c| c.figures.keys()).collect();
    if names.is_empty() {
        return String::new();
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["configuration".to_string()];
    header.extend(names.iter().map(|n| format!("{n} median [95% interval]")));
    t.set_header(header);
    for c in &r.configs {
        let mut row = vec![c.name.clone()];
        row.extend(names.iter().map(|n| {
            c.figures.get(*n).map_or("-".into(), |s| {
                format!(
                    "{} [{}-{}] (n={})",
                    fig(s.median),
                    fig(s.ci_low),
                    fig(s.ci_high),
                    s.n
                )
            })
        }));
        t.add_row(row);
    }
    format!("figures the client printed:\n{t}\n")
}

/// A figure as read: whole numbers whole, others to one decimal (three
/// below 10).
fn fig(v: f64) -> String {
    match v {
        v if v.fract() == 0.0 && v.abs() < 1e12 => format!("{v:.0}"),
        v if v.abs() >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.3}"),
    }
}
