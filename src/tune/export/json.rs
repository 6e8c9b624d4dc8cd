//! `--export-json`: the threadwise.tune/1 document.

use crate::export::{ExportError, Exporter};
use crate::tune::TuneReport;

pub(super) struct Json;

impl Exporter<TuneReport> for Json {
    fn render(&self, r: &TuneReport, _: &()) -> Result<String, ExportError> {
        Ok(serde_json::to_string_pretty(r)? + "\n")
    }
}
