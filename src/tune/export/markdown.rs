//! `--export-markdown`: the table for a README or an issue.

use super::{ReportError, ReportExporter};
use crate::tune::{Mark, TuneReport, report};

pub struct Markdown;

/// A table cell: `|` would end the cell and a newline the row.
fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

impl ReportExporter for Markdown {
    fn render(&self, r: &TuneReport) -> Result<String, ReportError> {
        let mut out = format!(
            "| configuration | throughput ({}) median | min-max | speed-up | CPU % | GPU % | GPU mem MiB | ctx sw/s vol/invol | |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            cell(&r.unit)
        );
        for c in &r.configs {
            let mark = match r.mark(c) {
                Mark::Winner => "**winner**",
                m => m.name(),
            };
            let [speedup, cpu, gpu, mem, cs] = report::metric_cells(c, "");
            out.push_str(&format!(
                "| {} | {} | {} | {speedup} | {cpu} | {gpu} | {mem} | {cs} | {mark} |\n",
                cell(&c.name),
                report::opt(c.throughput.map(|s| s.median), |v| format!("{v:.1}")),
                c.throughput
                    .map_or("-".into(), |s| format!("{:.1}-{:.1}", s.min, s.max)),
            ));
        }
        let from = report::read_from(r);
        if !from.is_empty() {
            out.push('\n');
            for l in from.lines() {
                let l = l.trim_start();
                match l.split_once(": ") {
                    Some((name, rest)) if !l.starts_with("throughput read from") => {
                        out.push_str(&format!("- {}: `{}`\n", cell(name), rest.replace('`', "'")))
                    }
                    _ => out.push_str(&format!("{l}\n")),
                }
            }
        }
        Ok(out)
    }
}
