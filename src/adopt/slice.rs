//! `bind`'s slice of the node plan under another launcher: the plan every
//! sibling computes alike, this rank's launch (with the torchrun variables
//! the launcher did not set, MASTER_ADDR and MASTER_PORT among them where
//! they can be known), and the `threadwise.bind/1` document the Python
//! helper applies in-process.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::detect;
use crate::host::facts;
use crate::launch::prepare::PrepareError;
use crate::launch::{RankLaunch, rank_launch};
use crate::plan::{self, NProc, Plan, PlanRequest};
use crate::topology::Topology;

/// torchrun's default MASTER_PORT, where bind makes a one-node job's (and
/// where MASTER_ADDR is given without it).
pub(crate) const STANDALONE_PORT: u16 = 29500;

/// What torch's `env://` needs that this rank's launcher did not set, by one
/// rule for every launcher bind detects (docs/reference/environment.md):
/// LOCAL_RANK and LOCAL_WORLD_SIZE; RANK and WORLD_SIZE where the launcher
/// numbers its ranks; MASTER_ADDR and MASTER_PORT
/// - under torchrun: its own;
/// - under Slurm: the step's first node, 15000 + the job id's last 4 digits;
/// - with every rank on this node (the launcher's world is its local size,
///   or the caller numbered local ranks alone): 127.0.0.1 and 29500, as a
///   one-node torchrun would;
/// - with ranks on other nodes too and no way to know which host runs rank 0:
///   MASTER_ADDR must be set (refused before anything starts, naming it),
///   and MASTER_PORT is then 29500 where unset.
///
/// Only variables unset in `current` are returned.
fn torchrun_vars(
    launcher: &detect::Launcher,
    given: Option<(usize, usize)>,
    current: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, PrepareError> {
    let mut out = BTreeMap::new();
    let mut add = |k: &str, v: String| {
        if current(k).is_none() {
            out.insert(k.to_string(), v);
        }
    };
    let local = launcher.local_size;
    add("LOCAL_RANK", launcher.local_rank.to_string());
    add("LOCAL_WORLD_SIZE", local.to_string());
    // The world, where the launcher (or the caller's WORLD_SIZE) says it.
    let world = match (launcher.global, given) {
        (Some((rank, world)), _) => {
            add("RANK", rank.to_string());
            add("WORLD_SIZE", world.to_string());
            Some(world)
        }
        (None, Some(_)) if current("RANK").is_none() && current("WORLD_SIZE").is_none() => {
            // Ranks the caller numbered with --local-rank, and nothing else
            // numbered: one node, as torchrun --standalone would make it.
            add("RANK", launcher.local_rank.to_string());
            add("WORLD_SIZE", local.to_string());
            Some(local)
        }
        (None, _) => current("WORLD_SIZE").and_then(|w| w.trim().parse::<usize>().ok()),
    };
    match (launcher.name, world) {
        ("torchrun", _) => {}
        ("Slurm", _) => {
            let (addr, port) = detect::slurm_master(current);
            if let Some(a) = addr {
                add("MASTER_ADDR", a);
            }
            if let Some(p) = port {
                add("MASTER_PORT", p.to_string());
            }
        }
        (_, Some(w)) if w <= local => {
            add("MASTER_ADDR", "127.0.0.1".into());
            add("MASTER_PORT", STANDALONE_PORT.to_string());
        }
        (name, Some(world)) => {
            if current("MASTER_ADDR").is_none() {
                return Err(PrepareError::NoMaster {
                    launcher: name.to_string(),
                    world,
                    local,
                });
            }
            add("MASTER_PORT", STANDALONE_PORT.to_string());
        }
        (_, None) => {}
    }
    Ok(out)
}

/// `bind`: the node plan every sibling under the launcher computes alike, and
/// this rank's launch of `command`, with what torch's `env://` needs and the
/// launcher did not set (`torchrun_vars`). `given`: the local rank and size
/// the caller names (`--local-rank`, `--local-world-size`), in place of a
/// launcher's variables.
pub(crate) fn bind_launch(
    mut t: Topology,
    mut req: PlanRequest,
    command: &[OsString],
    current: &dyn Fn(&str) -> Option<String>,
    given: Option<(usize, usize)>,
) -> Result<(Plan, RankLaunch, detect::Launcher), PrepareError> {
    let launcher = match given {
        Some((local_rank, local_size)) => detect::Launcher {
            name: "the caller",
            local_rank,
            local_size,
            binds_ranks: false,
            global: None,
        },
        None => detect::detect(current)?,
    };
    // Refused before the plan is made, as before anything starts.
    let extra = torchrun_vars(&launcher, given, current)?;
    if launcher.binds_ranks {
        // srun and mpirun bind each rank already: its mask is its own, not the
        // node's. Plan from what every sibling sees alike: the union of the
        // masks Slurm applied, else the cgroup (the job's CPUs).
        t.limits.affinity = (launcher.name == "Slurm")
            .then(|| detect::slurm_node_cpus(current))
            .flatten();
        t.apply_limits();
    }
    match req.nproc {
        NProc::Count(n) if n != launcher.local_size => {
            return Err(PrepareError::BindCount {
                asked: n,
                launcher: launcher.name.to_string(),
                size: launcher.local_size,
            });
        }
        _ => req.nproc = NProc::Count(launcher.local_size),
    }
    let p = plan::plan(&t, &req, &facts(&req))?;
    let rank = &p.ranks[launcher.local_rank];
    let l = rank_launch(rank, command, extra);
    Ok((p, l, launcher))
}

/// `bind --json`: this rank's slice as the `threadwise.bind/1` document the
/// Python helper applies in-process (`threadwise.apply`, `threadwise.spawn`):
/// the system calls' arguments as `run` makes them, the variables to set and
/// remove, and the node's whole plan (every sibling computes the same one).
pub(crate) fn bind_json(
    plan: &Plan,
    l: &RankLaunch,
    launcher: &detect::Launcher,
) -> Result<String, serde_json::Error> {
    let ranks: Vec<serde_json::Value> = plan
        .ranks
        .iter()
        .map(|r| {
            let (mode, nodes) = crate::launch::mem_call(r);
            // As `placement_of` leaves it: no node to name, no call.
            let mode = mode.filter(|m| *m == crate::os::MPOL_LOCAL || !nodes.is_empty());
            serde_json::json!({
                "local_rank": r.local_rank,
                "cpus": r.bind.then(|| r.cpus.iter().collect::<Vec<_>>()),
                "worker_cpus": r.worker_cpus.iter().collect::<Vec<_>>(),
                "mem_mode": mode,
                "mem_nodes": nodes.iter().collect::<Vec<_>>(),
                "threads": r.threads,
                "roles": r.roles.as_ref().map(|l| serde_json::json!({
                    "service": l.service.iter().collect::<Vec<_>>(),
                    "team": l.team.iter().collect::<Vec<_>>(),
                })),
                "env": r.env,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "schema": "threadwise.bind/1",
        "launcher": launcher.name,
        "local_rank": launcher.local_rank,
        "local_world_size": launcher.local_size,
        "env": l.env,
        "env_remove": plan.unset_env,
        "placements": ranks,
        // The Python helper's holder names roles by this table: one table.
        "thread_names": crate::roles::NAMES
            .iter()
            .map(|(prefix, role, _)| (prefix, role.name()))
            .collect::<Vec<_>>(),
        "plan": plan,
    });
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}
