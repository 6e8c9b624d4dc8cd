//! Which ranks `top` watches. `threadwise run` writes a small state file
//! (owner-only, in `$XDG_RUNTIME_DIR/threadwise/` or `/tmp/threadwise-UID/`)
//! with its pid, plan and the ranks' pids; `top` reads the live ones. `--pid`
//! names processes directly; `--all` finds every rank a launcher started
//! (torchrun, Slurm, Open MPI, with or without `threadwise bind`) from the
//! variables in `/proc/PID/environ` that this user may read.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Target;
use crate::cpuset::CpuSet;
use crate::measure::process;

pub(crate) const STATE_SCHEMA: &str = "threadwise.run-state/1";

/// What a running `threadwise run` tells `top`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunState {
    pub schema: String,
    /// The `threadwise run` process.
    pub pid: i32,
    pub command: Vec<String>,
    pub ranks: Vec<Target>,
    pub log_dir: Option<String>,
    /// A bind holder's (`tw-hold PID`), not a run's: its one rank's
    /// corrections, never picked as the run to watch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holder: bool,
}

fn uid() -> u32 {
    // SAFETY: plain query.
    unsafe { libc::geteuid() }
}

/// Where state files go: `$XDG_RUNTIME_DIR/threadwise` when that directory
/// exists, else `/tmp/threadwise-UID`.
pub(crate) fn state_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| Path::new(d).is_absolute() && Path::new(d).is_dir())
    {
        Some(d) => Path::new(&d).join("threadwise"),
        None => PathBuf::from(format!("/tmp/threadwise-{}", uid())),
    }
}

/// The state directory, created owner-only; refused when someone else owns
/// it or may write it (a planted directory in /tmp).
fn own_dir() -> Result<PathBuf, String> {
    let d = state_dir();
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&d)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return Err(format!("cannot create {}: {e}", d.display()));
    }
    let m = std::fs::symlink_metadata(&d).map_err(|e| e.to_string())?;
    if !m.is_dir() || m.uid() != uid() || m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a directory of yours with mode 700",
            d.display()
        ));
    }
    Ok(d)
}

/// Write the state of run `state.pid`; returns the file to remove at the end.
pub(crate) fn write_state(state: &RunState) -> Result<PathBuf, String> {
    let kind = if state.holder { "hold" } else { "run" };
    let f = own_dir()?.join(format!("{kind}-{}.json", state.pid));
    let text = serde_json::to_string(state).map_err(|e| e.to_string())?;
    // It lives as long as the run: no sync to disk (a launch would wait on it).
    crate::files::replace(&f, text.as_bytes(), false).map_err(|e| e.to_string())?;
    Ok(f)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The runs whose `threadwise run` is still alive, newest first.
pub(crate) fn live_runs() -> Vec<RunState> {
    live_states().into_iter().filter(|s| !s.holder).collect()
}

/// Every live state file: the runs', and bind's holders' (their ranks'
/// corrections), newest first.
pub(crate) fn live_states() -> Vec<RunState> {
    let Ok(rd) = std::fs::read_dir(state_dir()) else {
        return vec![];
    };
    let mut out: Vec<(std::time::SystemTime, RunState)> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let m = e.metadata().ok()?;
            if m.uid() != uid() {
                return None;
            }
            let text = crate::topology::fsread::read_bounded(&e.path(), 16 << 20).ok()?;
            let s: RunState = serde_json::from_str(&text).ok()?;
            let when = m.modified().ok()?;
            (s.schema == STATE_SCHEMA && alive(s.pid)).then_some((when, s))
        })
        .collect();
    out.sort_by_key(|x| std::cmp::Reverse(x.0));
    out.into_iter().map(|(_, s)| s).collect()
}

/// A target from a process's launcher variables, or None when it is no rank.
pub(crate) fn target_from_env(pid: i32, env: &BTreeMap<String, String>) -> Option<Target> {
    let local = [
        "LOCAL_RANK",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "PMI_LOCAL_RANK",
    ]
    .iter()
    .find_map(|k| env.get(*k)?.trim().parse::<usize>().ok())?;
    let set = |k: &str| env.get(k).and_then(|v| CpuSet::parse_list(v).ok());
    Some(Target {
        local_rank: local,
        pid,
        cpus: set("THREADWISE_CPUS").unwrap_or_else(|| process::affinity(pid)),
        worker_cpus: set("THREADWISE_WORKER_CPUS").unwrap_or_default(),
        mem_nodes: env
            .get("THREADWISE_NUMA_NODES")
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_default(),
        gpu: env.get("THREADWISE_GPU").cloned(),
        // Under bind and spawn the plan's role layout is in the variables.
        roles: set("THREADWISE_SERVICE_CPUS")
            .zip(set("THREADWISE_TEAM_CPUS"))
            .map(|(service, team)| crate::roles::RoleCpus { service, team }),
        corrections: BTreeMap::new(),
    })
}

/// Every rank a launcher started that this user may read: processes with a
/// local-rank variable whose parent is not itself such a rank (DataLoader
/// workers inherit the variables), and that are not launchers (`srun`,
/// `torchrun`, `threadwise`).
pub(crate) fn all_ranks() -> Vec<Target> {
    let me = std::process::id() as i32;
    let mut found: BTreeMap<i32, Target> = BTreeMap::new();
    for pid in process::pids() {
        if pid == me {
            continue;
        }
        let comm = process::comm(pid).unwrap_or_default();
        // bind's holders carry the rank's variables: never a rank.
        if comm.starts_with("tw-hold") {
            continue;
        }
        if matches!(
            comm.as_str(),
            "srun" | "torchrun" | "threadwise" | "slurmstepd" | "mpirun" | "prterun" | "prted"
        ) {
            continue;
        }
        if let Ok(env) = process::environ(pid)
            && let Some(t) = target_from_env(pid, &env)
        {
            found.insert(pid, t);
        }
    }
    let ranks: Vec<i32> = found.keys().copied().collect();
    found
        .into_values()
        .filter(|t| process::parent(t.pid).is_none_or(|pp| !ranks.contains(&pp)))
        .collect()
}
