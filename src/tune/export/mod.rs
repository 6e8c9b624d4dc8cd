//! Tune report files, one small file per format behind one trait, each
//! rewritten whole after every trial (`files::write_output`: atomically for a
//! regular file), so a crash or Ctrl-C keeps every measured trial and never a
//! torn file.

mod csv;
mod json;
mod markdown;
mod svg;

use std::path::PathBuf;

use super::TuneReport;
use crate::export::{ExportError, Exporter};

/// The report formats, each with its `--export-FORMAT` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportFormat {
    Json,
    Csv,
    Markdown,
    Svg,
}

impl ReportFormat {
    pub(crate) const ALL: [ReportFormat; 4] = [
        ReportFormat::Json,
        ReportFormat::Csv,
        ReportFormat::Markdown,
        ReportFormat::Svg,
    ];

    /// The registry: one exporter per format.
    pub(crate) fn exporter(self) -> &'static dyn Exporter<TuneReport> {
        match self {
            ReportFormat::Json => &json::Json,
            ReportFormat::Csv => &csv::Csv,
            ReportFormat::Markdown => &markdown::Markdown,
            ReportFormat::Svg => &svg::Svg,
        }
    }
}

/// The report files a tune writes, and the one place that rewrites them:
/// whole, after every trial (atomically for a regular file).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReportFiles(pub Vec<(ReportFormat, PathBuf)>);

#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error(transparent)]
    Render(#[from] ExportError),
    #[error(transparent)]
    Write(#[from] crate::files::FileError),
}

impl ReportFiles {
    /// Rewrite every file from the report as it stands.
    pub(crate) fn rewrite(&self, r: &TuneReport) -> Result<(), WriteError> {
        for (f, p) in &self.0 {
            let text = f.exporter().render(r, &())?;
            crate::files::write_output(p, text.as_bytes())?;
        }
        Ok(())
    }

    pub(crate) fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        self.0.iter().map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests;
