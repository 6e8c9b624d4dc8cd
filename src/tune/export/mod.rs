//! Tune report files, one small file per format behind one trait, each
//! rewritten whole after every trial (write to a temporary file, then rename),
//! so a crash or Ctrl-C keeps every measured trial and never a torn file.

mod csv;
mod json;
mod markdown;
mod svg;

use std::path::{Path, PathBuf};

use super::TuneReport;

pub trait ReportExporter {
    fn render(&self, r: &TuneReport) -> String;
}

/// The exporter for `--export-FORMAT`.
pub fn exporter(format: &str) -> Option<Box<dyn ReportExporter>> {
    Some(match format {
        "json" => Box::new(json::Json),
        "csv" => Box::new(csv::Csv),
        "markdown" => Box::new(markdown::Markdown),
        "svg" => Box::new(svg::Svg),
        _ => return None,
    })
}

/// Write a report file atomically.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = PathBuf::from(path);
    let name = path
        .file_name()
        .map_or_else(|| "report".into(), |n| n.to_string_lossy().into_owned());
    tmp.set_file_name(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests;
