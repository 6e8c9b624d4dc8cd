//! The table of checks: for each, a fixture that makes it fire (and its
//! severity then) and one that keeps it quiet, by area.

use super::*;

/// (check id, what makes it fire, its severity then, what keeps it quiet)
pub(super) type Case = (
    &'static str,
    Box<dyn Fn() -> (FakeSys, Topology, Request)>,
    Severity,
    Box<dyn Fn() -> (FakeSys, Topology, Request)>,
);

pub(super) fn base() -> FakeSys {
    FakeSys::default()
}

/// Two GPUs whose sysfs link files say (current width, max width, current
/// speed, max speed), as the kernel writes them.
pub(super) fn pcie(links: &[(&str, &str, &str, &str); 2]) -> (FakeSys, Topology, Request) {
    let t = topo("core:4 gpu:2");
    let mut s = base();
    for (g, (cw, mw, cs, ms)) in t.gpus.iter().zip(links) {
        let dir = format!("/sys/bus/pci/devices/{}", g.bus_id);
        for (name, v) in [
            ("current_link_width", cw),
            ("max_link_width", mw),
            ("current_link_speed", cs),
            ("max_link_speed", ms),
        ] {
            s = s.file(&format!("{dir}/{name}"), &format!("{v}\n"));
        }
    }
    (s, t, n(2))
}

pub(super) fn elf_so() -> Vec<u8> {
    let mut h = b"\x7fELF\x02\x01\x01".to_vec();
    h.resize(16, 0);
    h.extend([3, 0]); // ET_DYN
    h
}

/// A fixture: one file with this text, on a 4-core machine, one rank.
pub(super) fn on_file(
    path: &'static str,
    text: &'static str,
) -> Box<dyn Fn() -> (FakeSys, Topology, Request)> {
    Box::new(move || (base().file(path, text), topo("core:4"), n(1)))
}

pub(super) fn cases() -> Vec<Case> {
    [
        threads_cases(),
        container_cases(),
        memory_cases(),
        cpu_cases(),
        network_cases(),
        allocator_cases(),
        gpu_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The `threads.*` checks.
fn threads_cases() -> Vec<Case> {
    let c4 = || topo("core:4");
    vec![
        (
            "threads.unset",
            Box::new(move || (base(), c4(), n(2))),
            Severity::Warn,
            Box::new(move || (base().var("OMP_NUM_THREADS", "2"), c4(), n(2))),
        ),
        (
            "threads.oversubscribed",
            Box::new(move || (base().var("OMP_NUM_THREADS", "4"), c4(), n(2))),
            Severity::Warn,
            Box::new(move || (base().var("OMP_NUM_THREADS", "2"), c4(), n(2))),
        ),
        (
            "threads.invalid",
            Box::new(move || (base().var("OMP_NUM_THREADS", "four"), c4(), n(1))),
            Severity::Fail,
            Box::new(move || (base().var("OMP_NUM_THREADS", "1"), c4(), n(1))),
        ),
        (
            "threads.cpu0-trap",
            Box::new(move || {
                (
                    base().var("KMP_AFFINITY", "granularity=fine,compact,1,0"),
                    c4(),
                    n(2),
                )
            }),
            Severity::Warn,
            Box::new(move || (base().var("OMP_PROC_BIND", "false"), c4(), n(2))),
        ),
    ]
}

/// The `container.*` checks.
fn container_cases() -> Vec<Case> {
    vec![
        (
            "container.cpu-quota",
            Box::new(|| (base(), topo("core:8 quota:2.5"), n(1))),
            Severity::Warn,
            Box::new(|| (base(), topo("core:8 quota:8"), n(1))),
        ),
        (
            "container.cpuset",
            Box::new(|| (base(), topo("core:8 allowed:0-3"), n(1))),
            Severity::Info,
            Box::new(|| (base(), topo("core:8"), n(1))),
        ),
        (
            "container.cpuset-gpu-node",
            Box::new(|| (base(), topo("numa:2 core:4 gpu-nodes:1 allowed:0-3"), n(1))),
            Severity::Warn,
            Box::new(|| (base(), topo("numa:2 core:4 gpu-nodes:0 allowed:0-3"), n(1))),
        ),
        (
            "container.shm",
            Box::new(|| {
                let mut s = base();
                s.fs.insert("/dev/shm".into(), 64 * MIB);
                (s, topo("core:4"), n(2))
            }),
            Severity::Fail,
            Box::new(|| {
                let mut s = base();
                s.fs.insert("/dev/shm".into(), 8 << 30);
                (s, topo("core:4"), n(2))
            }),
        ),
        (
            "container.open-files",
            Box::new(|| {
                let mut s = base();
                s.limits.insert(Limit::OpenFiles, (1024, 4096));
                (s, topo("core:4"), n(1))
            }),
            Severity::Warn,
            Box::new(|| {
                let mut s = base();
                s.limits.insert(Limit::OpenFiles, (65536, 65536));
                (s, topo("core:4"), n(1))
            }),
        ),
        (
            "container.locked-memory",
            Box::new(|| {
                let mut s = base();
                s.limits.insert(Limit::LockedMemory, (8 * MIB, 8 * MIB));
                (s, topo("core:4 gpu:1"), n(1))
            }),
            Severity::Warn,
            Box::new(|| {
                let mut s = base();
                s.limits.insert(Limit::LockedMemory, (u64::MAX, u64::MAX));
                (s, topo("core:4 gpu:1"), n(1))
            }),
        ),
    ]
}

/// The `memory.*` checks. (A table, one entry a check: over 80 lines, it reads
/// best whole.)
fn memory_cases() -> Vec<Case> {
    vec![
        (
            "memory.gpu-numa-unknown",
            Box::new(|| {
                let mut t = topo("numa:2 core:4 gpu:2");
                t.gpus[0].numa_node = None;
                (base(), t, n(2))
            }),
            Severity::Warn,
            Box::new(|| (base(), topo("numa:2 core:4 gpu:2"), n(2))),
        ),
        (
            "memory.gpu-spread",
            Box::new(|| (base(), topo("numa:2 core:4 gpu-nodes:0,0,1"), n(3))),
            Severity::Info,
            Box::new(|| (base(), topo("numa:2 core:4 gpu-nodes:0,1"), n(2))),
        ),
        (
            "memory.memoryless-node",
            Box::new(|| {
                let mut t = topo("numa:2 core:4");
                t.numa_nodes[1].memory_bytes = 0;
                (base(), t, n(1))
            }),
            Severity::Warn,
            Box::new(|| (base(), topo("numa:2 core:4"), n(1))),
        ),
        (
            "memory.numa-balancing",
            Box::new(|| {
                (
                    base().file("/proc/sys/kernel/numa_balancing", "1\n"),
                    topo("numa:2 core:4"),
                    n(2),
                )
            }),
            Severity::Warn,
            Box::new(|| {
                (
                    base().file("/proc/sys/kernel/numa_balancing", "0\n"),
                    topo("numa:2 core:4"),
                    n(2),
                )
            }),
        ),
        (
            "memory.zone-reclaim",
            on_file("/proc/sys/vm/zone_reclaim_mode", "1\n"),
            Severity::Warn,
            on_file("/proc/sys/vm/zone_reclaim_mode", "0\n"),
        ),
        (
            "memory.thp",
            Box::new(|| {
                (
                    base().file(
                        "/sys/kernel/mm/transparent_hugepage/enabled",
                        "always madvise [never]\n",
                    ),
                    topo("core:4"),
                    n(1),
                )
            }),
            Severity::Info,
            Box::new(|| {
                (
                    base().file(
                        "/sys/kernel/mm/transparent_hugepage/enabled",
                        "always [madvise] never\n",
                    ),
                    topo("core:4"),
                    n(1),
                )
            }),
        ),
        (
            "memory.swappiness",
            on_file("/proc/sys/vm/swappiness", "60\n"),
            Severity::Info,
            on_file("/proc/sys/vm/swappiness", "10\n"),
        ),
        (
            "memory.swap-used",
            Box::new(|| {
                (
                    base().file(
                        "/proc/meminfo",
                        "MemTotal: 100 kB\nSwapTotal: 2048 kB\nSwapFree: 1024 kB\n",
                    ),
                    topo("core:4"),
                    n(1),
                )
            }),
            Severity::Warn,
            on_file("/proc/meminfo", "SwapTotal: 2048 kB\nSwapFree: 2048 kB\n"),
        ),
    ]
}

/// The `cpu.*` checks.
fn cpu_cases() -> Vec<Case> {
    vec![
        (
            "cpu.governor",
            Box::new(|| {
                (
                    base().file(
                        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
                        "powersave\n",
                    ),
                    topo("core:4"),
                    n(1),
                )
            }),
            Severity::Info,
            Box::new(|| {
                (
                    base().file(
                        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
                        "performance\n",
                    ),
                    topo("core:4"),
                    n(1),
                )
            }),
        ),
        (
            "cpu.hybrid",
            Box::new(|| {
                let mut t = topo("core:4");
                t.cores[3].kind = Some(crate::topology::CoreKind::Efficiency);
                (base(), t, n(1))
            }),
            Severity::Info,
            Box::new(|| (base(), topo("core:4"), n(1))),
        ),
        (
            "cpu.isolated",
            on_file("/sys/devices/system/cpu/isolated", "2-3\n"),
            Severity::Warn,
            on_file("/sys/devices/system/cpu/isolated", "\n"),
        ),
        (
            "cpu.nohz-full",
            on_file("/sys/devices/system/cpu/nohz_full", "1-3\n"),
            Severity::Info,
            on_file("/sys/devices/system/cpu/nohz_full", "(null)\n"),
        ),
    ]
}

/// The `network.*` checks.
fn network_cases() -> Vec<Case> {
    vec![
        (
            "network.somaxconn",
            on_file("/proc/sys/net/core/somaxconn", "128\n"),
            Severity::Info,
            on_file("/proc/sys/net/core/somaxconn", "4096\n"),
        ),
        (
            "network.rdzv",
            Box::new(|| {
                let r = Request {
                    rdzv_endpoint: Some("nowhere.invalid:29400".into()),
                    ..n(1)
                };
                (base(), topo("core:4"), r)
            }),
            Severity::Fail,
            Box::new(|| {
                let mut s = base();
                s.hosts.push("node0".into());
                let r = Request {
                    rdzv_endpoint: Some("node0:29400".into()),
                    ..n(1)
                };
                (s, topo("core:4"), r)
            }),
        ),
        (
            "network.ifname",
            Box::new(|| (base(), topo("core:4 nic:2"), n(1))),
            Severity::Info,
            Box::new(|| {
                (
                    base().var("NCCL_SOCKET_IFNAME", "ib0"),
                    topo("core:4 nic:2"),
                    n(1),
                )
            }),
        ),
        (
            "network.gloo_socket_ifname",
            Box::new(|| {
                let mut s = base()
                    .var("MASTER_ADDR", "10.0.0.1")
                    .var("GLOO_SOCKET_IFNAME", "ib0");
                s.routes.insert("10.0.0.1".into(), "eth0".into());
                (s, topo("core:4"), n(1))
            }),
            Severity::Warn,
            Box::new(|| {
                let mut s = base()
                    .var("MASTER_ADDR", "10.0.0.1")
                    .var("GLOO_SOCKET_IFNAME", "eth0");
                s.routes.insert("10.0.0.1".into(), "eth0".into());
                (s, topo("core:4"), n(1))
            }),
        ),
    ]
}

/// The `allocator.*` checks.
fn allocator_cases() -> Vec<Case> {
    vec![
        (
            "allocator.preload",
            // The guides' advice on Debian 12: a file that does not exist.
            Box::new(|| {
                (
                    base().var("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.1"),
                    topo("core:4"),
                    n(1),
                )
            }),
            Severity::Fail,
            Box::new(|| {
                let mut s = base().var("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
                s.heads.insert(
                    PathBuf::from("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
                    elf_so(),
                );
                (s, topo("core:4"), n(1))
            }),
        ),
        (
            "allocator.jemalloc-decay",
            // What torch's run_cpu sets: the pages still go back.
            Box::new(|| {
                (
                    base()
                        .var("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
                        .var(
                            "MALLOC_CONF",
                            "oversize_threshold:1,background_thread:true,metadata_thp:auto",
                        ),
                    topo("core:4"),
                    n(1),
                )
            }),
            Severity::Warn,
            Box::new(|| {
                (
                    base()
                        .var("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
                        .var("MALLOC_CONF", crate::plan::JEMALLOC_CONF),
                    topo("core:4"),
                    n(1),
                )
            }),
        ),
        (
            "allocator.installed",
            Box::new(|| (base(), topo("core:4"), n(1))),
            Severity::Info,
            Box::new(|| {
                let mut s = base();
                s.allocators.push(crate::plan::Allocator {
                    kind: crate::plan::AllocatorKind::Tcmalloc,
                    path: "/usr/lib/libtcmalloc.so.4".into(),
                });
                (s, topo("core:4"), n(1))
            }),
        ),
    ]
}

/// The `gpu.*` checks. (A table, one entry a check: over 80 lines, it reads
/// best whole.)
fn gpu_cases() -> Vec<Case> {
    vec![
        (
            "gpu.driver",
            Box::new(|| (base(), topo("core:4 gpu:2"), n(2))),
            Severity::Warn,
            Box::new(|| {
                let mut s = base();
                s.nvml = Nvml {
                    loaded: true,
                    devices: 2,
                    ..Default::default()
                };
                (s, topo("core:4 gpu:2"), n(2))
            }),
        ),
        (
            "gpu.pcie-link",
            Box::new(|| {
                pcie(&[
                    ("16", "16", "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
                    ("8", "16", "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
                ])
            }),
            Severity::Warn,
            Box::new(|| {
                pcie(&[
                    ("16", "16", "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
                    ("16", "16", "8 GT/s", "8 GT/s"),
                ])
            }),
        ),
        (
            "gpu.pcie-link",
            // Full width but the idle generation: said, not warned.
            Box::new(|| {
                pcie(&[
                    ("16", "16", "2.5 GT/s PCIe", "16.0 GT/s PCIe"),
                    ("16", "16", "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
                ])
            }),
            Severity::Info,
            // No link files (a dump without them): nothing to say.
            Box::new(|| (base(), topo("core:4 gpu:2"), n(2))),
        ),
        (
            "gpu.count",
            Box::new(|| (base(), topo("core:4 gpu:2"), n(4))),
            Severity::Warn,
            Box::new(|| (base(), topo("core:4 gpu:2"), n(2))),
        ),
        (
            "gpu.persistence",
            Box::new(|| {
                let mut s = base();
                s.nvml = Nvml {
                    loaded: true,
                    devices: 2,
                    persistence_off: vec![0, 1],
                    ..Default::default()
                };
                (s, topo("core:4 gpu:2"), n(2))
            }),
            Severity::Info,
            Box::new(|| {
                let mut s = base();
                s.nvml = Nvml {
                    loaded: true,
                    devices: 2,
                    ..Default::default()
                };
                (s, topo("core:4 gpu:2"), n(2))
            }),
        ),
        (
            "gpu.visible",
            Box::new(|| {
                (
                    base().var("CUDA_VISIBLE_DEVICES", "0,x,1"),
                    topo("core:4 gpu:2"),
                    n(1),
                )
            }),
            Severity::Fail,
            Box::new(|| {
                (
                    base().var("CUDA_VISIBLE_DEVICES", "0,1"),
                    topo("core:4 gpu:2"),
                    n(1),
                )
            }),
        ),
    ]
}
