//! How a rank started by another launcher learns its local rank and the number
//! of ranks on its node (the table in shared/design/anchors.md).

use crate::launch::LaunchError;

/// What the launcher told this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launcher {
    pub name: &'static str,
    pub local_rank: usize,
    pub local_size: usize,
    /// Whether this launcher binds each rank itself (its affinity mask is then
    /// the rank's, not the node's: the node plan must not start from it).
    pub binds_ranks: bool,
    /// Global rank and world size, when the launcher gives them.
    pub global: Option<(usize, usize)>,
}

fn num(env: Env, var: &str) -> Result<Option<usize>, LaunchError> {
    match env(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| LaunchError::Launcher(format!("{var}={v:?} is not a number"))),
    }
}

const MAX_NODES_IN_JOB: usize = 1 << 20;

/// Expand SLURM_TASKS_PER_NODE ("2(x3),1") into one count per node.
pub(crate) fn slurm_tasks_per_node(text: &str) -> Result<Vec<usize>, LaunchError> {
    let bad = || {
        LaunchError::Launcher(format!(
            "SLURM_TASKS_PER_NODE={text:?} is not like \"2(x3),1\""
        ))
    };
    let mut out = vec![];
    for part in text.trim().split(',') {
        let (count, times) = match part.split_once("(x") {
            Some((c, rest)) => (c, rest.strip_suffix(')').ok_or_else(bad)?),
            None => (part, "1"),
        };
        let c: usize = count.parse().map_err(|_| bad())?;
        let t: usize = times.parse().map_err(|_| bad())?;
        // No job has a million nodes: the bound keeps "1(x1048576)" x 10000 cheap.
        if out.len().saturating_add(t) > MAX_NODES_IN_JOB {
            return Err(LaunchError::Launcher(format!(
                "SLURM_TASKS_PER_NODE={:?} lists more than {MAX_NODES_IN_JOB} nodes",
                crate::export::quote(&text[..text.len().min(80)])
            )));
        }
        out.extend(std::iter::repeat_n(c, t));
    }
    Ok(out)
}

/// Launchers that name the local rank and size directly, in the order they are
/// looked for (torchrun first: under srun + torchrun both are set), with the
/// variables of the global rank and size, and whether they bind ranks.
const DIRECT: &[(&str, &str, &str, &str, &str, bool)] = &[
    (
        "torchrun",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "RANK",
        "WORLD_SIZE",
        false,
    ),
    (
        "Open MPI",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        true,
    ),
    (
        "MVAPICH",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        true,
    ),
    (
        "MPICH/Intel MPI",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "PMI_RANK",
        "PMI_SIZE",
        true,
    ),
    (
        "Cray PALS",
        "PALS_LOCAL_RANKID",
        "PMI_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        true,
    ),
    (
        "Cray PALS",
        "PMI_LOCAL_RANK",
        "PMI_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        true,
    ),
];

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Slurm: the local size is this node's entry of SLURM_TASKS_PER_NODE.
fn slurm(env: Env, local_rank: usize) -> Result<Launcher, LaunchError> {
    let per_node = env("SLURM_TASKS_PER_NODE").ok_or_else(|| {
        LaunchError::Launcher("Slurm: SLURM_LOCALID is set but SLURM_TASKS_PER_NODE is not".into())
    })?;
    let counts = slurm_tasks_per_node(&per_node)?;
    let node = num(env, "SLURM_NODEID")?.unwrap_or(0);
    let local_size = *counts.get(node).ok_or_else(|| {
        LaunchError::Launcher(format!(
            "Slurm: SLURM_NODEID={node} but SLURM_TASKS_PER_NODE={per_node:?} lists {} nodes",
            counts.len()
        ))
    })?;
    let global = match (num(env, "SLURM_PROCID")?, num(env, "SLURM_NTASKS")?) {
        (Some(r), Some(w)) => Some((r, w)),
        _ => None,
    };
    Ok(Launcher {
        name: "Slurm",
        local_rank,
        local_size,
        binds_ranks: true,
        global,
    })
}

/// Detect the launcher from an environment lookup.
pub(crate) fn detect(env: Env) -> Result<Launcher, LaunchError> {
    let mut found = None;
    for &(name, rank, size, grank, gsize, binds) in DIRECT {
        match (num(env, rank)?, num(env, size)?) {
            (Some(local_rank), Some(local_size)) => {
                let global = match (num(env, grank)?, num(env, gsize)?) {
                    (Some(r), Some(w)) => Some((r, w)),
                    _ => None,
                };
                found = Some(Launcher {
                    name,
                    local_rank,
                    local_size,
                    binds_ranks: binds,
                    global,
                });
                break;
            }
            (Some(_), None) => {
                return Err(LaunchError::Launcher(format!(
                    "{name}: {rank} is set but {size} is not"
                )));
            }
            _ => {}
        }
    }
    let found = match (found, num(env, "SLURM_LOCALID")?) {
        (Some(l), _) => l,
        (None, Some(local_rank)) => slurm(env, local_rank)?,
        (None, None) => {
            return Err(LaunchError::Launcher(
                "no launcher environment found (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, \
                 MPI_LOCALRANKID, PALS_LOCAL_RANKID/PMI_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK)"
                    .into(),
            ));
        }
    };
    if found.local_size > crate::cpuset::MAX_CPU {
        return Err(LaunchError::Launcher(format!(
            "{}: {} ranks on one node; threadwise plans at most {} (one per CPU)",
            found.name,
            found.local_size,
            crate::cpuset::MAX_CPU
        )));
    }
    if found.local_size == 0 || found.local_rank >= found.local_size {
        return Err(LaunchError::Launcher(format!(
            "{}: local rank {} is not below the local size {}",
            found.name, found.local_rank, found.local_size
        )));
    }
    Ok(found)
}

/// The CPUs Slurm gave this step on this node, from the binding it applied to
/// each task (SLURM_CPU_BIND_TYPE mask_cpu/map_cpu with SLURM_CPU_BIND_LIST):
/// their union is the job's set here, the same for every task.
pub(crate) fn slurm_node_cpus(
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<crate::cpuset::CpuSet> {
    let kind = env("SLURM_CPU_BIND_TYPE")?;
    let list = env("SLURM_CPU_BIND_LIST")?;
    let mut all = crate::cpuset::CpuSet::new();
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let set = if kind.starts_with("mask_cpu") {
            crate::cpuset::CpuSet::parse_hex(item).ok()?
        } else if kind.starts_with("map_cpu") {
            let cpu = item.trim().parse::<usize>().ok()?;
            if cpu > crate::cpuset::MAX_CPU {
                return None;
            }
            std::iter::once(cpu).collect()
        } else {
            return None;
        };
        all = all.union(&set);
    }
    (!all.is_empty()).then_some(all)
}

/// The first host of a Slurm node list ("gpu[01-04,7],login" -> "gpu01";
/// "rack[1-2]-n[08-09]" -> "rack1-n08"), zero padding kept.
pub(crate) fn first_host(list: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let group: String = chars.by_ref().take_while(|c| *c != ']').collect();
                let first = group.split([',', '-']).next()?.trim();
                if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                out.push_str(first);
            }
            c => out.push(c),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The last `n` (at most 4) digits of a Slurm job id as a number, for
/// ports every task and node of the job derive alike.
pub(crate) fn job_id_tail(id: &str, n: usize) -> Option<u16> {
    let digits: String = id.chars().filter(char::is_ascii_digit).collect();
    digits[digits.len().saturating_sub(n.min(4))..].parse().ok()
}

/// Under Slurm, what torch's env:// needs and srun does not give: MASTER_ADDR
/// from the step's first node and MASTER_PORT from the job id (15000 + its
/// last four digits, as Lightning does, so every task of the job agrees).
/// Each is None when already set or not derivable.
pub(crate) fn slurm_master(env: Env) -> (Option<String>, Option<u16>) {
    if env("SLURM_JOB_ID").is_none() && env("SLURM_STEP_NODELIST").is_none() {
        return (None, None);
    }
    let addr = env("MASTER_ADDR").is_none().then(|| {
        env("SLURM_STEP_NODELIST")
            .or_else(|| env("SLURM_JOB_NODELIST"))
            .or_else(|| env("SLURM_NODELIST"))
            .and_then(|l| first_host(&l))
    });
    let port = env("MASTER_PORT")
        .is_none()
        .then(|| Some(15000 + job_id_tail(&env("SLURM_JOB_ID")?, 4)?));
    (addr.flatten(), port.flatten())
}

/// Inside an srun step of one task per node across `nnodes` nodes (one
/// agent per node, as `srun -N2 --ntasks-per-node=1 threadwise run` starts
/// them, and as tune's trials do): the node's place in the step, as Slurm
/// numbers it (SLURM_NODEID, Lightning's node rank too).
pub(crate) fn slurm_node_rank(env: Env, nnodes: usize) -> Option<usize> {
    let num = |k: &str| env(k).and_then(|v| v.trim().parse::<usize>().ok());
    env("SLURM_STEP_ID")?;
    let nodes = num("SLURM_STEP_NUM_NODES")?;
    (nodes == nnodes && num("SLURM_STEP_NUM_TASKS")? == nodes)
        .then(|| num("SLURM_NODEID"))
        .flatten()
        .filter(|r| *r < nnodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_rank_of_one_agent_per_node_under_srun() {
        let step = [
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_NODEID", "1"),
        ];
        assert_eq!(slurm_node_rank(&env_of(&step), 2), Some(1));
        // Another node count, several tasks per node, or no step: no rank.
        assert_eq!(slurm_node_rank(&env_of(&step), 3), None);
        let mut many = step;
        many[2] = ("SLURM_STEP_NUM_TASKS", "4");
        assert_eq!(slurm_node_rank(&env_of(&many), 2), None);
        assert_eq!(slurm_node_rank(&env_of(&step[1..]), 2), None);
        let mut bad = step;
        bad[3] = ("SLURM_NODEID", "7");
        assert_eq!(slurm_node_rank(&env_of(&bad), 2), None);
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    #[test]
    fn each_launcher() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, usize, usize);
        let cases: &[Case] = &[
            (
                &[
                    ("LOCAL_RANK", "1"),
                    ("LOCAL_WORLD_SIZE", "4"),
                    ("SLURM_LOCALID", "0"),
                ],
                "torchrun",
                1,
                4,
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ],
                "Open MPI",
                0,
                2,
            ),
            (
                &[("MPI_LOCALRANKID", "3"), ("MPI_LOCALNRANKS", "8")],
                "MPICH/Intel MPI",
                3,
                8,
            ),
            (
                &[("PALS_LOCAL_RANKID", "1"), ("PMI_LOCAL_SIZE", "2")],
                "Cray PALS",
                1,
                2,
            ),
            (
                &[
                    ("MV2_COMM_WORLD_LOCAL_RANK", "1"),
                    ("MV2_COMM_WORLD_LOCAL_SIZE", "2"),
                ],
                "MVAPICH",
                1,
                2,
            ),
            (
                &[
                    ("SLURM_LOCALID", "1"),
                    ("SLURM_TASKS_PER_NODE", "2(x3),1"),
                    ("SLURM_NODEID", "2"),
                ],
                "Slurm",
                1,
                2,
            ),
        ];
        for (env, name, rank, size) in cases {
            let l = detect(&env_of(env)).unwrap();
            assert_eq!((l.name, l.local_rank, l.local_size), (*name, *rank, *size));
        }
    }

    #[test]
    fn slurm_node_lists_give_their_first_host() {
        assert_eq!(first_host("host[0-1]").as_deref(), Some("host0"));
        assert_eq!(first_host("gpu[01-04,7],login").as_deref(), Some("gpu01"));
        assert_eq!(first_host("login,gpu[1-2]").as_deref(), Some("login"));
        assert_eq!(
            first_host("rack[1-2]-n[08-09]").as_deref(),
            Some("rack1-n08")
        );
        assert_eq!(first_host("node7").as_deref(), Some("node7"));
        assert_eq!(first_host("bad[x-y]"), None);
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn slurm_master_from_the_step_and_job_id_unless_set() {
        let vars = [
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_STEP_NODELIST", "host[3-4]"),
        ];
        let env = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        assert_eq!(slurm_master(&env), (Some("host3".into()), Some(18456)));
        let set = |k: &str| match k {
            "MASTER_ADDR" => Some("x".to_string()),
            "MASTER_PORT" => Some("1".to_string()),
            k => env(k),
        };
        assert_eq!(slurm_master(&set), (None, None));
        assert_eq!(slurm_master(&|_: &str| None), (None, None));
    }

    #[test]
    fn global_rank_and_size() {
        let l = detect(&env_of(&[
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
        ]))
        .unwrap();
        assert_eq!(l.global, Some((5, 8)));
        assert!(l.binds_ranks);
        let l = detect(&env_of(&[
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "2"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
        ]))
        .unwrap();
        assert_eq!(l.global, Some((2, 4)));
        let l = detect(&env_of(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")])).unwrap();
        assert_eq!((l.global, l.binds_ranks), (None, false));
    }

    #[test]
    fn clear_errors() {
        let e = |pairs: &[(&str, &str)]| detect(&env_of(pairs)).unwrap_err().to_string();
        assert!(e(&[]).contains("no launcher environment"));
        assert!(
            e(&[("LOCAL_RANK", "x"), ("LOCAL_WORLD_SIZE", "2")])
                .contains("LOCAL_RANK=\"x\" is not a number")
        );
        assert!(e(&[("LOCAL_RANK", "0")]).contains("LOCAL_WORLD_SIZE is not"));
        let huge = u64::MAX.to_string();
        assert!(e(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", &huge)]).contains("at most 8192"));
        let many = vec!["1(x1048576)"; 10000].join(",");
        assert!(
            e(&[("SLURM_LOCALID", "0"), ("SLURM_TASKS_PER_NODE", &many)]).contains("more than")
        );
        let env = |k: &str| match k {
            "SLURM_CPU_BIND_TYPE" => Some("map_cpu:".to_string()),
            "SLURM_CPU_BIND_LIST" => Some(format!("0,{}", u64::MAX)),
            _ => None,
        };
        assert_eq!(slurm_node_cpus(&env), None, "an id past any CPU is no plan");
        assert!(e(&[("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]).contains("not below"));
        assert!(
            e(&[("SLURM_LOCALID", "0"), ("SLURM_TASKS_PER_NODE", "2(x")])
                .contains("SLURM_TASKS_PER_NODE")
        );
        assert_eq!(slurm_tasks_per_node("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        let s = |t: &str, l: &str| {
            slurm_node_cpus(&env_of(&[
                ("SLURM_CPU_BIND_TYPE", t),
                ("SLURM_CPU_BIND_LIST", l),
            ]))
            .map(|c| c.to_string())
        };
        assert_eq!(s("mask_cpu:", "0x1,0x2").as_deref(), Some("0-1"));
        assert_eq!(s("map_cpu:", "4,6").as_deref(), Some("4,6"));
        assert_eq!(s("none", ""), None);
        assert_eq!(s("mask_cpu:", "0xzz"), None);
    }
}
