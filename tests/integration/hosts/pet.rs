//! Kubeflow's PyTorchJob shapes on the test hosts: nothing but torchrun's
//! environment options (`PET_*`) and `threadwise run -- CMD` on each host,
//! forming one job with the right ranks and world size.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::*;

/// Start `command(host)` on host1, then host0, each to its end (exit 0),
/// and return each host's output, host0's first.
fn both_hosts(dir: &Path, command: impl Fn(&str) -> Command) -> [String; 2] {
    let mut children: Vec<_> = ["host1", "host0"]
        .iter()
        .map(|h| {
            let out = std::fs::File::create(dir.join(format!("{h}.out"))).unwrap();
            command(h)
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap()
        })
        .collect();
    for (c, h) in children.iter_mut().zip(["host1", "host0"]) {
        assert_eq!(finish(c, Duration::from_secs(30)).0, 0, "{}", read(dir, h));
    }
    ["host0", "host1"].map(|h| read(dir, h))
}

/// Start `threadwise run -- sh rank.sh` on both hosts, each with its `PET_`
/// variables (the shared ones and its own), and return each host's output.
fn pet_job(shared: &[(&str, &str)], own: [&[(&str, &str)]; 2]) -> [String; 2] {
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "exit 0");
    let args = [
        bin(),
        "run".into(),
        "--grace".into(),
        "3".into(),
        "--".into(),
        "sh".into(),
        s,
    ];
    both_hosts(d.path(), |h| {
        let mut c = on(h, &strs(&args));
        for (k, v) in shared.iter().chain(own[(h == "host1") as usize]) {
            c.env(k, v);
        }
        c
    })
}

/// Each host ran global rank = its node rank, of a world of two, with
/// MASTER_ADDR host0's address; returns the ranks' MASTER_PORT.
fn one_job(out: &[String; 2]) -> u16 {
    let mut ports = vec![];
    for (r, text) in out.iter().enumerate() {
        assert!(
            text.contains(
                "threadwise: options from torchrun's environment variables: PET_NNODES=2"
            ),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("[rank {r}] host{r} RANK={r} ")))
            .unwrap_or_else(|| panic!("no line of rank {r} on host{r}: {text}"));
        assert!(line.contains("WORLD_SIZE=2 MASTER=10.77.0.10:"), "{line}");
        let port = line.split("MASTER=10.77.0.10:").nth(1).unwrap();
        ports.push(
            port.split_whitespace()
                .next()
                .unwrap()
                .parse::<u16>()
                .unwrap(),
        );
    }
    assert_eq!(ports[0], ports[1], "{out:?}");
    ports[0]
}

#[test]
fn kubeflow_operator_v1_environment_forms_one_job() {
    let _g = hosts();
    let out = pet_job(
        &[
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_RDZV_ENDPOINT", "host0:29621"),
        ],
        [&[("PET_NODE_RANK", "0")], &[("PET_NODE_RANK", "1")]],
    );
    one_job(&out);
}

#[test]
fn kubeflow_trainer_v2_static_shape_forms_one_job_at_the_master() {
    let _g = hosts();
    let out = pet_job(
        &[
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_MASTER_ADDR", "host0"),
            ("PET_MASTER_PORT", "29622"),
        ],
        [&[("PET_NODE_RANK", "0")], &[("PET_NODE_RANK", "1")]],
    );
    // The rendezvous took the master's port; the ranks' store is on another.
    assert_ne!(one_job(&out), 29622, "{out:?}");
    assert!(
        out[1].contains("the rendezvous is at the master host0:29622 (torchrun's static shape)"),
        "{}",
        out[1]
    );
}

/// TorchX's `dist.ddp` component: each replica's container runs `bash -c
/// "torchrun --rdzv_backend c10d --rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:PORT
/// --rdzv_id APP --nnodes 2 --nproc_per_node 1 --tee 3 --role '' SCRIPT"`
/// (torchx 0.7's `components/dist.py`), its options as flags and the script
/// in torchrun's form; node 0's endpoint is `localhost`. The same line with
/// `threadwise run` for `torchrun` forms one job, node 0 the master at the
/// address host1 reached it (not its loopback).
#[test]
fn torchx_dist_ddp_command_line_forms_one_job() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("train.py");
    std::fs::write(
        &script,
        "import os, socket, sys\n\
         e = os.environ\n\
         print(f\"{socket.gethostname()} RANK={e['RANK']} WORLD_SIZE={e['WORLD_SIZE']} \
         MASTER={e['MASTER_ADDR']}:{e['MASTER_PORT']} ROLE={e['ROLE_NAME']!r} \
         UNBUFFERED={'-u' in sys.orig_argv} ARGS={sys.argv[1:]}\")\n",
    )
    .unwrap();
    let line = format!(
        "{} run --grace 3 --rdzv_backend c10d --rdzv_endpoint ${{TORCHX_RANK0_HOST:=localhost}}:29623 \
         --rdzv_id app-1 --nnodes 2 --nproc_per_node 1 --tee 3 --role '' {} --lr 0.1",
        bin(),
        script.display()
    );
    let out = both_hosts(d.path(), |h| {
        let mut c = on(h, &["bash", "-c", &line]);
        c.env_remove("TORCHX_RANK0_HOST");
        if h == "host1" {
            c.env("TORCHX_RANK0_HOST", "host0");
        }
        c
    });
    for (r, text) in out.iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("[rank {r}] host{r} RANK={r} ")))
            .unwrap_or_else(|| panic!("no line of rank {r} on host{r}: {text}"));
        assert!(
            line.contains("WORLD_SIZE=2 MASTER=10.77.0.10:")
                && line.contains("ROLE='' UNBUFFERED=True ARGS=['--lr', '0.1']"),
            "{line}"
        );
        assert!(
            text.contains("torchrun's form (no --): each rank runs python"),
            "{text}"
        );
    }
}
