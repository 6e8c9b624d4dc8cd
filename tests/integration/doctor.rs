//! `threadwise doctor` as a user runs it: on real machine dumps, with a fake
//! Python that prints versions, with the environment set wrong, and the exit
//! code a cluster prolog would read.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::run::{bin, text};

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let mut c = Command::new(bin());
    c.arg("doctor").args(args).arg("--json");
    for k in [
        "OMP_NUM_THREADS",
        "KMP_AFFINITY",
        "LD_PRELOAD",
        "CUDA_VISIBLE_DEVICES",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code().unwrap(), v)
}

fn ids(v: &serde_json::Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "{}:{}",
                f["id"].as_str().unwrap(),
                f["severity"].as_str().unwrap()
            )
        })
        .collect()
}

/// A fake python3 that answers the probe like a conda install with two
/// OpenMP runtimes.
fn fake_python(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("python3");
    std::fs::write(
        &p,
        "#!/bin/sh\necho '{\"python\": \"3.10.4\", \"cpu_count\": 64, \"affinity\": 2, \"torch\": \"2.0.1\", \
         \"cuda\": \"11.8\", \"cudnn\": 8700, \"threads\": 32, \"openmp\": [\"/opt/conda/lib/libiomp5.so\", \
         \"/opt/conda/lib/python3.10/site-packages/torch/lib/libgomp-a34b3233.so.1\"]}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn this_machine_a_wrong_environment_and_a_fake_python() {
    let (code, v) = doctor(&["--no-python"], &[]);
    assert_eq!(v["schema"], "threadwise.doctor/1");
    assert_eq!(code, 0, "{:?}", ids(&v));
    assert!(ids(&v).iter().any(|i| i.starts_with("tools.present")));
    assert_eq!(v["python"], "skipped (--no-python)");

    let (code, v) = doctor(
        &["-n", "2", "--no-python"],
        &[
            ("OMP_NUM_THREADS", "8"),
            ("KMP_AFFINITY", "granularity=fine,compact,1,0"),
            ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.1"),
        ],
    );
    let got = ids(&v);
    assert_eq!(code, 1, "a failing check exits 1: {got:?}");
    for want in [
        "threads.oversubscribed:warn",
        "threads.cpu0-trap:warn",
        "allocator.preload:fail",
    ] {
        assert!(got.contains(&want.to_string()), "{want}: {got:?}");
    }

    let d = tempfile::tempdir().unwrap();
    let py = fake_python(d.path());
    let (_, v) = doctor(&["--python", py.to_str().unwrap()], &[]);
    let got = ids(&v);
    for want in [
        "python.torch:warn",
        "python.openmp:fail",
        "python.cpu-count:warn",
    ] {
        assert!(got.contains(&want.to_string()), "{want}: {got:?}");
    }
    assert!(v["python"].as_str().unwrap().starts_with("ran "));

    // A Python that hangs is skipped within the limit, and said.
    let hang = d.path().join("hang");
    std::fs::write(&hang, "#!/bin/sh\nsleep 30\n").unwrap();
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = std::time::Instant::now();
    let (_, v) = doctor(
        &[
            "--python",
            hang.to_str().unwrap(),
            "--python-timeout",
            "0.5",
        ],
        &[],
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert!(
        v["python"].as_str().unwrap().contains("did not answer"),
        "{}",
        v["python"]
    );
}

#[test]
fn dumps_of_real_machines() {
    let tmp = super::scratch();
    let root = |name: &str| super::extract_dump(tmp.path(), name);
    let (_, v) = doctor(
        &[
            "--no-python",
            "--root",
            root("20em64t-hybrid-1p6c2t+2ca4co1t").to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        ids(&v).contains(&"cpu.hybrid:info".to_string()),
        "{:?}",
        ids(&v)
    );
    let cg = root("32amd64-4s2n4c-cgroup2");
    let (_, v) = doctor(&["--no-python", "--root", cg.to_str().unwrap()], &[]);
    let got = ids(&v);
    assert!(
        got.contains(&"container.cpuset:info".to_string()),
        "{got:?}"
    );
    assert!(
        !got.iter().any(|i| i.starts_with("container.cpu-quota")),
        "{got:?}"
    );
    // The same job with a 2.5-CPU quota on its 6 CPUs.
    std::fs::write(
        cg.join("cgroup/unified/uid_2008/job_15389/cpu.max"),
        "250000 100000\n",
    )
    .unwrap();
    let (_, v) = doctor(&["--no-python", "--root", cg.to_str().unwrap()], &[]);
    assert!(
        ids(&v).contains(&"container.cpu-quota:warn".to_string()),
        "{:?}",
        ids(&v)
    );
    // Every dump: findings, never a crash.
    for e in std::fs::read_dir(super::topologies("linux")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let Some(name) = name.strip_suffix(".tar.gz") else {
            continue;
        };
        let out = Command::new(bin())
            .args(["doctor", "--no-python", "--root"])
            .arg(root(name))
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{name}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("threadwise doctor on sysfs:"),
            "{name}"
        );
    }
}

#[test]
fn fix_script_and_sysctl_file() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("90-threadwise.conf");
    let out = Command::new(bin())
        .args(["doctor", "--no-python", "--fix", "--write"])
        .arg(&f)
        .output()
        .unwrap();
    let script = text(&out.stdout);
    assert!(script.starts_with("#!/bin/sh"), "{script}");
    // This machine's swappiness is its own: the file holds it when above 10.
    let swappiness: u32 = std::fs::read_to_string("/proc/sys/vm/swappiness")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if swappiness > 10 {
        assert!(
            std::fs::read_to_string(&f)
                .unwrap()
                .contains("vm.swappiness = 10")
        );
        assert!(script.contains("sysctl -w vm.swappiness=10"));
    }
    let out = Command::new(bin())
        .args(["doctor", "--write", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--write needs --fix");
}

#[test]
fn run_prints_the_quick_checks_unless_told_not_to() {
    let out = Command::new(bin())
        .args(["run", "-n", "1", "-q", "--", "true"])
        .env("KMP_AFFINITY", "compact")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("threadwise: doctor: warn threads.cpu0-trap"),
        "{}",
        text(&out.stderr)
    );
    let out = Command::new(bin())
        .args(["run", "-n", "1", "-q", "--no-doctor", "--", "true"])
        .env("KMP_AFFINITY", "compact")
        .output()
        .unwrap();
    assert!(
        !text(&out.stderr).contains("doctor:"),
        "{}",
        text(&out.stderr)
    );
}

/// A real machine's dump with a GPU planted on its PCI bus as the kernel shows
/// one (vendor, class, NUMA node, link files): the downgraded link is flagged
/// by the real binary, and a full-width one is not.
#[test]
fn a_gpu_on_a_narrow_pcie_link_is_flagged() {
    let tmp = super::scratch();
    let root = super::extract_dump(tmp.path(), "16amd64-8n2c");
    let dev = root.join("sys/bus/pci/devices/0000:3b:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    let write = |name: &str, v: &str| std::fs::write(dev.join(name), format!("{v}\n")).unwrap();
    for (name, v) in [
        ("vendor", "0x10de"),
        ("device", "0x20b0"),
        ("class", "0x030200"),
        ("numa_node", "0"),
        ("local_cpulist", "0-1"),
        ("current_link_width", "8"),
        ("max_link_width", "16"),
        ("current_link_speed", "16.0 GT/s PCIe"),
        ("max_link_speed", "16.0 GT/s PCIe"),
    ] {
        write(name, v);
    }
    let args = ["--no-python", "--root", root.to_str().unwrap()];
    let (_, v) = doctor(&args, &[]);
    assert!(
        ids(&v).contains(&"gpu.pcie-link:warn".to_string()),
        "{:?}",
        ids(&v)
    );
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "gpu.pcie-link")
        .unwrap();
    assert!(
        f["evidence"]
            .to_string()
            .contains("0000:3b:00.0: x8 at 16 GT/s, can do x16"),
        "{f}"
    );
    write("current_link_width", "16");
    let (_, v) = doctor(&args, &[]);
    assert!(
        ids(&v).contains(&"gpu.pcie-link:ok".to_string()),
        "{:?}",
        ids(&v)
    );
}
