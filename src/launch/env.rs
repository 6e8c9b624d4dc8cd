//! The torchrun environment contract for ranks that `run` starts itself, so
//! scripts written for torchrun, Lightning, Accelerate or the HF Trainer run
//! unchanged, and the report of what a launch changes in the user's environment.

use std::collections::BTreeMap;

/// Where this node sits in the job (one node for `run`).
#[derive(Debug, Clone)]
pub struct Job {
    pub nproc: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub run_id: String,
}

/// torchrun's per-worker variables for local rank `local`.
pub fn torchrun_env(job: &Job, local: usize) -> BTreeMap<String, String> {
    let n = job.nproc.to_string();
    let l = local.to_string();
    [
        ("RANK", l.clone()),
        ("LOCAL_RANK", l.clone()),
        ("GROUP_RANK", "0".to_string()),
        ("ROLE_RANK", l),
        ("ROLE_NAME", "default".to_string()),
        ("LOCAL_WORLD_SIZE", n.clone()),
        ("WORLD_SIZE", n.clone()),
        ("GROUP_WORLD_SIZE", "1".to_string()),
        ("ROLE_WORLD_SIZE", n),
        ("MASTER_ADDR", job.master_addr.clone()),
        ("MASTER_PORT", job.master_port.to_string()),
        ("TORCHELASTIC_RUN_ID", job.run_id.clone()),
        ("TORCHELASTIC_RESTART_COUNT", "0".to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", "0".to_string()),
        // Rank 0 hosts the TCPStore itself: there is no agent store.
        ("TORCHELASTIC_USE_AGENT_STORE", "False".to_string()),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A free TCP port on the loopback (the kernel's choice), for MASTER_PORT.
pub fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// A run id unique enough for one machine: pid and time.
pub fn run_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("threadwise-{}-{:x}", std::process::id(), t & 0xffff_ffff)
}

/// Variables a launch sets that the user's environment already had with another
/// value: (name, theirs, ours).
pub fn overridden(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_and_overrides() {
        let job = Job {
            nproc: 4,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            run_id: "x".into(),
        };
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
}
