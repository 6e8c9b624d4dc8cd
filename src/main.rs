//! The `threadwise` binary: parse, run, map the error to an exit code.

fn main() {
    let code = threadwise::run_cli();
    std::process::exit(code);
}
