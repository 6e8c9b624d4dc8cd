//! The planner: a pure function from (Topology, PlanRequest, Facts) to a Plan
//! saying, for each local rank, which CPUs, memory nodes, GPU, thread and
//! DataLoader worker counts and environment it gets, and why. No I/O, no clock:
//! everything it needs from the host (which allocator libraries exist) comes in
//! through `Facts`, so it can be tested on any machine and any topology.

mod env;
mod place;
mod request;
mod roles;
mod sizing;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub(crate) use env::{JEMALLOC_CONF, POOL_VARS, THREAD_VARS};
pub(crate) use request::{
    Allocator, AllocatorChoice, AllocatorKind, Amount, MemPolicy, Policy, Profile, Reserve,
    WaitPolicy,
};
pub use request::{GpuSelect, NProc, PlanRequest};

use crate::cpuset::CpuSet;
use crate::topology::{PciDevice, Topology};

pub(crate) const PLAN_SCHEMA: &str = "threadwise.plan/1";

/// What the planner needs to know about the host besides the topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// Allocator libraries found on this machine, in preference order per kind.
    pub allocators: Vec<Allocator>,
    /// Allocator files passed over, with the reason (said when one is asked for).
    pub skipped_allocators: Vec<String>,
}

/// Requests the planner cannot satisfy, each naming what is short.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("no CPU is allowed for this process (allowed set is empty)")]
    EmptyAllowed,
    #[error("--reserve {reserve} keeps every allowed CPU ({cpus}): nothing is left for the ranks")]
    ReservedAll { reserve: String, cpus: String },
    #[error("--nproc-per-node must be at least 1")]
    ZeroRanks,
    #[error("{ranks} ranks need {ranks} {unit}s but only {have} are allowed ({cpus})")]
    TooFewCpus {
        ranks: usize,
        have: usize,
        unit: &'static str,
        cpus: String,
    },
    #[error("GPU {index} does not exist: {count} GPUs are visible{list}")]
    NoSuchGpu {
        index: usize,
        count: usize,
        list: String,
    },
    #[error("--nproc-per-node gpu: no GPU is visible")]
    NoGpus,
    #[error("{ranks} ranks but only {gpus} GPUs are selected")]
    TooFewGpus { ranks: usize, gpus: usize },
    #[error("--allocator {kind}: no {file} found in the library directories")]
    AllocatorMissing { kind: String, file: String },
}

impl PlanError {
    /// What the user can do about it.
    pub fn advice(&self) -> &'static str {
        match self {
            PlanError::EmptyAllowed => {
                "check the cgroup cpuset and the affinity mask (threadwise topo)"
            }
            PlanError::ReservedAll { .. } => "reserve fewer cores (--reserve 1) or none",
            PlanError::ZeroRanks => "give -n N with N >= 1, or -n auto",
            PlanError::TooFewCpus { .. } => {
                "run fewer ranks, use --smt to count SMT siblings, or --oversubscribe to share cores"
            }
            PlanError::NoSuchGpu { .. } => {
                "list GPUs by their index in PCI bus order (threadwise topo)"
            }
            PlanError::NoGpus => "use -n N with --gpus none for CPU-only ranks",
            PlanError::TooFewGpus { .. } => {
                "run one rank per GPU, use --gpus none for CPU-only ranks, or --oversubscribe to share GPUs"
            }
            PlanError::AllocatorMissing { .. } => {
                "install it (apt-get install libjemalloc2 / libgoogle-perftools4) or use --allocator auto"
            }
        }
    }
}

impl PlanError {
    /// `hint`, with what the place it runs in adds: inside an srun step
    /// (one CPU per task unless asked), too few CPUs names `--cpus-per-task`.
    pub fn hint_here(&self, in_srun_step: bool) -> String {
        match self {
            PlanError::TooFewCpus { .. } if in_srun_step => format!(
                "{}; under srun each task gets one CPU unless asked: give the step more with \
                 srun --cpus-per-task=N (-c N)",
                self.advice()
            ),
            e => e.advice().to_string(),
        }
    }
}

/// One local rank's slice of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    pub local_rank: usize,
    /// CPUs this rank is bound to (all allowed CPUs when the policy is none).
    pub cpus: CpuSet,
    /// Whether `cpus` should be applied as an affinity mask.
    pub bind: bool,
    /// Physical cores in `cpus`.
    pub cores: usize,
    /// CPUs DataLoader workers may use (THREADWISE_WORKER_CPUS).
    pub worker_cpus: CpuSet,
    pub mem_policy: MemPolicy,
    pub mem_nodes: Vec<usize>,
    /// PCI bus id of the rank's GPU.
    pub gpu: Option<String>,
    /// The GPU's UUID, or its MIG slice's (`MIG-...`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    /// The GPU's CUDA ordinal as the rank sees it (cuda:N).
    pub gpu_ordinal: Option<usize>,
    pub threads: usize,
    pub workers: usize,
    /// Where each role's threads run (`--roles`, where the rank has the
    /// cores for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<crate::roles::RoleCpus>,
    pub env: BTreeMap<String, String>,
    pub reasons: Vec<String>,
}

/// The whole node's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub schema: String,
    pub request: PlanRequest,
    pub source: String,
    pub allowed_cpus: CpuSet,
    pub cpu_budget: f64,
    pub nproc: usize,
    pub allocator: Option<Allocator>,
    pub ranks: Vec<RankPlan>,
    /// Decisions that concern every rank.
    pub reasons: Vec<String>,
    /// Variables to remove from the ranks' environment (a tuned "threads unset" plan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unset_env: Vec<String>,
}

impl Plan {
    /// The GPUs its ranks use (PCI bus ids), each once, sorted.
    pub fn gpus(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ranks.iter().filter_map(|r| r.gpu.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Everything a plan read from a file must hold before anything starts
    /// (`run --plan`): ranks 0..n once each, as many as `nproc`, memory nodes
    /// that can exist, environment names a process can have.
    pub fn validate(&self) -> Result<(), String> {
        if self.schema != PLAN_SCHEMA {
            return Err(format!("schema {:?}, expected {PLAN_SCHEMA}", self.schema));
        }
        if self.ranks.is_empty() {
            return Err("it has no ranks".into());
        }
        if self.ranks.len() != self.nproc {
            return Err(format!(
                "nproc is {} but it lists {} ranks",
                self.nproc,
                self.ranks.len()
            ));
        }
        if self.nproc > crate::cpuset::MAX_CPU {
            return Err(format!(
                "{} ranks: at most {}",
                self.nproc,
                crate::cpuset::MAX_CPU
            ));
        }
        for (i, r) in self.ranks.iter().enumerate() {
            if r.local_rank != i {
                return Err(format!(
                    "ranks[{i}] has local_rank {}: ranks must be 0..{} in order, once each",
                    r.local_rank, self.nproc
                ));
            }
            if let Some(n) = r
                .mem_nodes
                .iter()
                .find(|n| **n >= crate::topology::MAX_NODES)
            {
                return Err(format!("rank {i}: memory node {n} cannot exist"));
            }
            if r.bind && r.cpus.is_empty() {
                return Err(format!("rank {i}: bound to no CPU"));
            }
            let names = r.env.keys().chain(self.unset_env.iter());
            for k in names {
                if k.is_empty() || k.contains(['=', '\0', '\n']) {
                    return Err(format!(
                        "rank {i}: {k:?} is not an environment variable name"
                    ));
                }
            }
            if let Some((k, _)) = r.env.iter().find(|(_, v)| v.contains('\0')) {
                return Err(format!("rank {i}: the value of {k} holds a NUL byte"));
            }
        }
        Ok(())
    }

    /// What the user has without threadwise (tune's "unset" baseline): no
    /// thread-count variable (each runtime sizes its pool to all CPUs), no
    /// THREADWISE_* variable (a script falls back to its own defaults, as
    /// under torchrun), nothing else of the plan.
    fn unset_threads(&mut self) {
        let mut vars: Vec<String> = THREAD_VARS
            .iter()
            .chain(POOL_VARS)
            .map(|v| v.to_string())
            .collect();
        for rank in &mut self.ranks {
            for k in rank.env.keys() {
                if k.starts_with("THREADWISE_") && !vars.contains(k) {
                    vars.push(k.clone());
                }
            }
            rank.env.clear();
            rank.bind = false;
        }
        self.unset_env = vars;
    }
}

/// The GPUs the request selects, in the order ranks take them.
fn select_gpus<'t>(topo: &'t Topology, req: &PlanRequest) -> Result<Vec<&'t PciDevice>, PlanError> {
    match &req.gpus {
        GpuSelect::None => Ok(vec![]),
        GpuSelect::Auto => Ok(topo.gpus.iter().collect()),
        GpuSelect::List(list) => list
            .iter()
            .map(|&i| {
                topo.gpus.get(i).ok_or_else(|| PlanError::NoSuchGpu {
                    index: i,
                    count: topo.gpus.len(),
                    list: if topo.gpus.is_empty() {
                        String::new()
                    } else {
                        format!(" (0-{})", topo.gpus.len() - 1)
                    },
                })
            })
            .collect(),
    }
}

/// `-n auto`: one rank per GPU (`gpus` of them), else one per NUMA node with
/// allowed CPUs. doctor's default is the same, so it checks what run starts.
pub(crate) fn auto_ranks(topo: &Topology, gpus: usize) -> usize {
    if gpus > 0 {
        gpus
    } else {
        topo.cpu_nodes().count().max(1)
    }
}

fn rank_count(
    topo: &Topology,
    req: &PlanRequest,
    gpus: usize,
) -> Result<(usize, String), PlanError> {
    let n = match req.nproc {
        NProc::Count(0) => return Err(PlanError::ZeroRanks),
        NProc::Count(n) => (n, format!("{n} ranks requested")),
        NProc::Gpu if gpus == 0 => return Err(PlanError::NoGpus),
        NProc::Gpu => (gpus, format!("{gpus} ranks: one per GPU")),
        NProc::Auto if gpus > 0 => (gpus, format!("{gpus} ranks: one per visible GPU")),
        NProc::Cpu => {
            let k = topo.allowed_cpus.len();
            (
                k,
                format!(
                    "{k} ranks: one per allowed CPU, SMT siblings counted (torchrun's cpu \
                     counts every online CPU, os.cpu_count(): {})",
                    topo.online_cpus.len()
                ),
            )
        }
        NProc::Auto => {
            let k = auto_ranks(topo, 0);
            (
                k,
                format!("{k} ranks: one per NUMA node with allowed CPUs (no GPU)"),
            )
        }
    };
    if gpus > 0 && n.0 > gpus && !req.oversubscribe {
        return Err(PlanError::TooFewGpus { ranks: n.0, gpus });
    }
    Ok(n)
}

/// Plan the local ranks of one node.
/// The CPUs `--reserve` keeps out: the first N allowed cores of each node, or a list.
fn reserved(topo: &Topology, r: &Reserve) -> CpuSet {
    match r {
        Reserve::None => CpuSet::new(),
        Reserve::Cpus(c) => c.intersection(&topo.allowed_cpus),
        Reserve::PerNode(n) => {
            let mut out = CpuSet::new();
            for node in &topo.numa_nodes {
                let mut cores: Vec<CpuSet> = topo
                    .cores
                    .iter()
                    .map(|c| {
                        c.cpus
                            .intersection(&topo.allowed_cpus)
                            .intersection(&node.cpus)
                    })
                    .filter(|c| !c.is_empty())
                    .collect();
                cores.sort_by_key(|c| c.first());
                for c in cores.iter().take(*n) {
                    out = out.union(c);
                }
            }
            out
        }
    }
}

pub fn plan(topo: &Topology, req: &PlanRequest, facts: &Facts) -> Result<Plan, PlanError> {
    // --reserve: plan on what is left, and say what was kept out.
    let kept = reserved(topo, &req.reserve);
    let narrowed;
    let topo = if kept.is_empty() {
        topo
    } else {
        let mut t = topo.clone();
        t.allowed_cpus = t.allowed_cpus.difference(&kept);
        t.cpu_budget = t.cpu_budget.min(t.allowed_cpus.len() as f64);
        narrowed = t;
        &narrowed
    };
    if topo.allowed_cpus.is_empty() {
        return Err(if kept.is_empty() {
            PlanError::EmptyAllowed
        } else {
            PlanError::ReservedAll {
                reserve: req.reserve.to_string(),
                cpus: kept.to_string(),
            }
        });
    }
    let selected = select_gpus(topo, req)?;
    let (n, why_n) = rank_count(topo, req, selected.len())?;
    let mut reasons = vec![why_n];
    gpu_and_reserve_reasons(topo, req, &selected, &kept, &mut reasons);
    // Rank i drives the i-th selected GPU (cuda:LOCAL_RANK), shared round-robin
    // only when --oversubscribe asked for more ranks than GPUs.
    let rank_gpus: Vec<Option<&PciDevice>> = (0..n)
        .map(|i| (!selected.is_empty()).then(|| selected[i % selected.len()]))
        .collect();
    let slices = place::place(topo, req, &rank_gpus, &mut reasons)?;
    let allocator = env::choose_allocator(req, facts, &mut reasons)?;
    let ranks: Vec<RankPlan> = slices
        .into_iter()
        .enumerate()
        .map(|(i, slice)| {
            let mut rank = rank_plan(topo, req, i, slice, rank_gpus[i], &selected, n);
            roles::place_roles(topo, req, &mut rank);
            rank.env = env::rank_env(req, &rank, &selected, rank_gpus[i], allocator.as_ref());
            rank
        })
        .collect();
    omp_reasons(req, &mut reasons);
    reasons.push(pools_reason(&ranks));
    let mut p = Plan {
        schema: PLAN_SCHEMA.to_string(),
        request: req.clone(),
        source: topo.source.clone(),
        allowed_cpus: topo.allowed_cpus.clone(),
        cpu_budget: topo.cpu_budget,
        nproc: n,
        allocator,
        ranks,
        reasons,
        unset_env: vec![],
    };
    if req.unset_threads {
        p.unset_threads();
        p.reasons.push(
            "threads unset, as without threadwise: no thread-count or THREADWISE_* variable \
             (each runtime sizes its pool to every CPU), no binding, no allocator"
                .into(),
        );
    }
    Ok(p)
}

/// What the node's reasons say of the job's GPUs and of --reserve.
fn gpu_and_reserve_reasons(
    topo: &Topology,
    req: &PlanRequest,
    selected: &[&PciDevice],
    kept: &CpuSet,
    reasons: &mut Vec<String>,
) {
    if let Some(a) = &topo.gpu_access
        && a.usable < a.on_bus
    {
        reasons.push(format!(
            "GPUs: this job may use {} of the {} on the PCI bus (threadwise topo shows the evidence); \
             CUDA_VISIBLE_DEVICES is written in the job's own numbering",
            a.usable, a.on_bus
        ));
    }
    if selected.iter().any(|g| g.mig.is_some()) {
        reasons.push(
            "MIG: each rank's CUDA_VISIBLE_DEVICES names its own slice (a CUDA process \
             enumerates one MIG device), so every rank uses cuda:0"
                .into(),
        );
    }
    if !kept.is_empty() {
        reasons.push(format!(
            "--reserve {}: CPUs {kept} are kept for the OS, IRQs and the launcher; {}",
            req.reserve,
            if req.policy == Policy::None {
                "policy none binds nothing, so only the thread budget shrinks"
            } else {
                "no rank is bound to them"
            }
        ));
    }
}

/// Rank `i`'s plan from its slice and GPU (its environment is added after).
fn rank_plan(
    topo: &Topology,
    req: &PlanRequest,
    i: usize,
    slice: place::Slice,
    gpu: Option<&PciDevice>,
    selected: &[&PciDevice],
    n: usize,
) -> RankPlan {
    let mut rank_reasons = slice.reasons.clone();
    let size = sizing::size(topo, req, &slice, gpu.is_some(), n, &mut rank_reasons);
    let mem_nodes: Vec<usize> = if req.mem == MemPolicy::None {
        vec![]
    } else {
        place::nodes_of(topo, &slice.cpus)
    };
    // A MIG slice is the only device its rank sees: cuda:0.
    let gpu_ordinal = gpu.and_then(|g| {
        if g.mig.is_some() {
            Some(0)
        } else {
            selected
                .iter()
                .position(|s| s.bus_id == g.bus_id && s.mig.is_none())
        }
    });
    RankPlan {
        local_rank: i,
        cpus: slice.cpus,
        bind: slice.bind,
        cores: slice.cores,
        worker_cpus: size.worker_cpus,
        mem_policy: req.mem,
        mem_nodes,
        gpu: gpu.map(|g| g.bus_id.clone()),
        gpu_uuid: gpu.and_then(|g| g.mig.clone().or_else(|| g.uuid.clone())),
        gpu_ordinal,
        threads: size.threads,
        workers: size.workers,
        roles: None,
        env: BTreeMap::new(),
        reasons: rank_reasons,
    }
}

/// Why the pools besides OpenMP's get the sizes they do.
fn pools_reason(ranks: &[RankPlan]) -> String {
    let compile: Vec<usize> = ranks
        .iter()
        .map(|r| r.threads.clamp(1, env::INDUCTOR_MAX_COMPILE_THREADS))
        .collect();
    let total: usize = compile.iter().sum();
    format!(
        "other pools fit each rank's threads: torch.compile's compile workers \
         TORCHINDUCTOR_COMPILE_THREADS (Inductor would start min(32, CPUs in the mask) per rank; \
         here {total} in all, one per compute thread), OpenCV's and Polars' pools \
         (OPENCV_FOR_THREADS_NUM, POLARS_MAX_THREADS), and torch's inter-op pool \
         (THREADWISE_NUM_INTEROP_THREADS: torch reads no variable for it, ignores OMP_NUM_THREADS \
         and sizes it to the CPUs in its mask, so threadwise.apply()/spawn() in the script set it)"
    )
}

/// What the OpenMP wait and bind options mean, said when asked for.
fn omp_reasons(req: &PlanRequest, reasons: &mut Vec<String>) {
    match req.omp_wait {
        WaitPolicy::Default => {}
        WaitPolicy::Active => reasons.push(
            "OpenMP threads spin while idle (OMP_WAIT_POLICY=ACTIVE, KMP_BLOCKTIME=200): \
             lowest latency when each thread has its own core, costly when they share"
                .into(),
        ),
        WaitPolicy::Passive => reasons.push(
            "OpenMP threads sleep at once when idle (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0, \
             KMP_BLOCKTIME=0): the CPU goes to DataLoader workers and other ranks"
                .into(),
        ),
    }
    if req.omp_bind {
        reasons.push(
            "OMP_PROC_BIND/OMP_PLACES set as asked: the main thread is then pinned to one \
             core and DataLoader workers forked from it inherit that one-core mask"
                .to_string(),
        );
    }
}

impl crate::error::Hinted for PlanError {
    /// Under srun, a step's one CPU per task is named as the likely cause.
    fn hint(&self) -> String {
        self.hint_here(crate::topology::probe::in_srun_step())
    }
    fn kind(&self) -> crate::error::Kind {
        crate::error::Kind::Usage
    }
}

#[cfg(test)]
mod tests;
