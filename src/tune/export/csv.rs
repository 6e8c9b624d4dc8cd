//! `--export-csv`: one row per trial, with its configuration's summary.

use crate::export::{ExportError, Exporter};
use crate::tune::TuneReport;

pub(super) struct Csv;

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| format!("{x:.4}"))
}

const HEADER: [&str; 30] = [
    "config",
    "options",
    "round",
    "status",
    "throughput",
    "wall_s",
    "cpu_util_pct",
    "voluntary_cs_per_s",
    "involuntary_cs_per_s",
    "peak_rss_mib",
    "gpu_util_pct",
    "gpu_mem_mib",
    "median",
    "min",
    "max",
    "speedup",
    "winner",
    "metric_rank",
    "metric_unit",
    "metric_line",
    "seq",
    "ratio_to_reference",
    "speedup_low",
    "speedup_high",
    "outside_cpu_s",
    "steal_s",
    "disturbance",
    "disturbed",
    "gpu_job_mem_mib",
    "weight",
];

impl Exporter<TuneReport> for Csv {
    fn render(&self, r: &TuneReport, _: &()) -> Result<String, ExportError> {
        let mut w = ::csv::Writer::from_writer(vec![]);
        w.write_record(HEADER)?;
        for c in &r.configs {
            for t in &c.trials {
                w.write_record([
                    c.name.clone(),
                    c.options.clone(),
                    t.round.to_string(),
                    t.status.to_string(),
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
                    r.is_winner(c).to_string(),
                    t.hit.as_ref().map_or(String::new(), |h| h.rank.to_string()),
                    t.hit
                        .as_ref()
                        .and_then(|h| h.unit.clone())
                        .unwrap_or_default(),
                    t.hit.as_ref().map_or(String::new(), |h| h.line.clone()),
                    t.seq.to_string(),
                    opt(t.ratio),
                    opt(c.speedup_low),
                    opt(c.speedup_high),
                    opt(t.outside_cpu_s),
                    opt(t.steal_s),
                    opt(t.disturbance),
                    t.disturbed.to_string(),
                    opt(t.gpu_job_mem_mib),
                    opt(t.weight),
                ])?;
            }
        }
        let bytes = w
            .into_inner()
            .map_err(|e| ::csv::Error::from(e.into_error()))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
