//! The torchrun environment contract for ranks that `run` starts itself, so
//! scripts written for torchrun, Lightning, Accelerate or the HF Trainer run
//! unchanged, and the report of what a launch changes in the user's environment.

use std::collections::BTreeMap;

/// Where this node sits in the job.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// Ranks on this node.
    pub nproc: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub run_id: String,
    /// ROLE_NAME (torchrun's `--role`, "default" unless given).
    pub role: String,
    /// This node's rank among `nnodes` (GROUP_RANK).
    pub node_rank: usize,
    pub nnodes: usize,
    /// The global rank of this node's local rank 0.
    pub rank_offset: usize,
    /// Ranks on every node.
    pub world_size: usize,
    pub restart_count: u32,
    pub max_restarts: u32,
}

impl Job {
    /// A one-node job of `nproc` ranks.
    pub(crate) fn single(nproc: usize, master_addr: &str, master_port: u16, run_id: String) -> Job {
        Job {
            nproc,
            master_addr: master_addr.to_string(),
            master_port,
            run_id,
            role: DEFAULT_ROLE.to_string(),
            node_rank: 0,
            nnodes: 1,
            rank_offset: 0,
            world_size: nproc,
            restart_count: 0,
            max_restarts: 0,
        }
    }
}

/// torchrun's role name when `--role` is not given.
pub(crate) const DEFAULT_ROLE: &str = "default";

/// torchrun's per-worker variables for local rank `local`.
pub(crate) fn torchrun_env(job: &Job, local: usize) -> BTreeMap<String, String> {
    let n = job.nproc.to_string();
    let world = job.world_size.to_string();
    let global = (job.rank_offset + local).to_string();
    [
        ("RANK", global.clone()),
        ("LOCAL_RANK", local.to_string()),
        ("GROUP_RANK", job.node_rank.to_string()),
        ("ROLE_RANK", global),
        ("ROLE_NAME", job.role.clone()),
        ("LOCAL_WORLD_SIZE", n),
        ("WORLD_SIZE", world.clone()),
        ("GROUP_WORLD_SIZE", job.nnodes.to_string()),
        ("ROLE_WORLD_SIZE", world),
        ("MASTER_ADDR", job.master_addr.clone()),
        ("MASTER_PORT", job.master_port.to_string()),
        ("TORCHELASTIC_RUN_ID", job.run_id.clone()),
        ("TORCHELASTIC_RESTART_COUNT", job.restart_count.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", job.max_restarts.to_string()),
        // Rank 0 hosts the TCPStore itself: there is no agent store.
        ("TORCHELASTIC_USE_AGENT_STORE", "False".to_string()),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_string()),
        (
            "TORCHELASTIC_SIGNALS_TO_HANDLE",
            SIGNALS_TO_HANDLE.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A free TCP port on the loopback (the kernel's choice), for MASTER_PORT.
/// This process's value of `k` (the `Env` the launcher detection and the
/// notes about replaced variables read).
pub(crate) fn current(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// A run id unique enough for one machine: pid and time.
pub(crate) fn run_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("threadwise-{}-{:x}", std::process::id(), t & 0xffff_ffff)
}

/// Variables a launch sets that the user's environment already had with another
/// value: (name, theirs, ours).
pub(crate) fn overridden(
    set: &BTreeMap<String, String>,
    current: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String, String)> {
    set.iter()
        .filter_map(|(k, v)| {
            let old = current(k)?;
            (old != *v).then(|| (k.clone(), old, v.clone()))
        })
        .collect()
}

/// What torchrun's agent tells ranks about signals it handles.
pub(crate) const SIGNALS_TO_HANDLE: &str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

/// Where rank `local` records its exception (torch's `@record` writes
/// `TORCHELASTIC_ERROR_FILE`): `rank-K.error.json` in `dir`.
pub(crate) fn error_file(dir: &std::path::Path, local: usize) -> std::path::PathBuf {
    dir.join(format!("rank-{local}.error.json"))
}

/// The exception a rank recorded, as torchrun prints its root cause: the
/// message, then the traceback. None when the file is absent or not torch's.
pub(crate) fn recorded_error(path: &std::path::Path) -> Option<String> {
    use crate::topology::fsread::{MAX_SYSFS_FILE, read_bounded};
    let text = read_bounded(path, MAX_SYSFS_FILE).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let m = &v["message"];
    // Python errors: {"message": {"message": "...", "extraInfo": {"py_callstack": ...}}};
    // errors from C++ keep a plain string.
    let (message, trace) = match m {
        serde_json::Value::String(s) => (s.clone(), None),
        o => (
            o["message"].as_str()?.to_string(),
            o["extraInfo"]["py_callstack"].as_str().map(str::to_string),
        ),
    };
    let mut out = message;
    if let Some(t) = trace.filter(|t| !t.trim().is_empty()) {
        out.push('\n');
        out.push_str(t.trim_end());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_and_overrides() {
        let job = Job::single(4, "127.0.0.1", 29500, "x".into());
        let e = torchrun_env(&job, 2);
        assert_eq!(e["RANK"], "2");
        assert_eq!(e["LOCAL_WORLD_SIZE"], "4");
        assert_eq!(e["MASTER_PORT"], "29500");
        for k in [
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "ROLE_RANK",
            "ROLE_WORLD_SIZE",
            "ROLE_NAME",
            "TORCHELASTIC_RUN_ID",
        ] {
            assert!(e.contains_key(k), "{k}");
        }
        let cur = |k: &str| (k == "RANK").then(|| "7".to_string());
        assert_eq!(
            overridden(&e, &cur),
            vec![("RANK".into(), "7".into(), "2".into())]
        );
        assert!(free_port().unwrap() > 0);
    }

    #[test]
    fn second_node_of_three_counts_global_ranks() {
        let job = Job {
            node_rank: 1,
            nnodes: 3,
            rank_offset: 2,
            world_size: 6,
            restart_count: 1,
            max_restarts: 2,
            ..Job::single(2, "10.0.0.1", 29500, "r".into())
        };
        let e = torchrun_env(&job, 1);
        let got: Vec<&str> = [
            "RANK",
            "LOCAL_RANK",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "ROLE_RANK",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
        ]
        .iter()
        .map(|k| e[*k].as_str())
        .collect();
        assert_eq!(got, ["3", "1", "1", "3", "6", "2", "3", "1", "2"]);
    }

    #[test]
    fn recorded_errors_in_both_shapes() {
        let d = tempfile::tempdir().unwrap();
        let f = error_file(d.path(), 1);
        assert_eq!(recorded_error(&f), None);
        std::fs::write(
            &f,
            r#"{"message": {"message": "ValueError: bad lr", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nValueError: bad lr\n", "timestamp": "1"}}}"#,
        )
        .unwrap();
        let e = recorded_error(&f).unwrap();
        assert!(e.starts_with("ValueError: bad lr\nTraceback"), "{e}");
        std::fs::write(&f, r#"{"message": "c10::Error: CUDA out of memory"}"#).unwrap();
        assert_eq!(
            recorded_error(&f).unwrap(),
            "c10::Error: CUDA out of memory"
        );
        std::fs::write(&f, "not json").unwrap();
        assert_eq!(recorded_error(&f), None);
    }
}
