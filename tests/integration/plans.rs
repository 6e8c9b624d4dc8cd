//! Plans for machines we are not on, checked by hand and kept as snapshots:
//! a DGX-A100-like GPU server and a 2-socket CPU-only server.

use serde_json::Value;

use super::threadwise;

/// DGX A100: 2 x 64-core EPYC in NPS4 (8 NUMA nodes of 16 cores, an L3 per 4
/// cores), GPUs in PCI order on nodes 3,3,1,1,7,7,5,5 (not NUMA order).
const DGX: &str = "package:2 numa:4 l3:4 core:4 pu:2 gpu-nodes:3,3,1,1,7,7,5,5";
const TWO_SOCKET: &str = "package:2 l3:1 core:16 pu:2";

fn plan(args: &[&str]) -> String {
    let out = threadwise().arg("plan").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn dgx_like_exclusive() {
    let table = plan(&["--synthetic", DGX, "--explain"]);
    insta::assert_snapshot!("dgx_exclusive", table);
    let p: Value = serde_json::from_str(&plan(&["--synthetic", DGX, "--json"])).unwrap();
    let ranks = p["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    // Rank 0 drives GPU 0 on node 3 and gets half of node 3's cores with siblings.
    assert_eq!(ranks[0]["mem_nodes"], serde_json::json!([3]));
    assert_eq!(ranks[0]["cpus"], "48-55,176-183");
    assert_eq!(ranks[1]["cpus"], "56-63,184-191");
    assert_eq!(ranks[2]["mem_nodes"], serde_json::json!([1]));
    assert_eq!(ranks[0]["threads"], 2);
    // 6 spare cores of its own node plus 8 worker-only cores of the GPU-less
    // nodes 0 and 2 (distance 12, same package), capped at 8 workers.
    assert_eq!(ranks[0]["workers"], 8);
    assert_eq!(
        ranks[0]["env"]["THREADWISE_WORKER_CPUS"],
        "0-3,32-35,50-55,128-131,160-163,178-183"
    );
    assert_eq!(ranks[0]["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(ranks[0]["env"].get("KMP_AFFINITY").is_none());
    assert!(ranks[0]["env"].get("OMP_PROC_BIND").is_none());
}

/// DGX H100: 2 x 56-core Xeon, one NUMA node per socket, 4 GPUs on each.
const DGX_H100: &str = "package:2 l3:1 core:56 pu:2 gpu-nodes:0,0,0,0,1,1,1,1";
/// An 8-GPU AMD server in NPS4: 8 nodes of 2 CCDs (8 cores each), GPUs
/// hanging off 4 of the 8 nodes.
const AMD_8GPU: &str = "package:2 numa:4 l3:2 core:8 pu:2 gpu-nodes:0,0,2,2,4,4,6,6";

#[test]
fn gpu_servers_use_every_core() {
    insta::assert_snapshot!("dgx_h100", plan(&["--synthetic", DGX_H100, "--explain"]));
    let amd = plan(&["--synthetic", AMD_8GPU, "--explain"]);
    insta::assert_snapshot!("amd_8gpu", amd);
    assert!(!amd.contains("stay idle"), "{amd}");
    let p: Value = serde_json::from_str(&plan(&["--synthetic", AMD_8GPU, "--json"])).unwrap();
    for r in p["ranks"].as_array().unwrap() {
        // 8 of the 16 cores of its GPU's node (2 ranks share it) for compute;
        // its workers also get 4 cores on each of the two GPU-less nodes of
        // its package.
        assert_eq!(r["cores"], 8, "{r}");
        let node = r["mem_nodes"][0].as_u64().unwrap();
        assert!(node % 2 == 0, "{r}");
    }
}

#[test]
fn dgx_like_other_policies() {
    insta::assert_snapshot!("dgx_l3", plan(&["--synthetic", DGX, "--policy", "l3"]));
    insta::assert_snapshot!("dgx_node", plan(&["--synthetic", DGX, "--policy", "node"]));
    insta::assert_snapshot!(
        "dgx_slurm",
        plan(&[
            "--synthetic",
            DGX,
            "--format",
            "slurm",
            "--",
            "python",
            "train.py"
        ])
    );
    insta::assert_snapshot!(
        "dgx_torchrun",
        plan(&[
            "--synthetic",
            DGX,
            "--format",
            "torchrun",
            "--",
            "python",
            "train.py",
            "--lr",
            "0.1"
        ])
    );
}

#[test]
fn two_socket_cpu_only() {
    insta::assert_snapshot!(
        "two_socket_n2",
        plan(&["--synthetic", TWO_SOCKET, "-n", "2", "--explain"])
    );
    insta::assert_snapshot!(
        "two_socket_n4",
        plan(&["--synthetic", TWO_SOCKET, "-n", "4"])
    );
    insta::assert_snapshot!(
        "two_socket_seed_2nodes",
        plan(&[
            "--synthetic",
            TWO_SOCKET,
            "-n",
            "4",
            "--profile",
            "seed",
            "--nnodes",
            "2",
            "--explain"
        ])
    );
    insta::assert_snapshot!(
        "two_socket_numactl",
        plan(&[
            "--synthetic",
            TWO_SOCKET,
            "-n",
            "2",
            "--mem",
            "bind",
            "--format",
            "numactl",
            "--",
            "python",
            "train.py"
        ])
    );
}

/// The placement picture: DGX-like servers, a hybrid CPU's real dump, this
/// machine's shape; letters only (no terminal), so logs and snapshots agree.
#[test]
fn placement_pictures() {
    let pic = |args: &[&str]| {
        super::stdout_ok(
            super::threadwise()
                .args(["plan", "--picture"])
                .args(args)
                .output()
                .unwrap(),
        )
    };
    insta::assert_snapshot!("picture_dgx_a100", pic(&["--synthetic", DGX]));
    insta::assert_snapshot!(
        "picture_dgx_h100",
        pic(&[
            "--synthetic",
            "package:2 numa:1 l3:1 core:56 pu:2 gpu:8 nic:8"
        ])
    );
    insta::assert_snapshot!(
        "picture_two_cores",
        pic(&["-n", "2", "--synthetic", "core:2"])
    );
    let tmp = super::scratch();
    let root = super::extract_dump(tmp.path(), "20em64t-hybrid-1p6c2t+2ca4co1t");
    let hybrid = pic(&["-n", "2", "--root", root.to_str().unwrap()]);
    // The first line names the scratch directory: leave it out.
    let body: String = hybrid.lines().skip(1).map(|l| format!("{l}\n")).collect();
    insta::assert_snapshot!("picture_hybrid_dump", body);
    // Each rank gets the same mix, and the plan says how much compute that is.
    let why = plan(&["-n", "2", "--root", root.to_str().unwrap(), "--explain"]);
    assert!(
        why.contains("every rank: hybrid CPU: 3 performance + 4 efficiency core(s) = 5.9 fastest-core equivalents"),
        "{why}"
    );
    // This machine: every core appears once, lettered by its rank.
    let live = pic(&["-n", "1"]);
    assert!(live.contains("node 0") && live.contains('A'), "{live}");
    // The SVG of the same plan is valid XML, with a cell per core.
    let svg = tmp.path().join("dgx.svg");
    let out = super::threadwise()
        .args(["plan", "--synthetic", DGX, "--svg"])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("valid XML");
    let cells = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
    assert_eq!(cells, 1 + 128, "background and the 128 cores");
}
