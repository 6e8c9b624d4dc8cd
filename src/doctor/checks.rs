//! Checks of the environment and the process: thread variables, container
//! limits, the network for multi-node jobs, allocators, tools, GPUs.

use super::sys::{Limit, Sys};
use super::{Area, Finding, Request, Severity};
use crate::topology::Topology;

const MIB: u64 = 1 << 20;

/// The ranks the user means: asked for, else what `run -n auto` starts (one
/// per GPU, else one per NUMA node with allowed CPUs).
pub(super) fn ranks(topo: &Topology, req: &Request) -> usize {
    req.nproc
        .unwrap_or_else(|| crate::plan::auto_ranks(topo, topo.gpus.len()))
}

pub(super) fn threads(sys: &dyn Sys, topo: &Topology, req: &Request, out: &mut Vec<Finding>) {
    out.push(omp_num_threads(sys, topo, ranks(topo, req)));
    out.extend(cpu0_trap(sys));
}

/// OMP_NUM_THREADS against `n` ranks on the CPU budget.
fn omp_num_threads(sys: &dyn Sys, topo: &Topology, n: usize) -> Finding {
    let budget = topo.cpu_budget;
    let cpus = topo.allowed_cpus.len();
    match sys.env("OMP_NUM_THREADS") {
        None => {
            let sev = if n > 1 {
                Severity::Warn
            } else {
                Severity::Info
            };
            let per = ((budget / n as f64).floor() as usize).max(1);
            Finding::new(
                    "threads.unset",
                    Area::Threads,
                    sev,
                    format!(
                        "OMP_NUM_THREADS is unset: each of {n} rank(s) sizes its OpenMP/MKL pool to all {cpus} CPUs"
                    ),
                )
                .evidence(format!(
                    "{n} rank(s) x {cpus} threads on a budget of {budget:.2} CPUs"
                ))
                .fix(format!(
                    "threadwise run -n {n} -- CMD   # sets it per rank; or: export OMP_NUM_THREADS={per} MKL_NUM_THREADS={per}"
                ))
        }
        Some(v) => match v.trim().parse::<usize>() {
            Ok(t) if t >= 1 => {
                let busy = t * n;
                if busy as f64 > budget * 1.01 {
                    let per = ((budget / n as f64).floor() as usize).max(1);
                    Finding::new(
                        "threads.oversubscribed",
                        Area::Threads,
                        Severity::Warn,
                        format!(
                            "{n} rank(s) x OMP_NUM_THREADS={t} = {busy} threads on {budget:.2} CPUs"
                        ),
                    )
                    .evidence(format!("OMP_NUM_THREADS={v}"))
                    .fix(format!(
                        "export OMP_NUM_THREADS={per} MKL_NUM_THREADS={per}"
                    ))
                } else {
                    Finding::new(
                        "threads.set",
                        Area::Threads,
                        Severity::Ok,
                        format!("OMP_NUM_THREADS={t} fits {n} rank(s) on {budget:.2} CPUs"),
                    )
                    .evidence(format!("OMP_NUM_THREADS={v}"))
                }
            }
            _ => Finding::new(
                "threads.invalid",
                Area::Threads,
                Severity::Fail,
                "OMP_NUM_THREADS is not a positive number: OpenMP ignores it and uses every CPU",
            )
            .evidence(format!("OMP_NUM_THREADS={v:?}"))
            .fix("export OMP_NUM_THREADS=1   # or unset it and use threadwise run"),
        },
    }
}

/// A variable that pins the main thread to one CPU at `import torch`.
fn cpu0_trap(sys: &dyn Sys) -> Option<Finding> {
    // Variables that pin the main thread at `import torch`: DataLoader workers
    // inherit its one-CPU mask (PyTorch #107366, #101850).
    let traps: Vec<String> = ["KMP_AFFINITY", "GOMP_CPU_AFFINITY", "OMP_PROC_BIND"]
        .iter()
        .filter_map(|k| {
            let v = sys.env(k)?;
            let pins = match *k {
                "OMP_PROC_BIND" => !matches!(v.trim().to_lowercase().as_str(), "" | "false"),
                _ => !v.trim().is_empty() && !v.contains("disabled"),
            };
            pins.then(|| format!("{k}={v}"))
        })
        .collect();
    if traps.is_empty() {
        return None;
    }
    let unset: Vec<&str> = traps.iter().filter_map(|t| t.split('=').next()).collect();
    Some(
        Finding::new(
            "threads.cpu0-trap",
            Area::Threads,
            Severity::Warn,
            "a thread-affinity variable pins the main thread to one CPU at import torch; \
                 DataLoader workers inherit that one-CPU mask",
        )
        .evidence(traps.join(" "))
        .fix(format!(
            "unset {}   # threadwise binds each rank to its cores instead",
            unset.join(" ")
        )),
    )
}

fn shm_need(topo: &Topology, req: &Request) -> u64 {
    // A DataLoader batch in flight per worker, prefetch 2: ~128 MiB a worker.
    (ranks(topo, req) as u64)
        .saturating_mul(req.workers.unwrap_or(4).max(1) as u64)
        .saturating_mul(128 * MIB)
}

pub(super) fn container(sys: &dyn Sys, topo: &Topology, req: &Request, out: &mut Vec<Finding>) {
    cpu_limits(topo, out);
    out.extend(shm(sys, topo, req));
    rlimits(sys, topo, out);
}

/// The cgroup's CPU quota and cpuset, and GPUs the cpuset keeps away from.
fn cpu_limits(topo: &Topology, out: &mut Vec<Finding>) {
    let visible = topo.allowed_cpus.len();
    if let Some(q) = topo.limits.cpu_quota
        && q + 0.01 < visible as f64
    {
        out.push(
            Finding::new(
                "container.cpu-quota",
                Area::Container,
                Severity::Warn,
                format!(
                    "the cgroup CPU quota is {q:.2} CPUs but {visible} CPUs are visible: \
                     os.cpu_count() and PyTorch's defaults size pools for {visible}"
                ),
            )
            .evidence(format!(
                "quota {q:.2} CPUs ({}), cpuset {}",
                topo.limits.cgroup_path.as_deref().unwrap_or("?"),
                topo.allowed_cpus
            ))
            .fix("threadwise run -n N -- CMD   # sizes threads to the budget; or raise the quota (docker --cpus)"),
        );
    }
    if topo.allowed_cpus != topo.online_cpus {
        out.push(
            Finding::new(
                "container.cpuset",
                Area::Container,
                Severity::Info,
                format!(
                    "this process may use {} of {} online CPUs",
                    topo.allowed_cpus.len(),
                    topo.online_cpus.len()
                ),
            )
            .evidence(format!(
                "allowed {}, online {}",
                topo.allowed_cpus, topo.online_cpus
            )),
        );
        for g in &topo.gpus {
            let Some(node) = g.numa_node else { continue };
            let Some(n) = topo.numa_nodes.iter().find(|n| n.id == node) else {
                continue;
            };
            if !n.cpus.is_empty() && !n.cpus.intersects(&topo.allowed_cpus) {
                out.push(
                    Finding::new(
                        "container.cpuset-gpu-node",
                        Area::Container,
                        Severity::Warn,
                        format!(
                            "GPU {} sits on NUMA node {node}, but the cpuset allows none of its CPUs: \
                             its rank feeds it across the interconnect",
                            g.bus_id
                        ),
                    )
                    .evidence(format!("node {node} cpus {}, allowed {}", n.cpus, topo.allowed_cpus))
                    .fix(format!("give the job CPUs of node {node} (docker --cpuset-cpus, Slurm --cpu-bind)")),
                );
            }
        }
    }
}

/// /dev/shm against what the DataLoader workers need.
fn shm(sys: &dyn Sys, topo: &Topology, req: &Request) -> Option<Finding> {
    let size = sys.fs_size("/dev/shm")?;
    let need = shm_need(topo, req);
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    let (sev, title) = if size <= 64 * MIB {
        (
            Severity::Fail,
            format!(
                "/dev/shm is {} MiB (Docker's default): DataLoader workers die with a bus error",
                size / MIB
            ),
        )
    } else if size < need {
        (
            Severity::Warn,
            format!(
                "/dev/shm is {}; {} DataLoader workers want about {}",
                gib(size),
                need / (128 * MIB),
                gib(need)
            ),
        )
    } else {
        (Severity::Ok, format!("/dev/shm is {}", gib(size)))
    };
    let mut f = Finding::new("container.shm", Area::Container, sev, title)
        .evidence(format!("statvfs(/dev/shm): {size} bytes"));
    if sev != Severity::Ok {
        f = f.fix(format!(
            "docker run --shm-size={0}g ...   # or: mount -o remount,size={0}G /dev/shm",
            need.div_ceil(1 << 30).max(1)
        ));
    }
    Some(f)
}

/// Open files and locked memory.
fn rlimits(sys: &dyn Sys, topo: &Topology, out: &mut Vec<Finding>) {
    if let Some((soft, hard)) = sys.rlimit(Limit::OpenFiles)
        && soft < 4096
    {
        out.push(
            Finding::new(
                "container.open-files",
                Area::Container,
                Severity::Warn,
                format!(
                    "at most {soft} open files: DataLoader workers pass tensors as file descriptors \
                     and run out (\"received 0 items of ancdata\")"
                ),
            )
            .evidence(format!("RLIMIT_NOFILE soft {soft}, hard {hard}"))
            .fix(format!("ulimit -n {}", hard.clamp(4096, 1 << 20))),
        );
    }
    let rdma = topo.nics.iter().any(|n| n.vendor == "0x15b3");
    if let Some((soft, _)) = sys.rlimit(Limit::LockedMemory)
        && (rdma || !topo.gpus.is_empty())
        && soft != u64::MAX
        && soft < 64 * MIB
    {
        out.push(
            Finding::new(
                "container.locked-memory",
                Area::Container,
                Severity::Warn,
                format!(
                    "locked memory is limited to {} KiB: pin_memory and RDMA (NCCL over InfiniBand) need more",
                    soft / 1024
                ),
            )
            .evidence(format!("RLIMIT_MEMLOCK soft {soft} bytes"))
            .fix("ulimit -l unlimited   # docker: --ulimit memlock=-1"),
        );
    }
}

pub(super) fn network(sys: &dyn Sys, topo: &Topology, req: &Request, out: &mut Vec<Finding>) {
    let multi = req.rdzv_endpoint.is_some();
    if let Some(v) = sys.read("/proc/sys/net/core/somaxconn")
        && let Ok(n) = v.trim().parse::<u64>()
        && n < 4096
    {
        out.push(
            Finding::new(
                "network.somaxconn",
                Area::Network,
                if multi { Severity::Warn } else { Severity::Info },
                format!(
                    "net.core.somaxconn is {n}: the rendezvous store's listen queue overflows when many ranks connect at once"
                ),
            )
            .evidence(format!("/proc/sys/net/core/somaxconn = {n}"))
            .sysctl("net.core.somaxconn", "4096"),
        );
    }
    if let Some(ep) = &req.rdzv_endpoint {
        let f = match crate::netif::Endpoint::parse(ep) {
            Err(_) => Finding::new(
                "network.rdzv",
                Area::Network,
                Severity::Fail,
                format!("--rdzv-endpoint {ep:?} is not HOST:PORT"),
            )
            .fix("--rdzv-endpoint node0:29400"),
            Ok(to) => match sys.resolve(to.host(), to.port()) {
                Ok(()) => Finding::new(
                    "network.rdzv",
                    Area::Network,
                    Severity::Ok,
                    format!("the rendezvous host {} resolves", to.host()),
                ),
                Err(e) => Finding::new(
                    "network.rdzv",
                    Area::Network,
                    Severity::Fail,
                    format!(
                        "the rendezvous host {} does not resolve: every node would wait, then time out",
                        to.host()
                    ),
                )
                .evidence(e)
                .fix("use an address every node can reach, or add the name to DNS or /etc/hosts"),
            },
        };
        out.push(f);
    }
    ifname_route(sys, req, out);
    if topo.nics.len() > 1
        && sys.env("NCCL_SOCKET_IFNAME").is_none()
        && sys.env("GLOO_SOCKET_IFNAME").is_none()
    {
        out.push(
            Finding::new(
                "network.ifname",
                Area::Network,
                if multi { Severity::Warn } else { Severity::Info },
                format!(
                    "{} network devices and neither NCCL_SOCKET_IFNAME nor GLOO_SOCKET_IFNAME is set: \
                     the libraries may pick the slow or unreachable one",
                    topo.nics.len()
                ),
            )
            .evidence(
                topo.nics
                    .iter()
                    .map(|n| n.bus_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .fix("export NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0   # the interface the nodes share"),
        );
    }
}

/// GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME against the interface that
/// reaches the rendezvous host (--rdzv-endpoint, else MASTER_ADDR).
fn ifname_route(sys: &dyn Sys, req: &Request, out: &mut Vec<Finding>) {
    let host = req
        .rdzv_endpoint
        .as_deref()
        .and_then(|e| crate::netif::Endpoint::parse(e).ok())
        .map(|e| e.host().to_string())
        .or_else(|| sys.env("MASTER_ADDR"));
    let Some(host) = host else { return };
    let Some(via) = sys.route(&host) else { return };
    for var in crate::netif::IFNAME_VARS {
        let Some(v) = sys.env(var) else { continue };
        let id = format!("network.{}", var.to_lowercase());
        out.push(match crate::netif::decide(var, &via, Some(&v)) {
            Err(why) => Finding::new(&id, Area::Network, Severity::Warn, why)
                .evidence(format!("{host} is routed through {via}; {var}={v}"))
                .fix(format!("export {var}={via}")),
            Ok(_) => Finding::new(
                &id,
                Area::Network,
                Severity::Ok,
                format!("{var}={v} reaches the rendezvous host {host}"),
            ),
        });
    }
}

/// Why an LD_PRELOAD entry will not load, or None.
fn preload_problem(sys: &dyn Sys, entry: &str) -> Option<String> {
    let head = match sys.head(std::path::Path::new(entry)) {
        Ok(h) => h,
        Err(e) => return Some(e),
    };
    if head.len() < 18 || &head[..4] != b"\x7fELF" {
        return Some("not an ELF file".into());
    }
    let e_type = u16::from_le_bytes([head[16], head[17]]);
    (e_type != 3).then(|| "an ELF file, but not a shared object".into())
}

/// Whether jemalloc options keep freed pages for reuse: dirty pages are never
/// purged (`dirty_decay_ms:-1`) or only after a minute or more.
fn jemalloc_keeps_pages(conf: &str) -> bool {
    conf.split(',').any(|opt| {
        opt.trim()
            .strip_prefix("dirty_decay_ms:")
            .and_then(|v| v.parse::<i64>().ok())
            .is_some_and(|ms| ms == -1 || ms >= 60_000)
    })
}

pub(super) fn allocator(sys: &dyn Sys, out: &mut Vec<Finding>) {
    preload(sys, out);
    installed(sys, out);
}

/// LD_PRELOAD: libraries that will not load, and jemalloc handing pages back.
fn preload(sys: &dyn Sys, out: &mut Vec<Finding>) {
    if let Some(pre) = sys.env("LD_PRELOAD") {
        for entry in pre.split([' ', ':']).filter(|e| !e.is_empty()) {
            if let Some(why) = preload_problem(sys, entry) {
                out.push(
                    Finding::new(
                        "allocator.preload",
                        Area::Allocator,
                        Severity::Fail,
                        format!(
                            "LD_PRELOAD names {entry}, which will not load: ld.so prints an error and \
                             the run silently uses glibc malloc"
                        ),
                    )
                    .evidence(format!("{entry}: {why}"))
                    .fix("threadwise run --allocator auto -- CMD   # preloads one that exists; or fix LD_PRELOAD"),
                );
            }
        }
    }
    if let Some(entry) = sys.env("LD_PRELOAD").and_then(|pre| {
        pre.split([' ', ':'])
            .find(|e| {
                e.rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("libjemalloc"))
            })
            .map(str::to_string)
    }) && !jemalloc_keeps_pages(sys.env("MALLOC_CONF").as_deref().unwrap_or(""))
    {
        out.push(
            Finding::new(
                "allocator.jemalloc-decay",
                Area::Allocator,
                Severity::Warn,
                "jemalloc hands freed pages back to the kernel, so every training step faults them in \
                 again (PyTorch example here: 1.67M minor faults per rank instead of 0.18M, about 25% slower)",
            )
            .evidence(format!(
                "LD_PRELOAD={entry}, MALLOC_CONF={}",
                sys.env("MALLOC_CONF").unwrap_or_else(|| "(unset)".into())
            ))
            .fix(format!(
                "export MALLOC_CONF={}   # or threadwise run --allocator jemalloc -- CMD",
                crate::plan::JEMALLOC_CONF
            )),
        );
    }
}

/// The allocators installed, and those not safe to preload.
fn installed(sys: &dyn Sys, out: &mut Vec<Finding>) {
    let s = sys.allocators();
    if s.found.is_empty() {
        out.push(
            Finding::new(
                "allocator.installed",
                Area::Allocator,
                Severity::Info,
                "neither tcmalloc nor jemalloc is installed (tcmalloc was 3-8% faster here)",
            )
            .fix("apt-get install libgoogle-perftools4 libjemalloc2"),
        );
    } else {
        let list: Vec<String> = s
            .found
            .iter()
            .map(|a| format!("{} {}", a.kind, a.path))
            .collect();
        out.push(
            Finding::new(
                "allocator.installed",
                Area::Allocator,
                Severity::Ok,
                "an allocator can be preloaded (--allocator auto)",
            )
            .evidence(list.join(", ")),
        );
    }
    for skipped in s.skipped {
        out.push(
            Finding::new(
                "allocator.unsafe",
                Area::Allocator,
                Severity::Warn,
                "an allocator library is not safe to preload",
            )
            .evidence(skipped),
        );
    }
}

pub(super) fn tools(sys: &dyn Sys, out: &mut Vec<Finding>) {
    let names = ["numactl", "nvidia-smi", "torchrun", "srun", "mpirun"];
    let (found, missing): (Vec<&str>, Vec<&str>) =
        names.iter().partition(|n| sys.which(n).is_some());
    out.push(
        Finding::new(
            "tools.present",
            Area::Tools,
            Severity::Info,
            format!(
                "on PATH: {}",
                if found.is_empty() {
                    "none".into()
                } else {
                    found.join(", ")
                }
            ),
        )
        .evidence(format!(
            "missing: {}",
            if missing.is_empty() {
                "none".into()
            } else {
                missing.join(", ")
            }
        )),
    );
}
