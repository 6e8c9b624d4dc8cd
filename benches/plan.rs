//! `cargo bench`: how long topology discovery and planning take, in
//! milliseconds (median and min-max of repeated runs). Goal: under 20 ms for
//! `topo` and `plan` on the live machine, end to end as a process.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use threadwise::{Facts, NProc, PlanRequest, plan_ranks as plan, probe_sysfs, synthetic_topology};

fn measure(name: &str, runs: usize, mut f: impl FnMut()) {
    f(); // warm-up
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<52} median {:>8.3} ms   min {:>8.3}   max {:>8.3}   ({runs} runs)",
        ms(t[runs / 2]),
        ms(t[0]),
        ms(t[runs - 1])
    );
}

fn main() {
    let live = || probe_sysfs(Path::new("/"), true).unwrap();
    measure("probe live machine (library)", 200, || {
        std::hint::black_box(live());
    });
    // Real machines' dumps (hwloc's test data): the probe's cost grows with
    // the CPUs it reads (a 256-thread POWER8 with SMT4, a 128-core Arm with
    // no SMT).
    for dump in ["256ppc-8n8s4t", "128arm-2pa2n8cluster4co"] {
        let dir = tempfile::tempdir().unwrap();
        let tar = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/data/topologies/linux/{dump}.tar.gz"));
        let ok = Command::new("tar")
            .arg("-xzf")
            .arg(&tar)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "tar -xzf {}", tar.display());
        measure(&format!("probe dump {dump} (library)"), 20, || {
            std::hint::black_box(probe_sysfs(dir.path(), false).unwrap());
        });
    }
    let topo = live();
    let req = PlanRequest {
        nproc: NProc::Count(topo.cores.len()),
        ..Default::default()
    };
    measure(
        "plan live machine, one rank per core (library)",
        200,
        || {
            std::hint::black_box(plan(&topo, &req, &Facts::default()).unwrap());
        },
    );
    let big_desc = "package:8 numa:4 l3:8 core:8 pu:2 gpu:64";
    let big = synthetic_topology(big_desc).unwrap();
    assert_eq!(big.online_cpus.len(), 4096);
    measure("build synthetic 4096-CPU machine (library)", 20, || {
        std::hint::black_box(synthetic_topology(big_desc).unwrap());
    });
    let req64 = PlanRequest::default();
    measure("plan 4096 CPUs, 64 GPU ranks (library)", 20, || {
        std::hint::black_box(plan(&big, &req64, &Facts::default()).unwrap());
    });
    let req_cpu = PlanRequest {
        nproc: NProc::Count(256),
        gpus: threadwise::GpuSelect::None,
        ..Default::default()
    };
    measure("plan 4096 CPUs, 256 CPU ranks (library)", 20, || {
        std::hint::black_box(plan(&big, &req_cpu, &Facts::default()).unwrap());
    });
    let bin = env!("CARGO_BIN_EXE_threadwise");
    let run = |args: &[&str]| {
        let out = Command::new(bin).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    measure("process: threadwise topo --json", 50, || {
        run(&["topo", "--json"])
    });
    measure("process: threadwise plan --json", 50, || {
        run(&["plan", "--json"])
    });
    measure(
        "process: threadwise plan --json --synthetic <4096 CPUs>",
        20,
        || run(&["plan", "--json", "--synthetic", big_desc]),
    );
    measure("process: threadwise doctor --no-python --json", 20, || {
        run(&["doctor", "--no-python", "--json"])
    });
}
