//! The `threadwise` binary: parse, run, map the error to an exit code.

fn main() {
    let code = threadwise::cli::main();
    std::process::exit(code);
}
