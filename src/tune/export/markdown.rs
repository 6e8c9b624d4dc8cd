//! `--export-markdown`: the table for a README or an issue.

use super::ReportExporter;
use crate::tune::{TuneReport, report};

pub struct Markdown;

impl ReportExporter for Markdown {
    fn render(&self, r: &TuneReport) -> String {
        let mut out = format!(
            "| configuration | throughput ({}) median | min-max | speed-up | CPU % | GPU % | GPU mem MiB | ctx sw/s vol/invol | |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            r.unit
        );
        for c in &r.configs {
            let mark = match report::mark(r, c) {
                "winner" => "**winner**",
                m => m,
            };
            let [speedup, cpu, gpu, mem, cs] = report::metric_cells(c, "");
            out.push_str(&format!(
                "| {} | {} | {} | {speedup} | {cpu} | {gpu} | {mem} | {cs} | {mark} |\n",
                c.name,
                report::opt(c.throughput.map(|s| s.median), |v| format!("{v:.1}")),
                c.throughput
                    .map_or("-".into(), |s| format!("{:.1}-{:.1}", s.min, s.max)),
            ));
        }
        out
    }
}
