//! `--export-markdown`: the table for a README or an issue.

use crate::export::{ExportError, Exporter};
use crate::tune::{TuneReport, report};

pub(super) struct Markdown;

/// A table cell: `|` would end the cell and a newline the row.
fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

impl Exporter<TuneReport> for Markdown {
    fn render(&self, r: &TuneReport, _: &()) -> Result<String, ExportError> {
        let mut out = format!(
            "| configuration | throughput ({}) median | min-max | speed-up | CPU % | GPU % | GPU mem MiB own/all | ctx sw/s vol/invol | against the winner |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            cell(&r.unit)
        );
        for c in &r.configs {
            let mark = if r.is_winner(c) {
                "**winner**".to_string()
            } else {
                report::against_winner(r, c)
            };
            let [speedup, cpu, gpu, mem, cs] = report::metric_cells(c, "");
            // Configurations measured under this one's name (same launch).
            let name = if c.same_launch.is_empty() {
                c.name.clone()
            } else {
                format!("{} (= {})", c.name, c.same_launch.join(", "))
            };
            out.push_str(&format!(
                "| {} | {} | {} | {speedup} | {cpu} | {gpu} | {mem} | {cs} | {mark} |\n",
                cell(&name),
                report::opt(c.throughput.map(|s| s.median), |v| format!("{v:.1}")),
                c.throughput
                    .map_or("-".into(), |s| format!("{:.1}-{:.1}", s.min, s.max)),
            ));
        }
        let read: Vec<String> = r
            .configs
            .iter()
            .filter_map(|c| {
                let h = c.read_from.as_ref()?;
                Some(format!(
                    "- {}: `[rank {}] {}` ({})\n",
                    cell(&c.name),
                    h.rank,
                    h.line.replace('`', "'"),
                    h.unit.as_deref().unwrap_or("--metric")
                ))
            })
            .collect();
        if !read.is_empty() {
            out.push_str("\nthroughput read from (last scored trial):\n");
            out.push_str(&read.concat());
        }
        if let Some(m) = report::model_line(r) {
            out.push_str(&format!("\n{}\n", cell(&m)));
        }
        Ok(out)
    }
}
