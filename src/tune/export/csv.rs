//! `--export-csv`: one row per trial, with its configuration's summary.

use super::ReportExporter;
use crate::tune::TuneReport;

pub struct Csv;

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| format!("{x:.4}"))
}

impl ReportExporter for Csv {
    fn render(&self, r: &TuneReport) -> String {
        let mut out = String::from(
            "config,options,round,status,throughput,wall_s,cpu_util_pct,voluntary_cs_per_s,involuntary_cs_per_s,peak_rss_mib,gpu_util_pct,gpu_mem_mib,median,min,max,speedup,winner\n",
        );
        for c in &r.configs {
            for t in &c.trials {
                let cells = [
                    field(&c.name),
                    field(&c.options),
                    t.round.to_string(),
                    t.status.clone(),
                    opt(t.throughput),
                    format!("{:.4}", t.wall_s),
                    format!("{:.2}", t.cpu_util_pct),
                    format!("{:.2}", t.voluntary_cs_per_s),
                    format!("{:.2}", t.involuntary_cs_per_s),
                    format!("{:.2}", t.peak_rss_mib),
                    opt(t.gpu_util_pct),
                    opt(t.gpu_mem_mib),
                    opt(c.throughput.map(|s| s.median)),
                    opt(c.throughput.map(|s| s.min)),
                    opt(c.throughput.map(|s| s.max)),
                    opt(c.speedup),
                    (r.winner.as_deref() == Some(c.name.as_str())).to_string(),
                ];
                out.push_str(&cells.join(","));
                out.push('\n');
            }
        }
        out
    }
}
