//! Getting ranks ready to start, shared by `run`, `bind` and tune's runner:
//! a saved plan checked against this machine, every binding tried before anything starts, the ranks' error
//! files, and what `--dry-run` shows. The command line only parses
//! and calls these.

use std::path::{Path, PathBuf};

use super::env::overridden;
use super::{LaunchError, RankLaunch, check_placements};
use crate::error::{Hinted, Kind};
use crate::export::{quote, quote_all};
use crate::plan::{Plan, PlanError};
use crate::topology::{Topology, TopologyError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("cannot read --plan {path}: {why}")]
    PlanUnreadable { path: String, why: String },
    #[error("--plan {path} is not a threadwise.plan/1 document: {why}")]
    PlanNotAPlan { path: String, why: String },
    #[error("--plan {path}: {why}")]
    PlanInvalid { path: String, why: String },
    #[error("--plan {path}: rank {rank} uses CPUs {cpus} but this process may use {allowed}")]
    PlanOtherMachine {
        path: String,
        rank: usize,
        cpus: String,
        allowed: String,
    },
    #[error("cannot create a directory for the ranks' error files: {0}")]
    ErrorDir(std::io::Error),
    #[error("--nproc-per-node {asked}, but {launcher} started {size} ranks on this node")]
    BindCount {
        asked: usize,
        launcher: String,
        size: usize,
    },
    #[error(
        "MASTER_ADDR is not set: {launcher} started {world} ranks, {local} of them on this node, \
         and does not say which host runs rank 0"
    )]
    NoMaster {
        launcher: String,
        world: usize,
        local: usize,
    },
}

impl Hinted for PrepareError {
    /// What to do about it.
    fn hint(&self) -> String {
        match self {
            PrepareError::Launch(e) => e.hint(),
            PrepareError::Plan(e) => e.hint(),
            PrepareError::Topology(e) => e.hint(),
            PrepareError::PlanUnreadable { .. } | PrepareError::PlanNotAPlan { .. } => {
                "give a file from threadwise tune --save-plan or plan --json".into()
            }
            PrepareError::PlanInvalid { .. } => {
                "re-create it with threadwise tune --save-plan or plan --json on this machine"
                    .into()
            }
            PrepareError::PlanOtherMachine { .. } => {
                "the plan was made for another machine or cgroup; plan again here".into()
            }
            PrepareError::ErrorDir(_) => "check TMPDIR".into(),
            PrepareError::BindCount { .. } => {
                "leave --nproc-per-node out under a launcher, or make them agree".into()
            }
            PrepareError::NoMaster { .. } => {
                "set MASTER_ADDR to rank 0's host for every rank (MASTER_PORT too, else 29500), \
                 e.g. mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ... threadwise bind -- ..."
                    .into()
            }
        }
    }

    /// What the user typed, or the machine.
    fn kind(&self) -> Kind {
        match self {
            PrepareError::Launch(e) => e.kind(),
            PrepareError::Plan(_)
            | PrepareError::PlanUnreadable { .. }
            | PrepareError::PlanNotAPlan { .. }
            | PrepareError::PlanInvalid { .. }
            | PrepareError::BindCount { .. }
            | PrepareError::NoMaster { .. } => Kind::Usage,
            PrepareError::Topology(_)
            | PrepareError::PlanOtherMachine { .. }
            | PrepareError::ErrorDir(_) => Kind::Environment,
        }
    }
}

/// A plan saved by `tune --save-plan` (or `plan --json`), checked whole
/// against this machine before anything starts.
pub(crate) fn saved_plan(path: &Path, t: &Topology) -> Result<Plan, PrepareError> {
    use crate::topology::fsread::{MAX_SYSFS_FILE, read_bounded};
    let shown = path.display().to_string();
    let text = read_bounded(path, MAX_SYSFS_FILE).map_err(|e| PrepareError::PlanUnreadable {
        path: shown.clone(),
        why: e.to_string(),
    })?;
    let p: Plan = serde_json::from_str(&text).map_err(|e| PrepareError::PlanNotAPlan {
        path: shown.clone(),
        why: e.to_string(),
    })?;
    let invalid = |why: String| PrepareError::PlanInvalid {
        path: shown.clone(),
        why,
    };
    p.validate().map_err(invalid)?;
    // A preload the file names is held to the rules of one we would choose.
    for r in &p.ranks {
        if let Some(lib) = r.env.get("LD_PRELOAD")
            && let Some(why) = crate::host::preload_refusal(Path::new(lib))
        {
            return Err(invalid(format!(
                "rank {}: LD_PRELOAD={lib}: {why}",
                r.local_rank
            )));
        }
    }
    if let Some(r) = p
        .ranks
        .iter()
        .find(|r| r.bind && !r.cpus.is_subset(&t.allowed_cpus))
    {
        return Err(PrepareError::PlanOtherMachine {
            path: shown,
            rank: r.local_rank,
            cpus: r.cpus.to_string(),
            allowed: t.allowed_cpus.to_string(),
        });
    }
    Ok(p)
}

/// What `check_bindings` gave up, to give up again in every later launch of
/// the job (a multi-node job's rounds).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Relaxed {
    /// The kernel refused the `local` memory policy: ranks keep the kernel's
    /// default, which allocates where they run too.
    pub local_mem: bool,
    /// The kernel refused the binding and --allow-unbound was given.
    pub unbound: bool,
}

impl Relaxed {
    pub(crate) fn apply(self, launches: &mut [RankLaunch]) {
        for l in launches {
            if self.unbound {
                l.placement = Default::default();
            } else if self.local_mem && l.placement.asks_local() {
                l.placement.mem = None;
                l.mem = LOCAL_REFUSED.into();
            }
        }
    }
}

/// How a rank's memory reads where the kernel refused the local policy.
const LOCAL_REFUSED: &str = "the kernel's default (set_mempolicy refused)";

/// What is said where the kernel refuses the local policy (run and bind).
pub(crate) fn local_refused(source: &std::io::Error) -> String {
    format!(
        "memory policy local not set (set_mempolicy refused: {source}): the ranks allocate \
         where they run, as the kernel does by default"
    )
}

/// Try every rank's binding before anything starts. Where the kernel (a
/// container's seccomp profile, a kernel without NUMA) refuses only the
/// `local` memory policy, the ranks go on without it: the kernel's default
/// allocates on the node a thread runs on as well, so only a policy
/// threadwise itself inherited is lost. Any other refusal stops, or
/// (`allow_unbound`) every rank runs unbound. Returns what was given up and
/// the warning to show.
pub(crate) fn check_bindings(
    launches: &mut [RankLaunch],
    allow_unbound: bool,
) -> Result<(Relaxed, Option<String>), PrepareError> {
    let mut relaxed = Relaxed::default();
    let mut said = vec![];
    let mut result = check_placements(launches);
    if let Err(LaunchError::Placement {
        what: "set_mempolicy",
        source,
        ..
    }) = &result
        && launches.iter().any(|l| l.placement.asks_local())
    {
        said.push(local_refused(source));
        relaxed.local_mem = true;
        relaxed.apply(launches);
        result = check_placements(launches);
    }
    match result {
        Ok(()) => {}
        Err(e @ LaunchError::Threads(_)) => return Err(e.into()),
        Err(e) if allow_unbound => {
            relaxed.unbound = true;
            relaxed.apply(launches);
            said.push(format!("ranks run unbound ({e})"));
        }
        Err(e) => return Err(e.into()),
    }
    Ok((relaxed, (!said.is_empty()).then(|| said.join("; "))))
}

/// Where torch's `@record` puts a failing rank's exception, as torchrun sets
/// it: beside the logs, or in a private directory removed when this is dropped.
pub(crate) struct ErrorFiles {
    _private: Option<tempfile::TempDir>,
    pub dir: PathBuf,
}

impl ErrorFiles {
    pub(crate) fn new(log_dir: Option<&Path>) -> Result<ErrorFiles, PrepareError> {
        if let Some(d) = log_dir {
            return Ok(ErrorFiles {
                _private: None,
                dir: d.to_path_buf(),
            });
        }
        let private = tempfile::Builder::new()
            .prefix("threadwise-errors-")
            .tempdir()
            .map_err(PrepareError::ErrorDir)?;
        Ok(ErrorFiles {
            dir: private.path().to_path_buf(),
            _private: Some(private),
        })
    }

    /// The log directory, when the user gave one (else the files are private).
    pub(crate) fn logs(&self) -> Option<&Path> {
        self._private.is_none().then_some(self.dir.as_path())
    }

    /// Give every rank its TORCHELASTIC_ERROR_FILE, removing a previous
    /// run's record (no root cause of this one).
    pub(crate) fn assign(&self, launches: &mut [RankLaunch]) {
        for l in launches {
            let f = super::env::error_file(&self.dir, l.local_rank);
            let _ = std::fs::remove_file(&f);
            l.env
                .insert("TORCHELASTIC_ERROR_FILE".into(), f.display().to_string());
        }
    }
}

/// The line saying which of the user's variables a launch replaces, if any.
pub(crate) fn overrides_note(
    l: &RankLaunch,
    current: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let o = overridden(&l.env, current);
    (!o.is_empty()).then(|| {
        let list: Vec<String> = o
            .iter()
            .map(|(k, old, new)| format!("{k}={old} -> {new}"))
            .collect();
        format!(
            "the plan replaces variables from your environment: {} (--threads/--workers set the plan's own)",
            list.join(", ")
        )
    })
}

/// `--dry-run`: what each rank would get. `mover`: run moves DataLoader
/// workers (bind does not).
pub(crate) fn dry_run(
    plan: &Plan,
    launches: &[RankLaunch],
    mover: bool,
    current: &dyn Fn(&str) -> Option<String>,
) -> String {
    let inherited = std::env::vars_os().count();
    let mut s = format!(
        "{} rank(s); each inherits your environment ({inherited} variables) except what is listed\n",
        plan.nproc
    );
    for l in launches {
        s.push_str(&format!(
            "rank {}: cpus {}, memory {}\n  argv: {}\n",
            l.local_rank,
            l.cpus,
            l.mem,
            quote_all(
                &l.argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            )
        ));
        let workers = plan.ranks.get(l.local_rank).map(|r| &r.worker_cpus);
        if let Some(w) = workers.filter(|_| l.worker_mask.is_some()) {
            s.push_str(&if mover {
                format!("  DataLoader workers: moved to CPUs {w} (checked every 100 ms)\n")
            } else {
                format!(
                    "  DataLoader workers: stay on the rank's CPUs (bind leaves no process to move \
                     them); THREADWISE_WORKER_CPUS={w} for a worker_init_fn\n"
                )
            });
        }
        for (k, v) in &l.env {
            let was = match current(k) {
                Some(old) if old != *v => format!("   (replaces {})", quote(&old)),
                _ => String::new(),
            };
            s.push_str(&format!("  {k}={}{was}\n", quote(v)));
        }
        if mover {
            // Set at start, where the directory is made (ErrorFiles).
            s.push_str(&format!(
                "  TORCHELASTIC_ERROR_FILE=<--log-dir, else a private directory>/{}   (set at start: \
                 where torch's @record writes the rank's exception, said if it fails)\n",
                super::env::error_file(std::path::Path::new(""), l.local_rank).display()
            ));
        }
    }
    s
}
