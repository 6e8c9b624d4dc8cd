//! Every check with a fixture that makes it fire and one that keeps it quiet.

use std::path::PathBuf;

use super::python::Probe;
use super::sys::{FakeSys, Limit, Nvml};
use super::*;
use crate::topology::synthetic;

const MIB: u64 = 1 << 20;

fn topo(desc: &str) -> Topology {
    synthetic::parse(desc).unwrap()
}

fn sev(
    sys: &FakeSys,
    t: &Topology,
    req: &Request,
    py: Option<&Probe>,
    id: &str,
) -> Option<Severity> {
    let f = diagnose(sys, t, req, py);
    // No check may panic or say nothing: every finding has a title.
    assert!(f.iter().all(|x| !x.title.is_empty() && x.id.contains('.')));
    f.into_iter().find(|x| x.id == id).map(|x| x.severity)
}

fn n(k: usize) -> Request {
    Request {
        nproc: Some(k),
        ..Default::default()
    }
}

/// (check id, what makes it fire, its severity then, what keeps it quiet)
type Case = (
    &'static str,
    Box<dyn Fn() -> (FakeSys, Topology, Request)>,
    Severity,
    Box<dyn Fn() -> (FakeSys, Topology, Request)>,
);

fn base() -> FakeSys {
    FakeSys::default()
}

/// Two GPUs whose sysfs link files say (current width, max width, current
/// speed, max speed), as the kernel writes them.
fn pcie(links: &[(&str, &str, &str, &str); 2]) -> (FakeSys, Topology, Request) {
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

fn elf_so() -> Vec<u8> {
    let mut h = b"\x7fELF\x02\x01\x01".to_vec();
    h.resize(16, 0);
    h.extend([3, 0]); // ET_DYN
    h
}

/// A fixture: one file with this text, on a 4-core machine, one rank.
fn on_file(
    path: &'static str,
    text: &'static str,
) -> Box<dyn Fn() -> (FakeSys, Topology, Request)> {
    Box::new(move || (base().file(path, text), topo("core:4"), n(1)))
}

fn cases() -> Vec<Case> {
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

#[test]
fn every_check_fires_on_its_fixture_and_keeps_quiet_on_the_other() {
    for (id, fire, severity, quiet) in cases() {
        let (s, t, r) = fire();
        assert_eq!(
            sev(&s, &t, &r, None, id),
            Some(severity),
            "{id} should fire"
        );
        let (s, t, r) = quiet();
        let q = sev(&s, &t, &r, None, id);
        assert!(
            q.is_none() || q == Some(Severity::Ok),
            "{id} should be quiet, got {q:?}"
        );
    }
}

#[test]
fn gpu_visible_forms() {
    let t = topo("core:4 gpu:2");
    let of = |v: &str| {
        sev(
            &base().var("CUDA_VISIBLE_DEVICES", v),
            &t,
            &n(1),
            None,
            "gpu.visible",
        )
    };
    assert_eq!(of(""), Some(Severity::Warn));
    assert_eq!(of("GPU-8f3a,GPU-9b1c"), Some(Severity::Ok));
    assert_eq!(of("0,5"), Some(Severity::Fail));
    assert_eq!(of("1"), Some(Severity::Ok));
}

#[test]
fn preload_entries_not_elf_or_not_shared() {
    let t = topo("core:4");
    let mut s = base().var("LD_PRELOAD", "/x/notes.txt /x/prog");
    s.heads
        .insert("/x/notes.txt".into(), b"hello, this is text".to_vec());
    let mut exe = elf_so();
    exe[16] = 2; // ET_EXEC
    s.heads.insert("/x/prog".into(), exe);
    let f = diagnose(&s, &t, &n(1), None);
    let why: Vec<&str> = f
        .iter()
        .filter(|x| x.id == "allocator.preload")
        .map(|x| x.evidence.as_str())
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[0].contains("not an ELF file") && why[1].contains("not a shared object"));
}

fn probe() -> Probe {
    Probe {
        python: "3.11.7".into(),
        cpu_count: Some(4),
        affinity: Some(4),
        torch: Some("2.5.1".into()),
        cuda: Some("12.4".into()),
        cudnn: Some(90100),
        threads: Some(2),
        torch_error: None,
        openmp: vec!["/venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1".into()],
    }
}

#[test]
fn python_checks_fire_and_keep_quiet() {
    let t = topo("core:4");
    let of = |p: &Probe, id: &str, k: usize| sev(&base(), &t, &n(k), Some(p), id);
    let good = probe();
    assert_eq!(of(&good, "python.torch", 2), Some(Severity::Ok));
    assert_eq!(of(&good, "python.openmp", 2), Some(Severity::Ok));
    assert_eq!(of(&good, "python.threads", 2), None);
    assert_eq!(of(&good, "python.cpu-count", 2), None);
    let old = Probe {
        torch: Some("1.13.1".into()),
        ..probe()
    };
    assert_eq!(of(&old, "python.torch", 2), Some(Severity::Warn));
    let two = Probe {
        openmp: vec![
            "/venv/torch/lib/libgomp-a34b3233.so.1".into(),
            "/opt/conda/lib/libiomp5.so".into(),
        ],
        ..probe()
    };
    assert_eq!(of(&two, "python.openmp", 2), Some(Severity::Fail));
    assert_eq!(
        of(&good, "python.threads", 4),
        Some(Severity::Warn),
        "4 ranks x 2 threads on 4 CPUs"
    );
    let narrow = Probe {
        affinity: Some(2),
        ..probe()
    };
    assert_eq!(of(&narrow, "python.cpu-count", 1), Some(Severity::Warn));
    let none = Probe {
        torch: None,
        torch_error: Some("ModuleNotFoundError: No module named 'torch'".into()),
        ..probe()
    };
    assert_eq!(of(&none, "python.torch", 1), Some(Severity::Info));
}

#[test]
fn fixes_script_sysctl_file_and_exit_severity() {
    let s = base()
        .file("/proc/sys/kernel/numa_balancing", "1\n")
        .file("/proc/sys/vm/swappiness", "60\n")
        .var("OMP_NUM_THREADS", "zero");
    let t = topo("numa:2 core:4");
    let r = Report {
        schema: DOCTOR_SCHEMA.into(),
        source: "test".into(),
        findings: diagnose(&s, &t, &n(2), None),
        python: "not asked".into(),
    };
    assert_eq!(r.worst(), Severity::Fail);
    let file = sysctl_file(&r).unwrap();
    assert!(
        file.contains("kernel.numa_balancing = 0") && file.contains("vm.swappiness = 10"),
        "{file}"
    );
    let script = fix_script(&r);
    let fail = script.find("threads.invalid").unwrap();
    let info = script.find("memory.swappiness").unwrap();
    assert!(fail < info, "worst first:\n{script}");
    assert!(script.contains("sysctl -w kernel.numa_balancing=0"));
    let text = human(&r, false, false);
    assert!(
        text.contains("FAIL threads.invalid") && !text.contains("\x1b["),
        "{text}"
    );
    assert!(human(&r, true, false).contains("\x1b[1;31mFAIL"));
    let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}

#[test]
fn odd_values_give_findings_not_crashes() {
    let t = topo("numa:2 core:4 gpu:1");
    let s = base()
        .file("/proc/sys/kernel/numa_balancing", "garbage")
        .file("/proc/sys/vm/swappiness", "")
        .file("/proc/meminfo", "SwapTotal: x kB")
        .file(
            "/sys/kernel/mm/transparent_hugepage/enabled",
            "[unterminated",
        )
        .file("/sys/devices/system/cpu/isolated", "not-a-list")
        .file("/proc/sys/net/core/somaxconn", "-5")
        .var("OMP_NUM_THREADS", "")
        .var("LD_PRELOAD", "::  :")
        .var("CUDA_VISIBLE_DEVICES", ",,,");
    let f = diagnose(&s, &t, &n(usize::MAX / 2), None);
    assert!(f.iter().any(|x| x.id == "threads.invalid"));
}

#[test]
fn preflight_keeps_warnings_but_not_what_run_fixes_itself() {
    let s = base()
        .var("KMP_AFFINITY", "compact")
        .var("OMP_NUM_THREADS", "8");
    let f = preflight(&s, &topo("core:4 quota:2"), 2);
    let ids: Vec<&str> = f.iter().map(|x| x.id.as_str()).collect();
    assert!(ids.contains(&"threads.cpu0-trap"), "{ids:?}");
    assert!(ids.contains(&"container.cpu-quota"), "{ids:?}");
    assert!(
        !ids.contains(&"threads.oversubscribed"),
        "run sets threads itself: {ids:?}"
    );
    assert!(f.iter().all(|x| x.severity >= Severity::Warn));
    // No NVML start-up in run's path: a GPU whose driver does not load is
    // doctor's finding, not a line before every run.
    let g = preflight(&base(), &topo("core:4 gpu:2"), 2);
    assert!(g.iter().all(|x| x.area != Area::Gpu), "{g:?}");
}
