//! `--export-json`: the threadwise.tune/1 document.

use super::ReportExporter;
use crate::tune::TuneReport;

pub struct Json;

impl ReportExporter for Json {
    fn render(&self, r: &TuneReport) -> String {
        serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n"
    }
}
