//! `--export-json`: the threadwise.tune/1 document.

use super::{ReportError, ReportExporter};
use crate::tune::TuneReport;

pub struct Json;

impl ReportExporter for Json {
    fn render(&self, r: &TuneReport) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(r)? + "\n")
    }
}
