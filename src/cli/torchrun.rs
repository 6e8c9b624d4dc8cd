//! The rest of torchrun's command line (torchrun 2.15's options that `run`
//! shares by meaning rather than by name): each option in both spellings,
//! and through its `PET_*` variable where torchrun reads one (`pet.rs`).
//! What each does here is decided once, in `apply`, and said once.

use std::path::PathBuf;
use std::time::Duration;

use super::Failure;
use super::args::RunCmd;
use crate::job::settings::TorchrunOutput;
use crate::plan::Policy;

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

/// What torchrun's options change: the run's output and variables, and the
/// spellings of threadwise's own options (`--numa-binding` is a `--policy`,
/// `--shutdown-timeout` the `--grace`), which win over them.
#[derive(Debug)]
pub(super) struct Applied {
    pub output: TorchrunOutput,
    pub policy: Option<Policy>,
    pub grace: Option<Duration>,
}

/// What torchrun's options change in the run, and notes said once (at
/// start-up and by `--dry-run`); the parsed options are left as they are.
pub(super) fn apply(a: &RunCmd, notes: &mut Vec<String>) -> Result<Applied, Failure> {
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
    let policy = t.numa_binding.as_deref().map(|mode| match mode {
        "node" => Policy::Node,
        "socket" => Policy::Socket,
        "core-complex" => Policy::L3,
        _ => Policy::Exclusive,
    });
    if let (Some(mode), Some(policy)) = (&t.numa_binding, policy) {
        notes.push(format!(
            "--numa-binding {mode}: threadwise's --policy {policy} (each rank on its GPU's NUMA \
             node, its cores its own where the policy says so)"
        ));
    }
    if let Some(secs) = t.shutdown_timeout {
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
    Ok(Applied {
        output: TorchrunOutput {
            env,
            prefix_template,
            duplicate,
            dup_dir,
            stop_on_usr,
        },
        policy,
        grace: t
            .shutdown_timeout
            .map(|secs| Duration::from_secs(secs.into())),
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
