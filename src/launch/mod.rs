//! Starting ranks with a plan: `run` spawns and supervises them on one node,
//! `bind` applies one rank's slice under another launcher and execs. The OS
//! work (fork/exec, signals, pipes, wait4) lives here; what each rank gets is
//! decided by the planner and turned into a `RankLaunch` before anything starts.

pub mod bind;
pub mod detect;
pub mod env;
pub mod output;
mod signals;
pub mod supervise;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::os::{self, Placement};
use crate::plan::{MemPolicy, Plan, RankPlan};

/// Errors before or while starting ranks.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("no command given")]
    NoCommand,
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("{0} is not executable")]
    NotExecutable(String),
    #[error("cannot bind rank {rank} ({what} refused for CPUs {cpus}, memory {mem}): {source}")]
    Placement {
        rank: usize,
        what: &'static str,
        cpus: String,
        mem: String,
        source: std::io::Error,
    },
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        rank: usize,
        program: String,
        source: std::io::Error,
    },
    #[error("cannot create log directory {path}: {source}")]
    LogDir {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Launcher(String),
    #[error("cannot exec {program}: {source}")]
    Exec {
        program: String,
        source: std::io::Error,
    },
}

impl LaunchError {
    pub fn hint(&self) -> &'static str {
        match self {
            LaunchError::NoCommand => {
                "put the command after --: threadwise run -n 2 -- python train.py"
            }
            LaunchError::NotFound(_) => {
                "check the name and PATH; threadwise runs the command directly, without a shell"
            }
            LaunchError::NotExecutable(_) => {
                "chmod +x it, or run it through its interpreter (python x.py, sh x.sh)"
            }
            LaunchError::Placement { .. } => {
                "the kernel refused the binding (a container without CAP_SYS_NICE, or a cpuset that \
                 changed); --allow-unbound starts the ranks unbound"
            }
            LaunchError::Spawn { .. } | LaunchError::Exec { .. } => {
                "check the command and its permissions"
            }
            LaunchError::LogDir { .. } => "give --log-dir a writable directory",
            LaunchError::Launcher(_) => {
                "run under torchrun, srun, mpirun (Open MPI, MPICH, Intel MPI, MVAPICH) or Cray PALS, \
                 or use threadwise run"
            }
        }
    }
}

/// One rank, ready to start.
#[derive(Debug, Clone)]
pub struct RankLaunch {
    pub local_rank: usize,
    pub argv: Vec<OsString>,
    /// argv[0] resolved through PATH, when it was.
    pub program: Option<PathBuf>,
    /// Variables set or replaced for this rank; the rest is inherited.
    pub env: BTreeMap<String, String>,
    /// Variables removed from the inherited environment.
    pub env_remove: Vec<String>,
    pub placement: Placement,
    pub cpus: String,
    pub mem: String,
}

/// The placement a rank plan asks for.
pub fn placement_of(rank: &RankPlan) -> (Placement, String) {
    let mode = match rank.mem_policy {
        MemPolicy::None => None,
        MemPolicy::Local => Some(os::MPOL_LOCAL),
        MemPolicy::Preferred => Some(os::MPOL_PREFERRED),
        MemPolicy::Bind => Some(os::MPOL_BIND),
        MemPolicy::Interleave => Some(os::MPOL_INTERLEAVE),
    };
    let mut nodes: crate::cpuset::CpuSet = rank.mem_nodes.iter().copied().collect();
    if mode == Some(os::MPOL_PREFERRED) {
        nodes = nodes.first().into_iter().collect();
    }
    let mem = mode.map(|m| (m, nodes.words().to_vec()));
    let desc = match (rank.mem_policy, nodes.is_empty()) {
        (MemPolicy::None, _) => "none (inherited)".to_string(),
        (MemPolicy::Local, _) => "local".to_string(),
        (p, false) => format!("{p} {nodes}"),
        (p, true) => p.to_string(),
    };
    let p = Placement {
        cpus: rank.bind.then(|| os::mask_words(&rank.cpus)),
        mem: mem.filter(|(m, w)| *m == os::MPOL_LOCAL || !w.is_empty()),
    };
    (p, desc)
}

/// One rank's launch: the plan's environment plus `extra`, its placement.
pub fn rank_launch(
    rank: &RankPlan,
    argv: &[OsString],
    extra: BTreeMap<String, String>,
) -> RankLaunch {
    let mut env = rank.env.clone();
    env.extend(extra);
    let (placement, mem) = placement_of(rank);
    RankLaunch {
        local_rank: rank.local_rank,
        argv: argv.to_vec(),
        program: None,
        env_remove: vec![],
        env,
        placement,
        cpus: if rank.bind {
            rank.cpus.to_string()
        } else {
            format!("{} (unbound)", rank.cpus)
        },
        mem,
    }
}

/// Every rank of a plan with torchrun's contract for `job`; the plan's unset
/// variables are removed from the inherited environment.
pub fn plan_launches(p: &Plan, argv: &[OsString], job: &env::Job) -> Vec<RankLaunch> {
    p.ranks
        .iter()
        .map(|r| {
            let mut l = rank_launch(r, argv, env::torchrun_env(job, r.local_rank));
            l.env_remove = p.unset_env.clone();
            l
        })
        .collect()
}

/// Check placements in one scratch thread before any rank starts, so a refusal
/// is reported once, up front, and never leaves half a launch behind. Returns
/// the index of the first refused placement with the error.
pub fn preflight(ps: &[Placement]) -> Option<(usize, &'static str, std::io::Error)> {
    let ps = ps.to_vec();
    std::thread::spawn(move || {
        ps.iter()
            .enumerate()
            .find_map(|(i, p)| p.apply().err().map(|(what, e)| (i, what, e)))
    })
    .join()
    .ok()
    .flatten()
}

/// Resolve a program the way execvp would, to fail before starting anything.
pub fn resolve(program: &OsString) -> Result<PathBuf, LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    let name = Path::new(program);
    let shown = name.display().to_string();
    let candidates: Vec<PathBuf> = if program.to_string_lossy().contains('/') {
        vec![name.to_path_buf()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
            .unwrap_or_default()
    };
    let mut not_exec = None;
    for c in candidates {
        if let Ok(meta) = std::fs::metadata(&c)
            && meta.is_file()
        {
            if meta.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
            not_exec = Some(c.display().to_string());
        }
    }
    Err(match not_exec {
        Some(p) => LaunchError::NotExecutable(p),
        None => LaunchError::NotFound(shown),
    })
}
