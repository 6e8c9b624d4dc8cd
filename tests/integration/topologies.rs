//! `topo --json` on every real machine dump and hwloc XML export matches what
//! hwloc itself read from the same machine (`*.expected.json`), except for the
//! differences listed in KEPT, each with its reason. A listed difference must
//! still differ, so the list cannot go stale.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{threadwise, topologies};

/// (machine, field, why we differ from hwloc on purpose).
const KEPT: &[(&str, &str, &str)] = &[
    (
        "4fake-4gr1nu1pu",
        "cores",
        "the dump has no core_id/thread_siblings files; hwloc then shows no Core objects, \
         we treat every CPU as its own core so the planner always has cores to place",
    ),
    (
        "64amd64-4s2n4ca2co",
        "cores",
        "AMD Bulldozer: the two integer cores of a compute unit share one FPU and L2, and \
         thread_siblings lists them together; hwloc counts them apart by core_id, we keep \
         them together like SMT siblings because training is floating-point work",
    ),
    (
        "8em64t-2s2ca2c-buggynuma",
        "numa_nodes.memory",
        "firmware lists every CPU in all 8 nodes; like hwloc we show one node, but with \
         the memory of all 8 nodes (hwloc keeps node 0's only)",
    ),
    (
        "fakememinitiators-1np2c+1npp+gi",
        "numa_nodes.memory_only_cpus",
        "CPU-less nodes (HMAT memory targets, generic-initiator node 4): hwloc lends them \
         their initiators' CPUs; we keep them CPU-less so no CPU counts in two nodes; \
         their nearness is in the distance matrix",
    ),
    (
        "nvidiagpunumanodes",
        "numa_nodes.gpu_memory",
        "nodes 250-255 are GPU memory exposed as NUMA nodes; hwloc hides them, we list them \
         as memory-only nodes (the planner never binds to CPU-less nodes)",
    ),
];

fn kept(machine: &str, field: &str) -> bool {
    KEPT.iter().any(|(m, f, _)| *m == machine && *f == field)
}

fn cpus_list(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::String(s) => s.clone(),
            o => o["cpus"].as_str().unwrap().to_string(),
        })
        .collect();
    out.sort();
    out
}

type Nodes = BTreeMap<u64, (String, u64)>;

fn nodes(v: &Value) -> Nodes {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_u64().unwrap(),
                (
                    n["cpus"].as_str().unwrap().to_string(),
                    n["memory_bytes"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

fn distance_map(v: &Value) -> Option<BTreeMap<(u64, u64), u64>> {
    let ids: Vec<u64> = v["ids"]
        .as_array()?
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let mut m = BTreeMap::new();
    for (i, row) in v["matrix"].as_array()?.iter().enumerate() {
        for (j, d) in row.as_array().unwrap().iter().enumerate() {
            m.insert((ids[i], ids[j]), d.as_u64().unwrap());
        }
    }
    Some(m)
}

fn gpus(v: &Value) -> Vec<(String, String, String)> {
    let mut g: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["bus_id"].as_str().unwrap().to_string(),
                d["vendor"].as_str().unwrap().to_string(),
                d["local_cpus"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    g.sort();
    g
}

/// Compare one machine; returns the differences not listed in KEPT.
fn compare(machine: &str, got: &Value, exp: &Value) -> Vec<String> {
    let mut bad = vec![];
    let mut check = |field: &str, same: bool| {
        if same == kept(machine, field) {
            bad.push(if same {
                format!("{field}: listed as a kept difference but now matches hwloc")
            } else {
                format!("{field}: differs from hwloc")
            });
        }
    };
    check("online_cpus", got["online_cpus"] == exp["online_cpus"]);
    check("allowed_cpus", got["allowed_cpus"] == exp["allowed_cpus"]);
    check(
        "packages",
        cpus_list(&got["packages"]) == cpus_list(&exp["packages"]),
    );
    check(
        "cores",
        cpus_list(&got["cores"]) == cpus_list(&exp["cores"]),
    );
    check(
        "l3_groups",
        cpus_list(&got["l3_groups"]) == cpus_list(&exp["l3_groups"]),
    );
    check("gpus", gpus(&got["gpus"]) == gpus(&exp["gpus"]));

    let (g, e) = (nodes(&got["numa_nodes"]), nodes(&exp["numa_nodes"]));
    if kept(machine, "numa_nodes.gpu_memory") {
        let extra: Vec<_> = g.iter().filter(|(id, _)| !e.contains_key(id)).collect();
        let same = g
            .iter()
            .filter(|(id, _)| e.contains_key(id))
            .map(|(k, v)| (*k, v.clone()))
            .collect::<Nodes>()
            == e;
        check(
            "numa_nodes.gpu_memory",
            !same || extra.is_empty() || extra.iter().any(|(_, (c, _))| !c.is_empty()),
        );
    } else if kept(machine, "numa_nodes.memory") {
        let strip = |n: &Nodes| n.iter().map(|(k, v)| (*k, v.0.clone())).collect::<Vec<_>>();
        check("numa_nodes", strip(&g) == strip(&e));
        check("numa_nodes.memory", g == e);
    } else if kept(machine, "numa_nodes.memory_only_cpus") {
        // Nodes with CPUs match hwloc exactly; memory matches everywhere; the
        // CPU-less ones are where hwloc lends initiators' CPUs.
        let with_cpus: Nodes = g
            .iter()
            .filter(|(_, v)| !v.0.is_empty())
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let theirs: Nodes = e
            .iter()
            .filter(|(k, _)| with_cpus.contains_key(k))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mems = |n: &Nodes| n.iter().map(|(k, v)| (*k, v.1)).collect::<Vec<_>>();
        check(
            "numa_nodes",
            with_cpus == theirs && mems(&g) == mems(&e) && with_cpus.len() >= 2,
        );
        check("numa_nodes.memory_only_cpus", g == e);
    } else {
        check("numa_nodes", g == e);
    }

    let (gd, ed) = (&got["numa_distances"], &exp["numa_distances"]);
    if kept(machine, "numa_nodes.gpu_memory") {
        let ours = distance_map(gd).unwrap_or_default();
        let theirs = distance_map(ed).unwrap_or_default();
        let sub: BTreeMap<_, _> = ours
            .into_iter()
            .filter(|(k, _)| theirs.contains_key(k))
            .collect();
        check("numa_distances", sub == theirs);
    } else {
        check("numa_distances", distance_map(gd) == distance_map(ed));
    }
    bad
}

fn topo_json(args: &[&str]) -> Value {
    let out = threadwise()
        .arg("topo")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "threadwise topo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn expected(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn machines(dir: &str, ext: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(topologies(dir))
        .expect("tests/data/topologies is in the repository")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(ext).map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_linux_dump_matches_hwloc() {
    let names = machines("linux", ".tar.gz");
    assert!(names.len() >= 20, "found only {} dumps", names.len());
    let tmp = super::scratch();
    let mut failures = vec![];
    for name in &names {
        let root = super::extract_dump(tmp.path(), name);
        // The human view must not panic either.
        threadwise()
            .args(["topo", "--root"])
            .arg(&root)
            .assert()
            .success();
        let got = topo_json(&["--root", root.to_str().unwrap()]);
        let exp = expected(&topologies(&format!("linux/{name}.expected.json")));
        for d in compare(name, &got, &exp) {
            failures.push(format!("{name}: {d}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_xml_export_matches_hwloc() {
    let names = machines("xml", ".xml");
    assert!(names.len() >= 8);
    let mut failures = vec![];
    let mut gpus_seen = 0;
    for name in &names {
        let file = topologies(&format!("xml/{name}.xml"));
        let got = topo_json(&["--topology", file.to_str().unwrap()]);
        gpus_seen += got["gpus"].as_array().unwrap().len();
        let exp = expected(&topologies(&format!("xml/{name}.expected.json")));
        for d in compare(name, &got, &exp) {
            failures.push(format!("{name}: {d}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        gpus_seen >= 6,
        "the GPU servers' GPUs were read ({gpus_seen})"
    );
}

#[test]
fn dump_details_beyond_hwloc() {
    let tmp = super::scratch();
    let extract = |name: &str| {
        let root = super::extract_dump(tmp.path(), name);
        topo_json(&["--root", root.to_str().unwrap()])
    };
    let hybrid = extract("20em64t-hybrid-1p6c2t+2ca4co1t");
    // The plan on that real hybrid machine: the same mix of P- and E-cores each.
    let root = tmp.path().join("20em64t-hybrid-1p6c2t+2ca4co1t");
    let out = threadwise()
        .args(["plan", "-n", "2", "--json", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["ranks"][0]["cpus"], "0-5,12-15");
    assert_eq!(plan["ranks"][1]["cpus"], "6-11,16-19");
    assert_eq!(plan["ranks"][1]["env"]["THREADWISE_WORKER_CPUS"], "16-19");
    let kinds: Vec<&str> = hybrid["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "performance").count(),
        6,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "efficiency").count(),
        8,
        "{kinds:?}"
    );
    let buggy = extract("8em64t-2s2ca2c-buggynuma");
    assert!(
        buggy["notes"]
            .to_string()
            .contains("every CPU in every NUMA node")
    );
    let v2 = extract("32amd64-4s2n4c-cgroup2");
    assert_eq!(v2["limits"]["cgroup_version"], "v2");
    assert_eq!(v2["cpu_budget"], 6.0);
    let nics = extract("32intel64-2p8co2t+8ve");
    assert_eq!(
        nics["nics"].as_array().unwrap().len(),
        4,
        "2 ethernet + 2 infiniband"
    );
}

/// hwloc's real `lstopo` on this machine is the oracle for the live reader: its
/// XML export, read back through `--topology`, and our own sysfs reading agree.
#[test]
fn live_machine_matches_lstopo() {
    let tmp = super::scratch();
    let xml = tmp.path().join("live.xml");
    let status = std::process::Command::new("lstopo-no-graphics")
        .args(["--of", "xml", "--whole-io"])
        .arg(&xml)
        .status()
        .expect("lstopo-no-graphics from Debian's hwloc-nox (the test command installs it)");
    assert!(status.success());
    let ours = topo_json(&[]);
    let theirs = topo_json(&["--topology", xml.to_str().unwrap()]);
    for field in ["online_cpus", "allowed_cpus"] {
        assert_eq!(ours[field], theirs[field], "{field}");
    }
    for field in ["packages", "cores", "l3_groups"] {
        assert_eq!(
            cpus_list(&ours[field]),
            cpus_list(&theirs[field]),
            "{field}"
        );
    }
    let strip =
        |v: &Value| -> Vec<(u64, String)> { nodes(v).into_iter().map(|(k, v)| (k, v.0)).collect() };
    assert_eq!(strip(&ours["numa_nodes"]), strip(&theirs["numa_nodes"]));
    assert_eq!(gpus(&ours["gpus"]), gpus(&theirs["gpus"]));
}
