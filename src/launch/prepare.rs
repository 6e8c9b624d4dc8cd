//! Getting ranks ready to start, shared by `run`, `bind` and tune's runner:
//! the live topology and planner facts, a saved plan checked against this
//! machine, every binding tried before anything starts, the ranks' error
//! files, `bind`'s own slice under another launcher (with MASTER_ADDR and
//! MASTER_PORT derived under Slurm), and what `--dry-run` shows. The command line only parses
//! and calls these.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::env::overridden;
use super::{LaunchError, RankLaunch, check_placements, detect, rank_launch};
use crate::export::{quote, quote_all};
use crate::plan::{self, AllocatorChoice, Facts, NProc, Plan, PlanError, PlanRequest};
use crate::topology::gpus::{self, NvmlUse};
use crate::topology::{Topology, TopologyError, hwloc_xml, synthetic, sysfs};

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
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
}

impl PrepareError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            PrepareError::Launch(e) => e.hint().into(),
            PrepareError::Plan(e) => plan_hint(e),
            PrepareError::Topology(e) => topology_hint(e).into(),
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
        }
    }

    /// The exit code: 2 for what the user typed, 3 for the machine.
    pub fn code(&self) -> i32 {
        match self {
            PrepareError::Launch(e) => e.code(),
            PrepareError::Plan(_)
            | PrepareError::PlanUnreadable { .. }
            | PrepareError::PlanNotAPlan { .. }
            | PrepareError::PlanInvalid { .. }
            | PrepareError::BindCount { .. } => 2,
            PrepareError::Topology(_)
            | PrepareError::PlanOtherMachine { .. }
            | PrepareError::ErrorDir(_) => 3,
        }
    }
}

/// What to do about a plan this machine cannot satisfy; inside an srun step
/// (one CPU per task unless asked), too few CPUs names `--cpus-per-task`.
pub fn plan_hint(e: &PlanError) -> String {
    match e {
        PlanError::TooFewCpus { .. } if std::env::var_os("SLURM_STEP_ID").is_some() => format!(
            "{}; under srun each task gets one CPU unless asked: give the step more with \
             srun --cpus-per-task=N (-c N)",
            e.hint()
        ),
        e => e.hint().to_string(),
    }
}

/// What to do about a topology that cannot be read.
pub fn topology_hint(e: &TopologyError) -> &'static str {
    match e {
        TopologyError::NotARoot { .. } => {
            "give --root a directory holding sys/ and proc/ (hwloc-gather-topology output)"
        }
        TopologyError::Xml { .. } => "give --topology an hwloc v2 export: lstopo --of xml FILE.xml",
        TopologyError::Synthetic { .. } => {
            "e.g. --synthetic \"package:2 numa:2 l3:2 core:8 pu:2 gpu:4\""
        }
        TopologyError::VisibleDevices { .. } => {
            "give indices or UUIDs of GPUs this job can open (threadwise topo lists them); \
             UUIDs need the NVIDIA driver's /proc/driver/nvidia or NVML"
        }
        _ => "check the path and permissions",
    }
}

/// Where a topology comes from.
#[derive(Debug, Clone, Default)]
pub enum Source {
    /// This machine, narrowed to CUDA_VISIBLE_DEVICES.
    #[default]
    Live,
    /// A /sys + /proc dump (hwloc-gather-topology).
    Root(PathBuf),
    /// An hwloc v2 XML export.
    Xml(PathBuf),
    /// A synthetic description.
    Synthetic(String),
}

/// Read the topology `source` names, its GPUs narrowed to the job's.
pub fn topology(source: &Source) -> Result<Topology, TopologyError> {
    topology_with(source, NvmlUse::IfNeeded)
}

/// `topology`, saying when NVML is loaded (`topo` always loads it).
pub fn topology_with(source: &Source, nvml: NvmlUse) -> Result<Topology, TopologyError> {
    match source {
        Source::Root(root) => {
            let mut t = sysfs::probe(root, false)?;
            job_gpus(&mut t, root, false, nvml)?;
            Ok(t)
        }
        Source::Xml(file) => hwloc_xml::load(file),
        Source::Synthetic(desc) => synthetic::parse(desc),
        Source::Live => {
            let mut t = sysfs::probe(Path::new("/"), true)?;
            job_gpus(&mut t, Path::new("/"), true, nvml)?;
            Ok(t)
        }
    }
}

/// Narrow the machine's GPUs to those the job may use (topology/gpus.rs).
fn job_gpus(t: &mut Topology, root: &Path, live: bool, nvml: NvmlUse) -> Result<(), TopologyError> {
    if t.gpus.is_empty() {
        return Ok(());
    }
    let ev = gpus::gather(root, live, nvml);
    let (chosen, access) = gpus::decide(&t.gpus, &ev)?;
    t.gpus = chosen;
    t.gpu_access = Some(access);
    Ok(())
}

/// What the planner may use besides the topology: the allocator libraries on
/// this machine, looked up only when the request asks for one.
pub fn facts(req: &PlanRequest) -> Facts {
    if req.allocator == AllocatorChoice::None {
        Facts::default()
    } else {
        facts_with_allocators()
    }
}

/// Facts with the allocator search done (tune: any configuration may ask).
pub fn facts_with_allocators() -> Facts {
    let s = crate::host::find_allocators();
    Facts {
        allocators: s.found,
        skipped_allocators: s.skipped,
    }
}

/// A plan saved by `tune --save-plan` (or `plan --json`), checked whole
/// against this machine before anything starts.
pub fn saved_plan(path: &Path, t: &Topology) -> Result<Plan, PrepareError> {
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

/// Try every rank's binding before anything starts; on refusal stop, or
/// (`allow_unbound`) run every rank unbound and return the warning to show.
pub fn check_bindings(
    launches: &mut [RankLaunch],
    allow_unbound: bool,
) -> Result<Option<String>, PrepareError> {
    match check_placements(launches) {
        Ok(()) => Ok(None),
        Err(e) if allow_unbound => {
            for l in launches {
                l.placement = Default::default();
            }
            Ok(Some(format!("ranks run unbound ({e})")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Where torch's `@record` puts a failing rank's exception, as torchrun sets
/// it: beside the logs, or in a private directory removed when this is dropped.
pub struct ErrorFiles {
    _private: Option<tempfile::TempDir>,
    pub dir: PathBuf,
}

impl ErrorFiles {
    pub fn new(log_dir: Option<&Path>) -> Result<ErrorFiles, PrepareError> {
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
    pub fn logs(&self) -> Option<&Path> {
        self._private.is_none().then_some(self.dir.as_path())
    }

    /// Give every rank its TORCHELASTIC_ERROR_FILE, removing a previous
    /// run's record (no root cause of this one).
    pub fn assign(&self, launches: &mut [RankLaunch]) {
        for l in launches {
            let f = super::env::error_file(&self.dir, l.local_rank);
            let _ = std::fs::remove_file(&f);
            l.env
                .insert("TORCHELASTIC_ERROR_FILE".into(), f.display().to_string());
        }
    }
}

/// The line saying which of the user's variables a launch replaces, if any.
pub fn overrides_note(l: &RankLaunch, current: &dyn Fn(&str) -> Option<String>) -> Option<String> {
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

/// `bind`: the node plan every sibling under the launcher computes alike, and
/// this rank's launch of `command` (with LOCAL_RANK, LOCAL_WORLD_SIZE, RANK
/// and WORLD_SIZE added where the launcher did not set them).
pub fn bind_launch(
    mut t: Topology,
    mut req: PlanRequest,
    command: &[OsString],
    current: &dyn Fn(&str) -> Option<String>,
) -> Result<(Plan, RankLaunch), PrepareError> {
    let launcher = detect::detect(current)?;
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
    let mut extra = BTreeMap::new();
    let mut add = |k: &str, v: String| {
        if current(k).is_none() {
            extra.insert(k.to_string(), v);
        }
    };
    add("LOCAL_RANK", launcher.local_rank.to_string());
    add("LOCAL_WORLD_SIZE", launcher.local_size.to_string());
    if let Some((rank_no, world)) = launcher.global {
        add("RANK", rank_no.to_string());
        add("WORLD_SIZE", world.to_string());
    }
    if launcher.name == "Slurm" {
        let (addr, port) = detect::slurm_master(current);
        if let Some(a) = addr {
            add("MASTER_ADDR", a);
        }
        if let Some(p) = port {
            add("MASTER_PORT", p.to_string());
        }
    }
    let l = rank_launch(rank, command, extra);
    Ok((p, l))
}

/// `--dry-run`: what each rank would get. `mover`: run moves DataLoader
/// workers (bind does not).
pub fn dry_run(
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
    }
    s
}
