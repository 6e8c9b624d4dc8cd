//! The environment each rank gets: thread-count variables for every runtime
//! that reads one at start-up, the THREADWISE_* variables, the CUDA device
//! order, and the allocator preload. Never KMP_AFFINITY, and OMP_PROC_BIND
//! only when asked.

use std::collections::BTreeMap;

use super::{Allocator, AllocatorChoice, AllocatorKind, Facts, PlanError, PlanRequest, RankPlan};
use crate::topology::PciDevice;

/// Runtimes' thread-count variables, each set to the rank's thread count.
pub(crate) const THREAD_VARS: &[&str] = &[
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "FLEXIBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "NUMBA_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    // OpenCV's parallel_for pool (image decoding and augmentation) and
    // Polars' pool: each sizes itself to every CPU it sees otherwise.
    "OPENCV_FOR_THREADS_NUM",
    "POLARS_MAX_THREADS",
];

/// Pools sized from the rank's thread count by their own rule (`pool_vars`).
pub(crate) const POOL_VARS: &[&str] = &[
    "TF_NUM_INTEROP_THREADS",
    "TORCHINDUCTOR_COMPILE_THREADS",
    "THREADWISE_NUM_INTEROP_THREADS",
];

/// torch.compile's Inductor starts min(32, CPUs in its mask) compile workers
/// per rank; a rank gets as many as it has compute threads, with the same cap.
pub(crate) const INDUCTOR_MAX_COMPILE_THREADS: usize = 32;

/// The values of `POOL_VARS` for a rank of `threads` compute threads:
/// TensorFlow's inter-op pool 1 (as before); Inductor's compile workers (they
/// run while the rank waits for them, so its own share of the CPUs: ranks
/// compiling at once do not oversubscribe the node); torch's inter-op pool,
/// which reads no variable, ignores OMP_NUM_THREADS and sizes itself to the
/// CPUs in its mask (torch 2.15: 2 unbound on 2 CPUs with OMP_NUM_THREADS=1,
/// 1 under taskset -c 0), as many as the rank's threads (the Python helper's apply and spawn set it with
/// torch.set_num_interop_threads).
pub(crate) fn pool_vars(threads: usize) -> [(&'static str, String); 3] {
    let t = threads.max(1);
    [
        ("TF_NUM_INTEROP_THREADS", "1".into()),
        (
            "TORCHINDUCTOR_COMPILE_THREADS",
            t.min(INDUCTOR_MAX_COMPILE_THREADS).to_string(),
        ),
        ("THREADWISE_NUM_INTEROP_THREADS", t.to_string()),
    ]
}

/// The jemalloc options a plan sets with `allocator=jemalloc`.
pub(crate) const JEMALLOC_CONF: &str = "metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1";

/// Pick the allocator the request names among those that exist.
pub(super) fn choose_allocator(
    req: &PlanRequest,
    facts: &Facts,
    reasons: &mut Vec<String>,
) -> Result<Option<Allocator>, PlanError> {
    let find = |k: AllocatorKind| facts.allocators.iter().find(|a| a.kind == k).cloned();
    let missing = |kind: AllocatorKind, file: &str| PlanError::AllocatorMissing {
        kind: kind.to_string(),
        file: file.to_string(),
    };
    let chosen = match req.allocator {
        AllocatorChoice::None => None,
        AllocatorChoice::Jemalloc => Some(
            find(AllocatorKind::Jemalloc)
                .ok_or_else(|| missing(AllocatorKind::Jemalloc, "libjemalloc.so.2"))?,
        ),
        AllocatorChoice::Tcmalloc => Some(
            find(AllocatorKind::Tcmalloc)
                .ok_or_else(|| missing(AllocatorKind::Tcmalloc, "libtcmalloc*.so.4"))?,
        ),
        AllocatorChoice::Auto => {
            let a = find(AllocatorKind::Tcmalloc).or_else(|| find(AllocatorKind::Jemalloc));
            if a.is_none() {
                reasons.push("allocator auto: neither tcmalloc nor jemalloc is installed; glibc malloc stays".into());
            }
            a
        }
    };
    if req.allocator != AllocatorChoice::None {
        reasons.extend(facts.skipped_allocators.iter().cloned());
    }
    if let Some(a) = &chosen {
        reasons.push(format!(
            "allocator {}: LD_PRELOAD={} (owned by root or you, writable by nobody else)",
            a.kind, a.path
        ));
    }
    Ok(chosen)
}

/// The variables the plan sets for one rank (the launcher adds the torchrun ones).
pub(super) fn rank_env(
    req: &PlanRequest,
    rank: &RankPlan,
    selected: &[&PciDevice],
    own: Option<&PciDevice>,
    allocator: Option<&Allocator>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    for var in THREAD_VARS {
        set(var, rank.threads.to_string());
    }
    for (k, v) in pool_vars(rank.threads) {
        set(k, v);
    }
    set("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into());
    // In the numbering CUDA uses inside this job: a container or a devices
    // cgroup that hides GPUs shifts the indices (topology/gpus.rs).
    if let Some(slice) = own.and_then(|g| g.mig.as_ref()) {
        // A CUDA process enumerates one MIG device: each rank gets its own.
        set("CUDA_VISIBLE_DEVICES", slice.clone());
    } else if let super::GpuSelect::List(_) = req.gpus {
        let (amd, nvidia): (Vec<&&PciDevice>, Vec<&&PciDevice>) =
            selected.iter().partition(|g| g.is_amd());
        let names = |v: &[&&PciDevice]| {
            v.iter()
                .map(|g| g.visible_name())
                .collect::<Vec<_>>()
                .join(",")
        };
        if !nvidia.is_empty() {
            set("CUDA_VISIBLE_DEVICES", names(&nvidia));
        }
        if !amd.is_empty() {
            set("HIP_VISIBLE_DEVICES", names(&amd));
        }
    }
    if req.omp_bind {
        set("OMP_PROC_BIND", "close".into());
        set("OMP_PLACES", "cores".into());
    }
    match req.omp_wait {
        super::WaitPolicy::Default => {}
        super::WaitPolicy::Active => {
            set("OMP_WAIT_POLICY", "ACTIVE".into());
            set("KMP_BLOCKTIME", "200".into());
        }
        super::WaitPolicy::Passive => {
            set("OMP_WAIT_POLICY", "PASSIVE".into());
            set("GOMP_SPINCOUNT", "0".into());
            set("KMP_BLOCKTIME", "0".into());
        }
    }
    set("THREADWISE_CPUS", rank.cpus.to_string());
    if let Some(l) = &rank.roles {
        // For the Python helper, which places the threads it knows.
        set("THREADWISE_SERVICE_CPUS", l.service.to_string());
        set("THREADWISE_TEAM_CPUS", l.team.to_string());
    }
    set("THREADWISE_NUM_THREADS", rank.threads.to_string());
    set("THREADWISE_NUM_WORKERS", rank.workers.to_string());
    set("THREADWISE_WORKER_CPUS", rank.worker_cpus.to_string());
    let nodes: Vec<String> = rank.mem_nodes.iter().map(usize::to_string).collect();
    set("THREADWISE_NUMA_NODES", nodes.join(","));
    if let Some(gpu) = &rank.gpu {
        set("THREADWISE_GPU", gpu.clone());
    }
    if let Some(uuid) = own.and_then(|g| g.mig.as_ref().or(g.uuid.as_ref())) {
        set("THREADWISE_GPU_UUID", uuid.clone());
    }
    if let Some(a) = allocator {
        set("LD_PRELOAD", a.path.clone());
        if a.kind == AllocatorKind::Jemalloc {
            // Keep freed pages for reuse, as glibc and tcmalloc do with a
            // training step's allocations: jemalloc's default decay (and its
            // immediate purge of blocks over 8 MiB) hands them back to the
            // kernel, and every step faults them in again. Measured on the
            // PyTorch example: 1.67M minor faults per rank with
            // background_thread:true,metadata_thp:auto (what torch's run_cpu
            // sets, oversize_threshold:1 or not), 0.18M with the decay off.
            set("MALLOC_CONF", JEMALLOC_CONF.into());
        }
    }
    env
}
