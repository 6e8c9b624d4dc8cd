//! Ways to print a document: one small file per format behind one trait,
//! `Exporter`, shared by `plan --format X` (here) and `tune`'s report files
//! (`tune::export`).

mod json;
mod shell;
mod slurm;
mod table;
mod torchrun;

use crate::plan::Plan;

pub(crate) use shell::{quote, quote_all};
pub(crate) use torchrun::bind_args;
#[cfg(test)]
pub(crate) use torchrun::request_args;

/// What an exporter may need besides the plan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Context {
    /// The user's command (after `--`); exporters that print command lines use it.
    pub command: Vec<String>,
    /// For `env`: which rank's variables.
    pub local_rank: Option<usize>,
    /// Add every decision's reason (table).
    pub explain: bool,
    /// How this binary is called, for lines that run `threadwise bind`.
    pub program: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("--format env needs --local-rank K (0-{max})")]
    NeedRank { max: usize },
    #[error("--local-rank {rank} is out of range: the plan has ranks 0-{max}")]
    NoSuchRank { rank: usize, max: usize },
    #[error("cannot serialise as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write the CSV report: {0}")]
    Csv(#[from] ::csv::Error),
    #[error("cannot draw the SVG chart: {0}")]
    Svg(String),
}

impl Context {
    /// The user's command quoted for a shell, or `"$@"` for a script's own arguments.
    pub(crate) fn command_line(&self) -> String {
        if self.command.is_empty() {
            "\"$@\"".to_string()
        } else {
            quote_all(&self.command)
        }
    }
}

/// One output format of a document (`Plan` with a `Context`, or a tune
/// report with none).
pub(crate) trait Exporter<Doc: ?Sized, Ctx = ()> {
    fn render(&self, doc: &Doc, ctx: &Ctx) -> Result<String, ExportError>;
}

crate::named_enum! {
    /// `plan --format`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum PlanFormat ("a format,") {
        Table => "table",
        Json => "json",
        Env => "env",
        Numactl => "numactl",
        Taskset => "taskset",
        Slurm => "slurm",
        Torchrun => "torchrun",
    }
}

impl PlanFormat {
    /// The registry: one exporter per format.
    pub(crate) fn exporter(self) -> &'static dyn Exporter<Plan, Context> {
        match self {
            PlanFormat::Table => &table::Table,
            PlanFormat::Json => &json::Json,
            PlanFormat::Env => &shell::Env,
            PlanFormat::Numactl => &shell::Numactl,
            PlanFormat::Taskset => &shell::Taskset,
            PlanFormat::Slurm => &slurm::Slurm,
            PlanFormat::Torchrun => &torchrun::Torchrun,
        }
    }
}
