//! Starting ranks with a plan: `run` spawns and supervises them on one node,
//! `bind` applies one rank's slice under another launcher and execs. The OS
//! work (fork/exec, signals, pipes, wait4) lives here; what each rank gets is
//! decided by the planner and turned into a `RankLaunch` before anything starts.

pub(crate) mod env;
pub(crate) mod machine;
pub(crate) mod output;
pub(crate) mod prepare;
pub(crate) mod report;
mod start;
pub(crate) mod supervise;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Hinted, Kind};
use crate::os::{self, Placement};
use crate::plan::{MemPolicy, Plan, RankPlan};

/// Errors before or while starting ranks.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
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
    #[error("cannot open log file {path}: {why}")]
    LogFile { path: String, why: String },
    #[error("{0}")]
    Launcher(String),
    #[error("cannot find a free port for MASTER_PORT: {0}")]
    Port(std::io::Error),
    #[error("cannot exec {program}: {source}")]
    Exec {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot start a thread: {0}")]
    Threads(std::io::Error),
}

/// Can this process start threads? Where a container's seccomp profile
/// refuses clone3 with EPERM (Docker before 20.10.10), glibc 2.34+ cannot,
/// and nothing would run: said before anything starts, not as a panic.
pub(crate) fn threads_work() -> Result<(), LaunchError> {
    std::thread::Builder::new()
        .spawn(|| ())
        .map_err(LaunchError::Threads)?
        .join()
        .map_err(|_| LaunchError::Threads(std::io::Error::other("a thread panicked")))
}

impl Hinted for LaunchError {
    /// The machine refused, or the user gave something wrong.
    fn kind(&self) -> Kind {
        match self {
            LaunchError::Placement { .. }
            | LaunchError::LogDir { .. }
            | LaunchError::LogFile { .. }
            | LaunchError::Port(_)
            | LaunchError::Threads(_) => Kind::Environment,
            _ => Kind::Usage,
        }
    }

    fn hint(&self) -> String {
        let hint = match self {
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
            LaunchError::LogFile { .. } => {
                "remove what is at that name (threadwise does not write through links), or give another --log-dir"
            }
            LaunchError::Port(_) => "give --master-port",
            LaunchError::Threads(_) => {
                "the container's seccomp profile refuses clone3 with EPERM, where glibc 2.34+ needs \
                 ENOSYS to fall back (Docker before 20.10.10, old runc or containerd profiles): \
                 update the container runtime, or give the container a profile that allows clone3"
            }
            LaunchError::Launcher(_) => {
                "run under torchrun, srun, mpirun (Open MPI, MPICH, Intel MPI, MVAPICH) or Cray PALS; \
                 outside a launcher give this rank's place: --local-rank K --local-world-size N; \
                 or let threadwise start the ranks: threadwise run"
            }
        };
        hint.into()
    }
}

pub(crate) use crate::proc::RankLaunch;

/// The `set_mempolicy` mode and nodes a rank plan asks for (None: leave it).
/// Preferred takes the first node, as the kernel's MPOL_PREFERRED does one.
pub(crate) fn mem_call(rank: &RankPlan) -> (Option<i32>, crate::cpuset::CpuSet) {
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
    (mode, nodes)
}

/// The placement a rank plan asks for.
pub(crate) fn placement_of(rank: &RankPlan) -> (Placement, String) {
    let (mode, nodes) = mem_call(rank);
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
pub(crate) fn rank_launch(
    rank: &RankPlan,
    argv: &[OsString],
    extra: BTreeMap<String, String>,
) -> RankLaunch {
    let mut env = rank.env.clone();
    env.extend(extra);
    let (placement, mem) = placement_of(rank);
    // The rank's environment is ours with `env` over it.
    let binds =
        crate::proc::hold::runtime_binds(|k| env.get(k).cloned().or_else(|| std::env::var(k).ok()));
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
        // Under --roles a worker forked by the main thread would inherit the
        // service core: moved even where its CPUs are the rank's.
        worker_mask: (rank.bind
            && !rank.worker_cpus.is_empty()
            && (rank.worker_cpus != rank.cpus || rank.roles.is_some()))
        .then(|| os::mask_words(&rank.worker_cpus)),
        hold: rank.bind.then(|| crate::proc::hold::HoldSpec {
            cpus: rank.cpus.clone(),
            roles: rank.roles.clone(),
            runtime_binds: binds,
        }),
    }
}

/// Every rank of a plan with torchrun's contract for `job`; the plan's unset
/// variables are removed from the inherited environment.
pub(crate) fn plan_launches(p: &Plan, argv: &[OsString], job: &env::Job) -> Vec<RankLaunch> {
    p.ranks
        .iter()
        .map(|r| {
            let mut l = rank_launch(r, argv, env::torchrun_env(job, r.local_rank));
            l.env_remove = p.unset_env.clone();
            l
        })
        .collect()
}

/// A plan's launches on this node with torchrun's contract: rank 0 at
/// `master_addr`, listening on `port` (a free one when None), in `role`
/// (ROLE_NAME).
pub(crate) fn node_launches(
    p: &Plan,
    argv: &[OsString],
    master_addr: &str,
    port: Option<u16>,
    role: &str,
) -> Result<Vec<RankLaunch>, LaunchError> {
    let master_port = match port {
        Some(p) => p,
        None => env::free_port().map_err(LaunchError::Port)?,
    };
    let job = env::Job {
        role: role.to_string(),
        ..env::Job::single(p.nproc, master_addr, master_port, env::run_id())
    };
    Ok(plan_launches(p, argv, &job))
}

/// Try every launch's placement in one scratch thread before any rank starts,
/// so a refusal is reported once, up front, and never leaves half a launch
/// behind.
pub(crate) fn check_placements(launches: &[RankLaunch]) -> Result<(), LaunchError> {
    // Each distinct CPU mask and memory policy once (8 ranks on 2 CPUs are
    // 2 masks to try), on a helper thread: the masks set from here while it
    // waits (a waiting thread moves nowhere, where setting the running one's
    // mask waits for its migration), the memory policies by the helper itself.
    let mut cpus: Vec<(usize, &Vec<u64>)> = vec![];
    let mut mems: Vec<(usize, (i32, Vec<u64>))> = vec![];
    for (i, l) in launches.iter().enumerate() {
        if let Some(w) = &l.placement.cpus
            && !cpus.iter().any(|(_, c)| *c == w)
        {
            cpus.push((i, w));
        }
        if let Some(m) = &l.placement.mem
            && !mems.iter().any(|(_, n)| n == m)
        {
            mems.push((i, m.clone()));
        }
    }
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    // The launch's first thread: where none can start (see `threads_work`),
    // this is where it is said.
    let helper = std::thread::Builder::new()
        .stack_size(64 << 10)
        .spawn(move || {
            // SAFETY: plain query.
            let _ = tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t);
            let _ = go_rx.recv();
            mems.iter().find_map(|(i, (mode, nodes))| {
                os::set_mempolicy_raw(*mode, nodes)
                    .err()
                    .map(|e| (*i, "set_mempolicy", e))
            })
        })
        .map_err(LaunchError::Threads)?;
    let refused_cpus = match tid_rx.recv() {
        Ok(tid) => cpus.iter().find_map(|(i, w)| {
            os::set_task_affinity(tid, w)
                .err()
                .map(|e| (*i, "sched_setaffinity", e))
        }),
        Err(_) => None,
    };
    let _ = go_tx.send(());
    let refused_mem = helper.join().ok().flatten();
    match refused_cpus.or(refused_mem) {
        None => Ok(()),
        Some((i, what, source)) => Err(LaunchError::Placement {
            rank: launches[i].local_rank,
            what,
            cpus: launches[i].cpus.clone(),
            mem: launches[i].mem.clone(),
            source,
        }),
    }
}

/// Resolve a program the way execvp would (the `which` crate), to fail before
/// starting anything.
pub(crate) fn resolve(program: &OsString) -> Result<PathBuf, LaunchError> {
    let name = Path::new(program);
    if program.is_empty() {
        return Err(LaunchError::NotFound("''".into()));
    }
    which::which(name).map_err(|_| {
        // A path that names a file which cannot be run gets its own hint.
        if program.to_string_lossy().contains('/') && name.is_file() {
            LaunchError::NotExecutable(name.display().to_string())
        } else {
            LaunchError::NotFound(name.display().to_string())
        }
    })
}
