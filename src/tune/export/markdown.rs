//! `--export-markdown`: the table for a README or an issue.

use super::ReportExporter;
use crate::tune::TuneReport;

pub struct Markdown;

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

impl ReportExporter for Markdown {
    fn render(&self, r: &TuneReport) -> String {
        let mut out = format!(
            "| configuration | throughput ({}) median | min-max | speed-up | CPU % | GPU % | GPU mem MiB | ctx sw/s vol/invol | |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            r.unit
        );
        for c in &r.configs {
            let mark = if r.winner.as_deref() == Some(c.name.as_str()) {
                "**winner**"
            } else if c.indistinguishable_from_winner {
                "not distinguishable"
            } else {
                ""
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {mark} |\n",
                c.name,
                opt(c.throughput.map(|s| s.median), |v| format!("{v:.1}")),
                c.throughput
                    .map_or("-".into(), |s| format!("{:.1}-{:.1}", s.min, s.max)),
                opt(c.speedup, |v| format!("{v:.2}x")),
                opt(c.cpu_util_pct, |v| format!("{v:.0}")),
                opt(c.gpu_util_pct, |v| format!("{v:.0}")),
                opt(c.gpu_mem_mib, |v| format!("{v:.0}")),
                match (c.voluntary_cs_per_s, c.involuntary_cs_per_s) {
                    (Some(a), Some(b)) => format!("{a:.0}/{b:.0}"),
                    _ => "n/a".into(),
                },
            ));
        }
        out
    }
}
