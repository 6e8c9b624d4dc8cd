//! The command line: clap structs, their checks, and the straight pipeline each
//! subcommand runs. Nothing outside this module knows about clap.

mod args;
mod launch;
mod topo;
mod tune;

use std::io::Write;

use clap::Parser;

pub use args::{Cli, Command, PlanArgs, SourceArgs};

/// A failure to report: message, what to do, and the exit code (2 usage, 3 environment).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub hint: Option<String>,
    pub code: i32,
}

impl Failure {
    pub fn usage(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            hint: Some(hint.into()),
            code: 2,
        }
    }
    pub fn env(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            hint: Some(hint.into()),
            code: 3,
        }
    }
}

impl From<crate::plan::PlanError> for Failure {
    fn from(e: crate::plan::PlanError) -> Self {
        Failure::usage(e.to_string(), e.hint())
    }
}

/// Write to stdout; a closed pipe (`| head`) is not an error.
pub fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::env(
            format!("cannot write output: {e}"),
            "check where stdout goes",
        )),
        _ => Ok(()),
    }
}

/// Parse the arguments, run, and return the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let result = match cli.command {
        Command::Topo(a) => topo::topo(a),
        Command::Plan(a) => topo::plan(a),
        Command::Run(a) => launch::run(a),
        Command::Bind(a) => launch::bind_cmd(a),
        Command::Tune(a) => tune::tune_cmd(a),
    };
    match result {
        Ok(()) => 0,
        Err(f) => {
            // An empty message: the ranks' own exit code, already reported.
            if f.message.is_empty() {
                return f.code;
            }
            eprintln!("error: {}", f.message);
            if let Some(h) = f.hint {
                eprintln!("hint: {h}");
            }
            f.code
        }
    }
}
