//! The `threadwise` binary: parse, run, map the error to an exit code.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

fn main() {
    let code = threadwise::run_cli();
    std::process::exit(code);
}
