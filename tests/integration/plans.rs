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
    assert_eq!(ranks[0]["workers"], 6);
    assert_eq!(ranks[0]["env"]["THREADWISE_WORKER_CPUS"], "50-55,178-183");
    assert_eq!(ranks[0]["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(ranks[0]["env"].get("KMP_AFFINITY").is_none());
    assert!(ranks[0]["env"].get("OMP_PROC_BIND").is_none());
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
