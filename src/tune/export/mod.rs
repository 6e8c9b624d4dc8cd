//! Tune report files, one small file per format behind one trait, each
//! rewritten whole after every trial (`files::write_output`: atomically for a
//! regular file), so a crash or Ctrl-C keeps every measured trial and never a
//! torn file.

mod csv;
mod json;
mod markdown;
mod svg;

use super::TuneReport;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot serialise the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write the CSV report: {0}")]
    Csv(#[from] ::csv::Error),
    #[error("cannot draw the SVG chart: {0}")]
    Svg(String),
}

pub trait ReportExporter {
    fn render(&self, r: &TuneReport) -> Result<String, ReportError>;
}

/// The report formats, each with its `--export-FORMAT` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    Json,
    Csv,
    Markdown,
    Svg,
}

impl ReportFormat {
    pub const ALL: [ReportFormat; 4] = [
        ReportFormat::Json,
        ReportFormat::Csv,
        ReportFormat::Markdown,
        ReportFormat::Svg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReportFormat::Json => "json",
            ReportFormat::Csv => "csv",
            ReportFormat::Markdown => "markdown",
            ReportFormat::Svg => "svg",
        }
    }

    /// The registry: one exporter per format.
    pub fn exporter(self) -> &'static dyn ReportExporter {
        match self {
            ReportFormat::Json => &json::Json,
            ReportFormat::Csv => &csv::Csv,
            ReportFormat::Markdown => &markdown::Markdown,
            ReportFormat::Svg => &svg::Svg,
        }
    }
}

#[cfg(test)]
mod tests;
