//! Ways to print a plan: one small file per format behind one trait, so that
//! `plan --format X` and later `tune`'s reports share the pattern.

mod json;
mod shell;
mod slurm;
mod table;
mod torchrun;

use crate::plan::Plan;

pub use shell::{quote, quote_all};
pub use torchrun::request_args;

/// What an exporter may need besides the plan.
#[derive(Debug, Clone, Default)]
pub struct Context {
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
pub enum ExportError {
    #[error("--format env needs --local-rank K (0-{max})")]
    NeedRank { max: usize },
    #[error("--local-rank {rank} is out of range: the plan has ranks 0-{max}")]
    NoSuchRank { rank: usize, max: usize },
    #[error("cannot serialise the plan: {0}")]
    Json(#[from] serde_json::Error),
}

/// One output format.
pub trait Exporter {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError>;
}

/// The exporter for a format name, or None when the name is unknown.
pub fn exporter(format: &str) -> Option<Box<dyn Exporter>> {
    Some(match format {
        "table" => Box::new(table::Table),
        "json" => Box::new(json::Json),
        "env" => Box::new(shell::Env),
        "numactl" => Box::new(shell::Numactl),
        "taskset" => Box::new(shell::Taskset),
        "slurm" => Box::new(slurm::Slurm),
        "torchrun" => Box::new(torchrun::Torchrun),
        _ => return None,
    })
}

pub const FORMATS: &[&str] = &[
    "table", "json", "env", "numactl", "taskset", "slurm", "torchrun",
];
