//! Every check with a fixture that makes it fire and one that keeps it quiet.

use std::path::PathBuf;

use super::python::Probe;
use super::sys::{FakeSys, Limit, Nvml};
use super::*;
use crate::topology::synthetic;

mod cases;

use cases::{base, cases, elf_so};

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
        interop: Some(2),
        compile_threads: Some(2),
        compile_threads_var: None,
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
fn pools_are_checked_against_one_ranks_share() {
    let t = topo("core:4");
    let of = |p: &Probe, k: usize| sev(&base(), &t, &n(k), Some(p), "python.pools");
    // 2 compile workers and 2 inter-op threads: within 4 CPUs / 2 ranks.
    assert_eq!(of(&probe(), 2), Some(Severity::Ok));
    // Inductor's own default on this machine (min(32, CPUs in the mask)) with 4 ranks.
    let unsized_pool = Probe {
        compile_threads: Some(4),
        interop: Some(1),
        ..probe()
    };
    assert_eq!(of(&unsized_pool, 4), Some(Severity::Warn));
    assert_eq!(of(&unsized_pool, 1), Some(Severity::Ok));
    let inter = Probe {
        interop: Some(4),
        ..probe()
    };
    assert_eq!(of(&inter, 2), Some(Severity::Warn));
    // An old torch that says neither: no finding, rather than a guess.
    let silent = Probe {
        interop: None,
        compile_threads: None,
        ..probe()
    };
    assert_eq!(of(&silent, 4), None);
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

/// Without -n, doctor checks the ranks `run -n auto` would start: one per
/// GPU, else one per NUMA node with CPUs (it assumed one).
#[test]
fn the_default_ranks_are_run_auto() {
    let req = Request::default();
    for (desc, want) in [
        ("package:2 numa:2 core:4", 4),
        ("package:2 core:4", 2),
        ("core:4", 1),
        ("package:1 core:8 gpu:4", 4),
    ] {
        let t = topo(desc);
        assert_eq!(checks::ranks(&t, &req), want, "{desc}");
        let p = crate::plan::plan(
            &t,
            &crate::plan::PlanRequest::default(),
            &Default::default(),
        );
        assert_eq!(p.unwrap().nproc, want, "plan -n auto on {desc}");
    }
}

/// docs/watch.md's table names every finding the code can make.
#[test]
fn every_finding_is_in_the_docs_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/watch.md")).unwrap();
    let mut ids = vec![];
    for f in std::fs::read_dir(root.join("src/doctor")).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let src = std::fs::read_to_string(&path).unwrap();
            // Literal ids only (a few are built at run time: network.*).
            for part in src.split("Finding::new(").skip(1) {
                if let Some(id) = part.trim_start().strip_prefix('"') {
                    ids.push(id[..id.find('"').unwrap()].to_string());
                }
            }
        }
    }
    assert!(ids.len() > 30, "{ids:?}");
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !doc.contains(&format!("`{id}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "findings not in docs/watch.md: {missing:?}"
    );
}

#[test]
fn memory_only_nodes_are_named_so() {
    // A Grace-like machine: two CPU nodes and two memory-only ones (GPU memory).
    let mut t = topo("package:2 core:2");
    for id in [2, 3] {
        t.numa_nodes.push(crate::topology::NumaNode {
            id,
            cpus: Default::default(),
            memory_bytes: 512 * MIB,
        });
    }
    let f = diagnose(&base(), &t, &n(2), None);
    let numa = f.iter().find(|x| x.id == "memory.numa").unwrap();
    assert_eq!(numa.title, "4 NUMA node(s), 2 with CPUs");
    assert!(
        numa.evidence
            .contains("node 2: memory only, 512 MiB; node 3: memory only, 512 MiB"),
        "{}",
        numa.evidence
    );
    assert!(
        numa.evidence.starts_with("node 0: cpus 0-1 "),
        "{}",
        numa.evidence
    );
}
