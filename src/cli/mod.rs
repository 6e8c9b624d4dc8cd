//! The command line: clap structs, their checks, and the straight pipeline each
//! subcommand runs. Nothing outside this module knows about clap.

mod args;
mod doctor;
mod hold;
mod launch;
mod pet;
mod prefix;
mod report;
mod settings;
mod top;
mod topo;
mod torchrun;
mod torchrun_args;
mod tune;
mod values;

use std::ffi::OsString;
use std::io::Write;

use crate::error::Hinted;

pub(crate) use args::{Cli, Command, SourceArgs};

/// How a command that did its job ends: 0, or the code to pass on (the first
/// failing rank's, 128+N for a signal, 130 for an interrupted tune), already
/// explained on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit(pub i32);

impl Exit {
    pub(crate) const OK: Exit = Exit(0);
}

/// A failure to report: message, what to do, and the exit code (2 usage, 3 environment).
#[derive(Debug)]
pub(crate) struct Failure {
    pub message: String,
    pub hint: Option<String>,
    pub code: i32,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            hint: Some(hint.into()),
            code: 2,
        }
    }
    pub(crate) fn env(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            hint: Some(hint.into()),
            code: 3,
        }
    }
}

/// Every error of the family (`crate::error`) by one conversion: its
/// message, its hint (none when empty), its kind's exit code.
impl<E: Hinted> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            message: e.to_string(),
            hint: Some(e.hint()).filter(|h| !h.is_empty()),
            code: e.code(),
        }
    }
}

/// Write to stdout; a closed pipe (`| head`) is not an error.
pub(crate) fn emit(text: &str) -> Result<Exit, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::env(
            format!("cannot write output: {e}"),
            "check where stdout goes",
        )),
        _ => Ok(Exit::OK),
    }
}

/// The command line as the shells complete it: the whole tree without its
/// hidden subcommands (`__watchdog` is run's own, never typed), which
/// clap_complete would offer.
pub(super) fn completion_tree() -> clap::Command {
    let whole = whole_tree();
    let shown: Vec<clap::Command> = whole
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    clap::Command::new("threadwise")
        .version(env!("CARGO_PKG_VERSION"))
        .about(whole.get_about().cloned().unwrap_or_default())
        .subcommands(shown)
}

/// `threadwise completions SHELL`, from the clap definitions.
fn generated(command: &Command) -> Result<Exit, Failure> {
    let mut cmd = completion_tree();
    let mut out = Vec::new();
    if let Command::Completions { shell } = command {
        clap_complete::generate(*shell, &mut cmd, "threadwise", &mut out);
    }
    emit(&String::from_utf8_lossy(&out))
}

/// The man pages, from the clap definitions: the tool's, and one per visible
/// subcommand (`threadwise-run(1)`, as git's are), named by the file a
/// packager installs.
fn man_pages() -> Vec<(String, clap::Command)> {
    let mut top = whole_tree();
    top.build();
    let mut pages = vec![("threadwise".to_string(), top.clone())];
    for s in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        if s.get_name() == "help" {
            continue;
        }
        let name = format!("threadwise-{}", s.get_name());
        // clap names are 'static; a page is rendered once per process.
        let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
        pages.push((name, s.clone().name(leaked)));
    }
    pages
}

/// A page: every option with its help, those `-h` leaves out too (a man
/// page is the long form), and the version on its `.TH` line.
fn render_man(cmd: clap::Command) -> Result<Vec<u8>, Failure> {
    let cmd = cmd.mut_args(|a| a.hide_short_help(false));
    let mut out = Vec::new();
    let source = format!("threadwise {}", env!("CARGO_PKG_VERSION"));
    clap_mangen::Man::new(cmd)
        .source(source)
        .render(&mut out)
        .map_err(|e| {
            Failure::env(
                format!("cannot render the man page: {e}"),
                "report this bug",
            )
        })?;
    Ok(out)
}

/// `threadwise man [SUBCOMMAND]`, or every page into `--dir`.
fn man(sub: Option<&str>, dir: Option<&std::path::Path>) -> Result<Exit, Failure> {
    let pages = man_pages();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::env(
                format!("cannot create --dir {}: {e}", dir.display()),
                "give a directory you can write",
            )
        })?;
        for (name, cmd) in pages {
            let path = dir.join(format!("{name}.1"));
            std::fs::write(&path, render_man(cmd)?).map_err(|e| {
                Failure::env(
                    format!("cannot write {}: {e}", path.display()),
                    "give a directory you can write",
                )
            })?;
            crate::say!("threadwise: wrote {}", path.display());
        }
        return Ok(Exit::OK);
    }
    let want = sub.map_or("threadwise".to_string(), |s| format!("threadwise-{s}"));
    let names: Vec<String> = pages
        .iter()
        .skip(1)
        .map(|(n, _)| n.trim_start_matches("threadwise-").to_string())
        .collect();
    let Some((_, cmd)) = pages.into_iter().find(|(n, _)| *n == want) else {
        return Err(Failure::usage(
            format!("man: no page for {:?}", sub.unwrap_or_default()),
            format!("pages: {} (or none, for the tool's own)", names.join(", ")),
        ));
    };
    emit(&String::from_utf8_lossy(&render_man(cmd)?))
}

/// Where `run`'s command starts in `argv`, as clap reads it (None for any
/// other subcommand, or a command line clap refuses as it stands). Asked only
/// where a `PET_` variable is set: otherwise nothing needs it, and the launch
/// is spared a second parse.
fn command_at(argv: &[OsString]) -> Option<usize> {
    if argv.get(1).map(|a| a.as_os_str()) != Some("run".as_ref()) {
        return None;
    }
    match parse_whole(argv).ok()?.command {
        Command::Run(a) => Some(argv.len() - a.command.len().min(argv.len())),
        _ => None,
    }
}

/// clap's reading of `argv`, with what clap does not say: whether `run`'s
/// command came right after `--` (run as given) or not (torchrun's form).
#[cfg(test)]
pub(super) fn parse(argv: &[OsString]) -> Result<Cli, clap::Error> {
    parse_in(argv, None)
}

/// `parse`, with run's tree where the caller built it already.
fn parse_in(argv: &[OsString], tree: Option<clap::Command>) -> Result<Cli, clap::Error> {
    let mut c = match argv.get(1).is_some_and(|a| a == "run") {
        true => parse_run(argv, tree.unwrap_or_else(run_tree))?,
        false => parse_whole(argv)?,
    };
    if let Command::Run(a) = &mut c.command {
        let k = argv.len() - a.command.len().min(argv.len());
        a.after_dashes = k > 0 && argv[k - 1] == "--";
    }
    Ok(c)
}

/// The whole command line, `run` with its torchrun options' `PET_`
/// variables (`pet::with_env`).
pub(super) fn whole_tree() -> clap::Command {
    use clap::CommandFactory;
    // In place, so the subcommands keep their order.
    Cli::command().mut_subcommands(|c| match c.get_name() {
        "run" => pet::with_env(c),
        _ => c,
    })
}

/// The command line with only `run`'s options built: a launch does not pay
/// for every other subcommand's (half of clap's time). The same `run` as in
/// the whole tree (a test compares their help and errors).
pub(super) fn run_tree() -> clap::Command {
    use clap::Args;
    clap::Command::new("threadwise")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Thread, core and NUMA placement for multi-process (DDP) training")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(
            pet::with_env(args::RunCmd::augment_args(clap::Command::new("run")))
                .about(
                    "Launch the ranks on this node with the plan (a drop-in for torchrun \
                     --standalone)",
                )
                .long_about(None),
        )
}

/// clap's reading of `argv` through the whole tree.
fn parse_whole(argv: &[OsString]) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let mut m = whole_tree().try_get_matches_from(argv)?;
    let given = m.subcommand_matches("run").is_some_and(nproc_given);
    let mut c = Cli::from_arg_matches_mut(&mut m)?;
    if let Command::Run(a) = &mut c.command {
        a.nproc_given = given;
    }
    Ok(c)
}

fn parse_run(argv: &[OsString], tree: clap::Command) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let mut m = tree.try_get_matches_from(argv)?;
    let Some((_, mut sub)) = m.remove_subcommand() else {
        return parse_whole(argv);
    };
    let given = nproc_given(&sub);
    let mut a = args::RunCmd::from_arg_matches_mut(&mut sub)?;
    a.nproc_given = given;
    Ok(Cli {
        command: Command::Run(a),
    })
}

/// Did the command line (or torchrun's PET_NPROC_PER_NODE) give `run` its
/// number of ranks, rather than the default?
fn nproc_given(m: &clap::ArgMatches) -> bool {
    use clap::parser::ValueSource;
    matches!(
        m.value_source("nproc"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// clap's rendering of a usage error as the message (its `error:` line and
/// what continues it) and the hint (clap's tips, the usage line, and where
/// the options are listed).
fn usage_error(rendered: &str, argv: &[OsString]) -> (String, String) {
    let mut message = vec![];
    let mut hints = vec![];
    let mut in_message = true;
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() {
            in_message = false;
        } else if let Some(m) = line.strip_prefix("error: ") {
            message.push(m.to_string());
        } else if let Some(t) = line.strip_prefix("tip: ") {
            hints.push(t.to_string());
        } else if let Some(u) = line.strip_prefix("Usage: ") {
            hints.push(format!("usage: {u}"));
        } else if in_message {
            message.push(line.to_string());
        }
    }
    let sub = argv
        .get(1)
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.starts_with('-') && whole_tree().find_subcommand(s).is_some());
    hints.push(match sub {
        Some(s) => format!("threadwise {s} --help lists its options"),
        None => "threadwise --help lists the commands".into(),
    });
    (message.join(" "), hints.join("; "))
}

/// Parse the arguments, run, and return the process exit code.
pub(crate) fn main() -> i32 {
    let env = |k: &str| std::env::var(k).ok();
    let raw: Vec<OsString> = std::env::args_os().collect();
    // The watchdog `run` starts: at once, without building the command line.
    if raw.len() == 3 && raw[1] == crate::proc::contain::WATCHDOG {
        return crate::proc::contain::watchdog(std::path::Path::new(&raw[2]));
    }
    // torchrun's abbreviations, read as torchrun reads them, before anything
    // looks for an option by its spelling (the PET_ variables below); run's
    // tree is built once, for this and for parsing.
    let tree = raw.get(1).is_some_and(|a| a == "run").then(run_tree);
    let raw = match &tree {
        Some(t) => {
            let run = t.find_subcommand("run").expect("run's tree has run");
            match prefix::run_argv(&raw, run) {
                Ok(a) => a,
                Err(message) => {
                    crate::say!("error: {message}");
                    crate::say!("hint: write the option out (threadwise run --help lists them)");
                    return 2;
                }
            }
        }
        None => raw,
    };
    // torchrun's variables only where one is set: the table of its options is
    // read from run's clap definition, work a plain launch is spared.
    let any_pet = std::env::vars_os().any(|(k, _)| k.as_encoded_bytes().starts_with(b"PET_"));
    let at = any_pet.then(|| command_at(&raw)).flatten();
    let pet = match any_pet {
        true => pet::run_args(raw, at, &env),
        false => Ok((raw, vec![])),
    };
    let (argv, from_env) = match pet {
        Ok(x) => x,
        Err(r) => {
            crate::say!("error: {}={}: {}", r.var, r.value, r.why);
            crate::say!("hint: give one node count (e.g. {}=2), or unset it", r.var);
            return 2;
        }
    };
    let cli = match parse_in(&argv, tree) {
        Ok(c) => c,
        // --help and --version print as clap draws them; a usage error in
        // the one error shape of every error (`error:` then `hint:`).
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return 0;
        }
        // `threadwise` alone: the help, as a usage error's exit code.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return 2;
        }
        Err(e) => {
            let (message, hint) = usage_error(&e.render().to_string(), &argv);
            crate::say!("error: {message}");
            crate::say!("hint: {hint}");
            if let Some(line) = pet::said(&from_env) {
                crate::say!("threadwise: {line}");
            }
            return 2;
        }
    };
    let result = match cli.command {
        Command::Topo(a) => topo::topo(a),
        Command::Plan(a) => topo::plan(a),
        Command::Run(a) => launch::run(a, &from_env),
        Command::Bind(a) => launch::bind_cmd(a),
        Command::Tune(a) => tune::tune_cmd(a),
        Command::Doctor(a) => doctor::doctor(a),
        Command::Top(a) => top::top_cmd(a),
        Command::Man { sub, dir } => man(sub.as_deref(), dir.as_deref()),
        c @ Command::Completions { .. } => generated(&c),
        Command::Watchdog { dir } => Ok(Exit(crate::proc::contain::watchdog(&dir))),
        Command::Hold(a) => Ok(Exit(hold::hold_cmd(a))),
    };
    match result {
        Ok(Exit(code)) => code,
        Err(f) => {
            crate::say!("error: {}", f.message);
            if let Some(h) = f.hint {
                crate::say!("hint: {h}");
            }
            f.code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn run_alone_is_the_run_of_the_whole_tree() {
        let mut whole = whole_tree();
        let mut alone = run_tree();
        whole.build();
        alone.build();
        let (w, a) = (
            whole.find_subcommand_mut("run").unwrap(),
            alone.find_subcommand_mut("run").unwrap(),
        );
        assert_eq!(
            w.render_long_help().to_string(),
            a.render_long_help().to_string()
        );
        assert_eq!(w.render_usage().to_string(), a.render_usage().to_string());
        // The same readings and the same errors, word for word.
        for argv in [
            &["threadwise", "run", "-n", "2", "--", "python", "x.py"][..],
            &[
                "threadwise",
                "run",
                "--nproc_per_node",
                "2",
                "x.py",
                "--lr",
                "1",
            ],
            &["threadwise", "run", "--bogus", "--", "true"],
            &["threadwise", "run", "-n", "zero", "--", "true"],
            &["threadwise", "run", "--help"],
            &["threadwise", "run"],
        ] {
            let whole = parse_whole(&os(argv));
            let alone = parse_run(&os(argv), run_tree());
            match (whole, alone) {
                (Ok(w), Ok(a)) => assert_eq!(format!("{w:?}"), format!("{a:?}"), "{argv:?}"),
                (Err(w), Err(a)) => {
                    assert_eq!(w.kind(), a.kind(), "{argv:?}");
                    assert_eq!(w.to_string(), a.to_string(), "{argv:?}");
                }
                (w, a) => panic!("{argv:?}: {:?} vs {:?}", w.is_ok(), a.is_ok()),
            }
        }
    }
}
