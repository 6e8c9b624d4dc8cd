//! GPUs as a job has them, with no GPU in the machine: real machine dumps with
//! GPUs planted as a live machine shows them (tests/support/gpu-machine.sh),
//! this machine seen through a mount namespace with real device nodes and a
//! real cgroup v1 devices controller, and NVML answered by the stand-in
//! library (tests/support/nvml-standin) loaded through THREADWISE_NVML_LIBRARY:
//! everything above NVML is threadwise's real code path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use super::run::{bin, text};

fn support(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(name)
}

/// The NVML stand-in, built once per test run.
fn standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvml-standin");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libnvidia-ml.so.1");
        let tmp = dir.join(format!("lib.{}.so", std::process::id()));
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&tmp)
            .arg(support("nvml-standin/nvml.c"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        std::fs::rename(&tmp, &lib).unwrap();
        lib
    })
}

/// A GPU machine dump of `scenario` in `dir`.
fn dump(dir: &Path, scenario: &str) -> PathBuf {
    let out = dir.join(scenario);
    let st = Command::new(support("gpu-machine.sh"))
        .args(["dump", scenario])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "gpu-machine.sh dump {scenario}");
    out
}

fn threadwise(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args);
    with_env(c, env)
}

/// `c` run without this test process's GPU variables, then with `env`.
fn with_env(mut c: Command, env: &[(&str, &str)]) -> Output {
    for k in [
        "CUDA_VISIBLE_DEVICES",
        "THREADWISE_NVML_LIBRARY",
        "THREADWISE_NVML_STANDIN",
    ] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c.output().unwrap()
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)))
}

/// Each rank's (GPU bus id, memory nodes, CUDA_VISIBLE_DEVICES).
fn ranks(plan: &Value) -> Vec<(String, String, String)> {
    plan["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["gpu"].as_str().unwrap_or("").to_string(),
                r["mem_nodes"].to_string(),
                r["env"]["CUDA_VISIBLE_DEVICES"]
                    .as_str()
                    .or(r["env"]["HIP_VISIBLE_DEVICES"].as_str())
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

fn plan_of(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let mut args = vec!["plan", "--json", "--root", root.to_str().unwrap()];
    args.extend(extra);
    json(&threadwise(&args, env))
}

fn r(bus: &str, nodes: &str, visible: &str) -> (String, String, String) {
    (bus.into(), nodes.into(), visible.into())
}

/// Every scenario's plan names the GPUs the job really has, by bus id, with
/// NUMA-local CPUs, and CUDA_VISIBLE_DEVICES in the job's own numbering.
#[test]
fn each_dump_plans_on_the_gpus_the_job_has() {
    let tmp = super::scratch();
    let whole = dump(tmp.path(), "whole");
    let p = plan_of(&whole, &["-n", "gpu"], &[]);
    assert_eq!(p["nproc"], 8);
    assert_eq!(ranks(&p)[4], r("0000:87:00.0", "[1]", ""));

    // docker --gpus '"device=3,5"': 2 ranks, one per socket, not 8.
    let container = dump(tmp.path(), "container");
    let p = plan_of(&container, &["-n", "gpu"], &[]);
    assert_eq!(
        ranks(&p),
        vec![r("0000:4e:00.0", "[0]", ""), r("0000:90:00.0", "[1]", "")]
    );
    assert_eq!(p["ranks"][0]["cpus"], "0-7,16-23");
    assert_eq!(p["ranks"][1]["cpus"], "8-15,24-31");
    // --gpus 1 is the container's second GPU, which CUDA inside calls 1.
    let p = plan_of(&container, &["--gpus", "1"], &[]);
    assert_eq!(ranks(&p), vec![r("0000:90:00.0", "[1]", "1")]);

    // Slurm step with GPUs 4,5 re-indexed 0,1: both on node 1.
    let slurm = dump(tmp.path(), "slurm");
    let p = plan_of(&slurm, &["-n", "gpu"], &[]);
    assert_eq!(
        ranks(&p),
        vec![r("0000:87:00.0", "[1]", ""), r("0000:90:00.0", "[1]", "")]
    );
    assert!(
        p["ranks"][0]["cpus"].as_str().unwrap().starts_with("8-"),
        "{}",
        p["ranks"][0]
    );
    let p = plan_of(&slurm, &["--gpus", "0,1"], &[]);
    assert_eq!(ranks(&p)[1], r("0000:90:00.0", "[1]", "0,1"));
    let topo = json(&threadwise(
        &["topo", "--json", "--root", slurm.to_str().unwrap()],
        &[],
    ));
    let a = &topo["gpu_access"];
    assert_eq!(
        (a["on_bus"].as_u64(), a["usable"].as_u64()),
        (Some(8), Some(2))
    );
    assert_eq!(a["hidden"].as_array().unwrap().len(), 6);
    assert!(
        a["evidence"]
            .to_string()
            .contains("SLURM_STEP_GPUS=4,5: agrees"),
        "{a}"
    );

    // CUDA_VISIBLE_DEVICES by UUID, 5 first: resolved from the driver table.
    let uuid = dump(tmp.path(), "uuid");
    let p = plan_of(&uuid, &["-n", "gpu"], &[]);
    assert_eq!(
        ranks(&p),
        vec![r("0000:90:00.0", "[1]", ""), r("0000:4e:00.0", "[0]", "")]
    );
    assert_eq!(
        p["ranks"][0]["gpu_uuid"],
        "GPU-5d0c1b3a-7e21-4c8f-9a6b-000000000005"
    );
    let p = plan_of(&uuid, &["--gpus", "1"], &[]);
    assert_eq!(
        ranks(&p),
        vec![r(
            "0000:4e:00.0",
            "[0]",
            "GPU-5d0c1b3a-7e21-4c8f-9a6b-000000000003"
        )]
    );

    // AMD: ROCR_VISIBLE_DEVICES=2,6 of 8 render nodes.
    let amd = dump(tmp.path(), "amd");
    let p = plan_of(&amd, &["-n", "gpu"], &[]);
    assert_eq!(
        ranks(&p),
        vec![r("0000:47:00.0", "[0]", ""), r("0000:b7:00.0", "[1]", "")]
    );
    let p = plan_of(&amd, &["--gpus", "1"], &[]);
    assert_eq!(ranks(&p), vec![r("0000:b7:00.0", "[1]", "1")]);
}

/// UUIDs with nothing to resolve them: a clear error, not a guess.
#[test]
fn uuids_without_a_driver_table_or_nvml_are_refused_clearly() {
    let tmp = super::scratch();
    let uuid = dump(tmp.path(), "uuid");
    std::fs::remove_dir_all(uuid.join("proc/driver")).unwrap();
    let out = threadwise(
        &["plan", "-n", "gpu", "--root", uuid.to_str().unwrap()],
        &[],
    );
    // 3: the environment, not the command line, is what must change.
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(e.contains("CUDA_VISIBLE_DEVICES="), "{e}");
    assert!(e.contains("neither /proc/driver/nvidia nor NVML"), "{e}");
    assert!(e.contains("hint:"), "{e}");
}

/// MIG slices: only NVML lists them. Without it the plan says so and uses
/// the whole GPU; with it each rank gets its own slice as cuda:0.
#[test]
fn mig_slices_come_from_nvml_one_per_rank() {
    let tmp = super::scratch();
    let mig = dump(tmp.path(), "mig");
    let topo = threadwise(&["topo", "--root", mig.to_str().unwrap()], &[]);
    assert!(
        text(&topo.stdout).contains("is in MIG mode"),
        "{}",
        text(&topo.stdout)
    );
    let lib = standin().to_str().unwrap().to_string();
    let nvml_json = mig.join("nvml.json");
    let env = [
        ("THREADWISE_NVML_LIBRARY", lib.as_str()),
        ("THREADWISE_NVML_STANDIN", nvml_json.to_str().unwrap()),
    ];
    let p = plan_of(&mig, &["-n", "gpu"], &env);
    let slice = |k: u32| format!("MIG-8e5b6a4c-1d2f-5a3b-9c7d-{k:012}");
    assert_eq!(
        ranks(&p),
        vec![
            r("0000:07:00.0", "[0]", &slice(1)),
            r("0000:07:00.0", "[0]", &slice(2))
        ]
    );
    assert_eq!(p["ranks"][1]["gpu_ordinal"], 0);
    assert_eq!(p["ranks"][1]["gpu_uuid"], slice(2).as_str());
    assert!(p["reasons"].to_string().contains("MIG"), "{}", p["reasons"]);
}

/// Run `script` (bash) on this machine seen as GPU scenario `scenario`.
fn live(scenario: &str, script: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(support("gpu-machine.sh"));
    c.args(["live", scenario, "--", "bash", "-c", script]);
    c.env("TW", bin());
    with_env(c, env)
}

/// What one machine made (its scratch directory and devices cgroup, as the
/// script said them on stderr: `machine: DIR CGROUP`) that is still there.
/// Only its own: tests running beside it make machines of their own.
fn leftovers(stderr: &str) -> Vec<String> {
    let Some(made) = stderr.lines().find_map(|l| l.strip_prefix("machine: ")) else {
        return vec!["the script did not say what it made".into()];
    };
    made.split_whitespace()
        .filter(|p| std::path::Path::new(p).exists())
        .map(str::to_string)
        .collect()
}

/// A Slurm-style devices cgroup on this machine: all eight /dev/nvidiaN
/// exist, the job may open 4 and 5 only; threadwise opens each node, sees
/// EPERM, and plans on the two, re-indexed.
#[test]
fn a_real_devices_cgroup_withholds_gpus() {
    let out = live(
        "slurm",
        r#"set -e; echo "machine: $TW_GPU_MACHINE" >&2; "$TW" topo --json; echo ===; "$TW" plan --gpus 1 --json"#,
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = text(&out.stdout);
    let (topo, plan) = all.split_once("===").unwrap();
    let topo: Value = serde_json::from_str(topo).unwrap();
    let plan: Value = serde_json::from_str(plan).unwrap();
    let a = &topo["gpu_access"];
    assert_eq!(a["usable"], 2, "{a}");
    let hidden = a["hidden"].as_array().unwrap();
    assert_eq!(hidden.len(), 6);
    assert!(
        hidden[0]["why"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{a}"
    );
    assert_eq!(ranks(&plan), vec![r("0000:90:00.0", "[0]", "1")]);
    let err = text(&out.stderr);
    assert!(leftovers(&err).is_empty(), "{:?}", leftovers(&err));
}

/// What NVML reports in the tune and top tests: four GPUs, the job's two
/// (0 and 1) at 70% and 20%, the others at 99%; another job's process on
/// GPU 0; each rank's process holding 2048 MiB.
const NVML: &str = r#"{"gpus": [
 {"bus_id": "0000:07:00.0", "minor": 0, "utilization": 70, "memory_used_mib": 100, "job_process_memory_mib": 2048, "processes": [{"pid": 1, "memory_mib": 500}], "persistence": false},
 {"bus_id": "0000:0f:00.0", "minor": 1, "utilization": 20, "job_process_memory_mib": 2048},
 {"bus_id": "0000:47:00.0", "minor": 2, "utilization": 99, "job_process_memory_mib": 2048},
 {"bus_id": "0000:4e:00.0", "minor": 3, "utilization": 99, "job_process_memory_mib": 2048}
]}"#;

fn nvml_env(dir: &Path) -> (String, String) {
    let f = dir.join("nvml.json");
    std::fs::write(&f, NVML).unwrap();
    (
        standin().to_str().unwrap().to_string(),
        f.to_str().unwrap().to_string(),
    )
}

/// tune's GPU figures are the job's GPUs' (45%, not the 72% of every GPU),
/// its own processes' memory beside the GPUs' total, and the other job's
/// process is named.
#[test]
fn tune_reports_the_jobs_gpus_only() {
    let tmp = super::scratch();
    let (lib, spec) = nvml_env(tmp.path());
    let report = tmp.path().join("t.json");
    let script = format!(
        r#""$TW" tune -n 2 --runs 2 --max-runs 2 --grid threads=1 --export-json {} -- sh -c 'sleep 1.5; echo "threadwise: throughput=10 img/s"'"#,
        report.display()
    );
    let out = live(
        "whole",
        &script,
        &[
            ("THREADWISE_NVML_LIBRARY", &lib),
            ("THREADWISE_NVML_STANDIN", &spec),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for c in v["configs"].as_array().unwrap() {
        let util = c["gpu_util_pct"].as_f64().unwrap();
        assert!((util - 45.0).abs() <= 2.0, "{}: {util}", c["name"]);
        assert_eq!(c["gpu_job_mem_mib"].as_f64(), Some(4096.0), "{c}");
        assert_eq!(c["gpu_mem_mib"].as_f64(), Some(4696.0), "{c}");
    }
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(
        all.contains("another process used the job's GPUs")
            && all.contains("pid 1 on 0000:07:00.0"),
        "{all}"
    );
}

/// top: each rank's GPU (utilisation, its own memory), and a drift alert for
/// a rank whose process runs on a GPU its plan did not name. doctor, on the
/// same machine, says persistence mode is off where NVML says so.
#[test]
fn top_shows_each_ranks_gpu_and_a_gpu_drift() {
    let tmp = super::scratch();
    let (lib, spec) = nvml_env(tmp.path());
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let script = r#"set -e
"$TW" run -n 2 -q --no-doctor -- sh -c 'if [ "$LOCAL_RANK" = 1 ]; then exec env THREADWISE_GPU=0000:47:00.0 sleep 5; else exec sleep 5; fi' &
for i in $(seq 50); do ls "$XDG_RUNTIME_DIR/threadwise" 2>/dev/null | grep -q . && break; sleep 0.1; done
sleep 0.5
"$TW" top --once --json --interval 0.3
echo ===
"$TW" doctor --json --no-python || true
wait"#;
    let out = live(
        "whole",
        script,
        &[
            ("THREADWISE_NVML_LIBRARY", &lib),
            ("THREADWISE_NVML_STANDIN", &spec),
            ("XDG_RUNTIME_DIR", state.to_str().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = text(&out.stdout);
    let (top, doctor) = all.split_once("===").unwrap();
    let v: Value = serde_json::from_str(top).unwrap();
    let g0 = &v["ranks"][0]["gpu"];
    assert_eq!(g0["planned"], "0000:07:00.0", "{v}");
    assert_eq!(g0["util_pct"].as_f64(), Some(70.0));
    assert_eq!(g0["mem_mib"].as_f64(), Some(2048.0));
    let g1 = &v["ranks"][1]["gpu"];
    assert_eq!(g1["on"][0], "0000:47:00.0", "{v}");
    let alerts = v["alerts"].as_array().unwrap();
    assert!(
        alerts
            .iter()
            .any(|a| a["kind"] == "gpu-drift" && a["local_rank"] == 1),
        "{alerts:?}"
    );
    assert!(
        !alerts
            .iter()
            .any(|a| a["kind"] == "gpu-drift" && a["local_rank"] == 0),
        "{alerts:?}"
    );
    let d: Value = serde_json::from_str(doctor).unwrap();
    assert!(
        d["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["id"] == "gpu.persistence"),
        "{d}"
    );
}
