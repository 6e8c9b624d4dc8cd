//! torchrun's abbreviations: torchrun reads its options with argparse, which
//! takes any prefix of an option string that no other option string shares
//! (`--nproc_per 2`, `--master_p 29560`, `--max-restart 1`) and refuses one
//! that several share (`--nproc` could be `--nproc-per-node` or
//! `--nproc_per_node`). A launch line copied from a script that abbreviates
//! must run under `threadwise run` as under torchrun: `run`'s command line is
//! read with torchrun's own rule over torchrun's own option strings, up to
//! the script, before clap reads it. threadwise's own options are not
//! abbreviated (clap's rule: each written out).

use std::ffi::OsString;

/// torchrun 2.15's long options (torch.distributed.run's parser); each of
/// more than one word is also registered with underscores.
const TORCHRUN: [&str; 33] = [
    "help",
    "nnodes",
    "nproc-per-node",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "standalone",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "event-log-handler",
    "role",
    "module",
    "no-python",
    "run-path",
    "log-dir",
    "redirects",
    "tee",
    "log-line-prefix-template",
    "local-ranks-filter",
    "duplicate-stdout-filters",
    "duplicate-stderr-filters",
    "node-rank",
    "master-addr",
    "master-port",
    "local-addr",
    "logs-specs",
    "numa-binding",
    "signals-to-handle",
    "shutdown-timeout",
    "virtual-local-rank",
    "print-completion",
];

/// Every option string torchrun's parser holds (without the dashes).
pub(super) fn torchrun_strings() -> Vec<String> {
    let mut out = vec![];
    for o in TORCHRUN {
        out.push(o.to_string());
        if o.contains('-') {
            out.push(o.replace('-', "_"));
        }
    }
    out
}

/// What argparse makes of `--name`: the one torchrun option string it
/// abbreviates, None where it is none of them, or Err with the ones it could
/// be.
pub(super) fn expand(name: &str, strings: &[String]) -> Result<Option<String>, Vec<String>> {
    if strings.iter().any(|s| s == name) {
        return Ok(Some(name.to_string()));
    }
    let hits: Vec<String> = strings
        .iter()
        .filter(|s| s.starts_with(name))
        .cloned()
        .collect();
    match hits.len() {
        0 => Ok(None),
        1 => Ok(hits.into_iter().next()),
        _ => Err(hits),
    }
}

/// `argv` (`threadwise run ...`) with torchrun's abbreviations written out,
/// up to the script or `--`; an ambiguous one is an error worded as
/// argparse words it. `run` is run's clap command: which options take a
/// value (so that value is not taken for the script).
pub(super) fn run_argv(argv: &[OsString], run: &clap::Command) -> Result<Vec<OsString>, String> {
    let strings = torchrun_strings();
    let known = |long: &str| {
        run.get_arguments().find(|a| {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
        })
    };
    let takes = |a: &clap::Arg| a.get_action().takes_values();
    let mut out: Vec<OsString> = argv.iter().take(2).cloned().collect();
    let mut i = 2;
    while i < argv.len() {
        let arg = &argv[i];
        out.push(arg.clone());
        i += 1;
        let Some(s) = arg.to_str() else { break };
        if s == "--" || !s.starts_with('-') || s == "-" {
            break; // the script (or the command after --): the rest is its
        }
        if let Some(long) = s.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            let def = match known(name) {
                Some(a) => Some(a),
                None => match expand(name, &strings) {
                    Ok(Some(full)) => {
                        *out.last_mut().expect("pushed") = match value {
                            Some(v) => format!("--{full}={v}").into(),
                            None => format!("--{full}").into(),
                        };
                        known(&full)
                    }
                    Ok(None) => None,
                    Err(could) => {
                        let could: Vec<String> = could.iter().map(|c| format!("--{c}")).collect();
                        return Err(format!(
                            "ambiguous option: --{name} could match {} (as torchrun says)",
                            could.join(", ")
                        ));
                    }
                },
            };
            if value.is_none() && def.is_some_and(takes) && i < argv.len() {
                out.push(argv[i].clone());
                i += 1;
            }
        } else if let Some(c) = s.strip_prefix('-').and_then(|r| {
            let mut ch = r.chars();
            ch.next().filter(|_| ch.as_str().is_empty())
        }) {
            // `-n 2`: a short option alone takes the next argument as its value.
            if run
                .get_arguments()
                .any(|a| a.get_short() == Some(c) && takes(a))
                && i < argv.len()
            {
                out.push(argv[i].clone());
                i += 1;
            }
        }
    }
    out.extend(argv[i..].iter().cloned());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_torchrun_takes_is_written_out_and_one_it_refuses_is_refused() {
        let s = torchrun_strings();
        assert_eq!(expand("nproc_per", &s), Ok(Some("nproc_per_node".into())));
        assert_eq!(expand("master_p", &s), Ok(Some("master_port".into())));
        assert_eq!(expand("max-restart", &s), Ok(Some("max-restarts".into())));
        assert_eq!(expand("nn", &s), Ok(Some("nnodes".into())));
        // Both spellings of one option share `--nproc`: argparse refuses it.
        assert!(expand("nproc", &s).is_err());
        assert!(expand("no", &s).is_err());
        assert!(expand("log", &s).is_err());
        assert_eq!(expand("bogus", &s), Ok(None));
    }
}
