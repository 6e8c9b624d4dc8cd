//! The rest of torchrun's command line (torchrun 2.15's options that `run`
//! shares by meaning rather than by name): each option in both spellings,
//! and through its `PET_*` variable where torchrun reads one (`pet.rs`).
//! What each does here is decided once, in `apply`, and said once.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::Failure;
use super::args::RunCmd;
use crate::job::settings::TorchrunOutput;
use crate::plan::Policy;

#[derive(Args, Debug, Default, Clone)]
pub(crate) struct TorchrunArgs {
    /// torchrun's seconds between looks at its workers: no effect (threadwise
    /// waits on the ranks and hears each end at once)
    #[arg(hide_short_help = true, long, alias = "monitor_interval", value_name = "SECS", value_parser = positive_secs)]
    pub monitor_interval: Option<f64>,
    /// torchrun's multiprocessing start method: no effect (every rank is a
    /// fresh exec, as spawn)
    #[arg(hide_short_help = true, long, alias = "start_method", value_parser = ["spawn", "fork", "forkserver"])]
    pub start_method: Option<String>,
    /// torchrun's event log handler: no effect
    #[arg(
        hide_short_help = true,
        long,
        alias = "event_log_handler",
        value_name = "NAME"
    )]
    pub event_log_handler: Option<String>,
    /// torchrun's form: run the script as runpy.run_path would, as __main__
    /// in a Python of its own (python -u SCRIPT); wins over --no-python
    #[arg(hide_short_help = true, long, alias = "run_path")]
    pub run_path: bool,
    /// The prefix of each output line, with ${rank}, ${local_rank},
    /// ${role_name} and ${hostname} (default: [rank ${rank}] )
    #[arg(
        hide_short_help = true,
        long,
        alias = "log_line_prefix_template",
        value_name = "TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,
    /// Also copy the ranks' stdout lines holding any of these comma-separated
    /// strings (",," a comma) to DIR/filtered-stdout.log (DIR: --log-dir)
    #[arg(
        hide_short_help = true,
        long,
        alias = "duplicate_stdout_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stdout_filters: Option<String>,
    /// The same for stderr, to DIR/filtered-stderr.log
    #[arg(
        hide_short_help = true,
        long,
        alias = "duplicate_stderr_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stderr_filters: Option<String>,
    /// The address this node gives the others (MASTER_ADDR when it is node
    /// 0; default: the address the rendezvous host sees it connect from)
    #[arg(
        hide_short_help = true,
        long,
        alias = "local_addr",
        value_name = "ADDR"
    )]
    pub local_addr: Option<String>,
    /// torchrun's LogsSpecs entry point: only `default` (threadwise writes
    /// its own logs: --log-dir)
    #[arg(
        hide_short_help = true,
        long,
        alias = "logs_specs",
        value_name = "NAME"
    )]
    pub logs_specs: Option<String>,
    /// torchrun's NUMA binding, as threadwise's --policy: node, socket,
    /// exclusive, core-complex (= l3)
    #[arg(hide_short_help = true, long, alias = "numa_binding", value_parser = ["node", "socket", "exclusive", "core-complex"])]
    pub numa_binding: Option<String>,
    /// Signals that stop the job, forwarded to the ranks (default
    /// SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGUSR1/SIGUSR2 listed here stop it
    /// too, where otherwise they are passed on and the run goes on
    #[arg(
        hide_short_help = true,
        long,
        alias = "signals_to_handle",
        value_name = "LIST"
    )]
    pub signals_to_handle: Option<String>,
    /// torchrun's name for --grace: seconds between SIGTERM and SIGKILL
    #[arg(hide_short_help = true, long, alias = "shutdown_timeout", value_name = "SECS", value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub shutdown_timeout: Option<u32>,
    /// LOCAL_RANK=0 in every rank (each sees its own GPU as device 0)
    #[arg(hide_short_help = true, long, alias = "virtual_local_rank")]
    pub virtual_local_rank: bool,
    /// Print a completion script for threadwise and exit (bash, zsh)
    #[arg(hide_short_help = true, long, alias = "print_completion", value_parser = ["bash", "zsh", "tcsh"])]
    pub print_completion: Option<String>,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?}: expected seconds above 0")),
    }
}

/// The signals `--signals-to-handle` may name: those threadwise handles.
const NAMED: &[(&str, i32)] = &[
    ("SIGTERM", libc::SIGTERM),
    ("SIGINT", libc::SIGINT),
    ("SIGHUP", libc::SIGHUP),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
];

/// torchrun's filter list: comma-separated, `,,` a comma, empty ones dropped.
pub(crate) fn filters(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                chars.next();
                out.last_mut().unwrap().push(',');
            }
            (',', _) => out.push(String::new()),
            (c, _) => out.last_mut().unwrap().push(c),
        }
    }
    out.retain(|f| !f.is_empty());
    out
}

/// What the torchrun options that change nothing here mean, said once.
pub(super) fn inert_notes(a: &RunCmd) -> Vec<String> {
    let mut notes = vec![];
    if a.tee.is_some() || a.redirects.is_some() {
        notes.push(
            "--tee/--redirects: the ranks' output always reaches the terminal, prefixed; \
             --log-dir also writes it to files"
                .into(),
        );
    }
    if let Some(c) = &a.rdzv_conf
        && !c.inert.is_empty()
    {
        notes.push(format!(
            "--rdzv-conf {}: no effect on threadwise's rendezvous (join_timeout is the one it reads)",
            c.inert.join(", ")
        ));
    }
    notes
}

/// What torchrun's options change in the run, and notes said once (at
/// start-up and by `--dry-run`).
pub(super) fn apply(a: &mut RunCmd, notes: &mut Vec<String>) -> Result<TorchrunOutput, Failure> {
    let t = a.torchrun.clone();
    notes.extend(inert_notes(a));
    let mut inert = vec![];
    if let Some(v) = t.monitor_interval {
        inert.push(format!("--monitor-interval {v}"));
    }
    if let Some(v) = &t.start_method {
        inert.push(format!("--start-method {v} (every rank is a fresh exec)"));
    }
    if let Some(v) = &t.event_log_handler {
        inert.push(format!("--event-log-handler {v}"));
    }
    match t.logs_specs.as_deref() {
        None => {}
        Some("default") => inert.push("--logs-specs default".into()),
        Some(other) => {
            return Err(Failure::usage(
                format!(
                    "--logs-specs {other}: a torchrun LogsSpecs plug-in, which threadwise cannot load"
                ),
                "drop it (or give default): --log-dir DIR writes every rank's stdout and stderr to files",
            ));
        }
    }
    if !inert.is_empty() {
        notes.push(format!(
            "torchrun's {}: no effect under threadwise",
            inert.join(", ")
        ));
    }
    if let Some(mode) = &t.numa_binding {
        let policy = match mode.as_str() {
            "node" => Policy::Node,
            "socket" => Policy::Socket,
            "core-complex" => Policy::L3,
            _ => Policy::Exclusive,
        };
        a.plan.policy = policy;
        notes.push(format!(
            "--numa-binding {mode}: threadwise's --policy {policy} (each rank on its GPU's NUMA \
             node, its cores its own where the policy says so)"
        ));
    }
    if let Some(secs) = t.shutdown_timeout {
        a.grace = Duration::from_secs(secs.into());
        notes.push(format!(
            "--shutdown-timeout {secs}: {secs} s between SIGTERM and SIGKILL (threadwise's --grace)"
        ));
    }
    if let Some(addr) = &t.local_addr {
        notes.push(match a.plan.nnodes.max > 1 {
            true => format!("--local-addr {addr}: the address this node gives the others"),
            false => format!("--local-addr {addr}: no effect on one node"),
        });
    }
    if let Some(tpl) = &t.log_line_prefix_template {
        notes.push(format!(
            "--log-line-prefix-template: each output line starts with {tpl:?}"
        ));
    }
    if t.virtual_local_rank {
        notes.push("--virtual-local-rank: LOCAL_RANK=0 in every rank".into());
    }
    let mut env = vec![];
    let mut stop_on_usr = vec![];
    if let Some(list) = &t.signals_to_handle {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some((_, sig)) = NAMED.iter().find(|(n, _)| *n == name) else {
                return Err(Failure::usage(
                    format!("--signals-to-handle: {name} is no signal threadwise handles"),
                    "name some of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2",
                ));
            };
            if *sig == libc::SIGUSR1 || *sig == libc::SIGUSR2 {
                stop_on_usr.push(*sig);
            }
        }
        env.push(("TORCHELASTIC_SIGNALS_TO_HANDLE".to_string(), list.clone()));
        if !stop_on_usr.is_empty() {
            notes.push(format!(
                "--signals-to-handle {list}: SIGUSR1/SIGUSR2 named there stop the job (forwarded \
                 to the ranks, then --grace), as under torchrun"
            ));
        }
    }
    if t.virtual_local_rank {
        env.push(("LOCAL_RANK".to_string(), "0".to_string()));
    }
    let duplicate = [&t.duplicate_stdout_filters, &t.duplicate_stderr_filters]
        .map(|f| f.as_deref().map(filters).filter(|v| !v.is_empty()));
    let prefix_template = t.log_line_prefix_template.clone();
    if prefix_template.is_some() && a.no_prefix {
        return Err(Failure::usage(
            "--log-line-prefix-template with --no-prefix",
            "drop one: the template is the prefix",
        ));
    }
    let dup_dir: Option<PathBuf> = match (&duplicate, &a.log_dir) {
        ([None, None], _) => None,
        (_, Some(d)) => Some(d.clone()),
        (_, None) if a.dry_run => {
            notes.push(
                "--duplicate-*-filters without --log-dir: the filtered lines go to a private \
                 directory made under the temporary directory at start"
                    .into(),
            );
            None
        }
        (_, None) => {
            // torchrun writes them under a temporary log directory of its
            // own; ours is made afresh, readable by us only, and kept.
            use std::os::unix::fs::PermissionsExt;
            let d = tempfile::Builder::new()
                .prefix("threadwise-filtered-")
                .permissions(std::fs::Permissions::from_mode(0o700))
                .tempdir()
                .map_err(|e| {
                    Failure::env(
                        format!("cannot make a directory for the filtered lines: {e}"),
                        "give --log-dir DIR",
                    )
                })?
                .keep();
            notes.push(format!(
                "--duplicate-*-filters without --log-dir: the filtered lines go to {}",
                d.display()
            ));
            Some(d)
        }
    };
    Ok(TorchrunOutput {
        env,
        prefix_template,
        duplicate,
        dup_dir,
        stop_on_usr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_split_on_commas_and_a_double_comma_is_one() {
        assert_eq!(filters("apple,orange"), ["apple", "orange"]);
        assert_eq!(filters("a,,b,c"), ["a,b", "c"]);
        assert!(filters("").is_empty() && filters(",").is_empty());
    }
}
