//! Which thread of a rank is which, and where each role runs (pure: the
//! names and masks come from `hold`'s and `top`'s readers, the cores from
//! the topology).
//!
//! A role comes only from evidence: the main thread is the one whose id is
//! the process's; the others by the names their runtime gives them (read with
//! PyTorch 2.15.0 on CPython 3.11.7, and from the strings in its libraries
//! and NCCL 2.30.7: `NAMES`). A thread whose name says nothing (OpenMP's
//! team, Python's own threads before 3.14, anything a library starts
//! without naming it) is `unknown`, never guessed.

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
use crate::topology::Topology;

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum Role ("a thread role,") {
        /// The process's first thread: Python's, the one that launches the
        /// GPU's kernels (the training loop's critical path).
        Main => "main",
        /// The intra-op team (only where it is named: OpenMP's is not).
        IntraOp => "intra-op",
        /// torch's inter-op pool (at::launch, torch.jit.fork).
        InterOp => "inter-op",
        /// autograd's device threads and the distributed autograd engine.
        Autograd => "autograd",
        /// The DataLoader's pin-memory thread.
        PinMemory => "pin-memory",
        /// The communication library's threads (gloo, NCCL, the TCPStore).
        Comm => "comm",
        /// Nothing says what it is.
        Unknown => "unknown",
    }
}

impl Role {
    /// Whether the role is latency-critical: it runs on the service CPUs in
    /// the role layout (the team runs on the rest).
    pub fn is_service(self) -> bool {
        matches!(self, Role::Main | Role::PinMemory | Role::Comm)
    }
}

/// Thread-name prefixes and the role each says, with where the name comes
/// from. Linux keeps 15 bytes of a name, so these are prefixes.
pub(crate) const NAMES: &[(&str, Role, &str)] = &[
    (
        "pt_autograd_",
        Role::Autograd,
        "torch: autograd's device threads",
    ),
    (
        "pt_dist_engine",
        Role::Autograd,
        "torch: distributed autograd",
    ),
    (
        "pt_thread_pool",
        Role::InterOp,
        "torch (c10::ThreadPool): the inter-op pool",
    ),
    (
        "pt_gloo_runloop",
        Role::Comm,
        "torch: ProcessGroupGloo's work threads",
    ),
    ("gloo_tcp_loop", Role::Comm, "gloo: its TCP event loop"),
    ("pt_tcpstore", Role::Comm, "torch: the TCPStore's server"),
    (
        "pt_nccl_",
        Role::Comm,
        "torch: ProcessGroupNCCL's watchdog, heartbeat and hook threads",
    ),
    (
        "NCCL ",
        Role::Comm,
        "NCCL: its service, progress and proxy threads",
    ),
    (
        "Thread-",
        Role::Unknown,
        "CPython 3.14: threading's default names",
    ),
    (
        "tw_intra_op",
        Role::IntraOp,
        "threadwise's built-in workload: its compute team",
    ),
    (
        "tw_comm",
        Role::Comm,
        "threadwise's built-in workload: its all-reduce thread",
    ),
    (
        "tw_feeder",
        Role::Main,
        "threadwise's built-in workload: its kernel-launch-like loop",
    ),
];

/// The role of thread `tid` of process `pid` named `name` (its `comm`),
/// with `hint` the role the process itself said (the Python helper, which
/// knows its own threads: `threading`'s pin-memory thread).
pub(crate) fn classify(pid: i32, tid: i32, name: &str, hint: Option<Role>) -> Role {
    if tid == pid {
        return Role::Main;
    }
    if let Some(h) = hint {
        return h;
    }
    // CPython 3.14 names a threading.Thread "Thread-N (target)", cut to
    // 15 bytes: the DataLoader's "Thread-3 (_pin_".
    if name.contains("(_pin_") {
        return Role::PinMemory;
    }
    NAMES
        .iter()
        .find(|(prefix, _, _)| name.starts_with(prefix))
        .map_or(Role::Unknown, |(_, role, _)| *role)
}

/// Where a rank's roles run in the role layout: the service threads (main,
/// pin-memory, communication) on `service`, everything else on `team`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleCpus {
    pub service: CpuSet,
    pub team: CpuSet,
}

impl RoleCpus {
    /// The CPUs a thread of `role` belongs on.
    pub fn of(&self, role: Role) -> &CpuSet {
        match role.is_service() {
            true => &self.service,
            false => &self.team,
        }
    }
}

/// The role layout of a rank bound to `cpus`: one physical core for the
/// service threads and the rest for the team; on a single core with SMT
/// siblings, one sibling. `Err` says why the rank keeps the whole-rank
/// layout.
pub(crate) fn layout(topo: &Topology, cpus: &CpuSet) -> Result<RoleCpus, String> {
    let cores: Vec<CpuSet> = topo
        .cores
        .iter()
        .map(|c| c.cpus.intersection(cpus))
        .filter(|c| !c.is_empty())
        .collect();
    let service = match cores.as_slice() {
        [] => return Err("it has no CPUs".into()),
        [one] if one.len() < 2 => {
            return Err(format!(
                "one CPU ({cpus}): no core is left for the team once the service threads have one"
            ));
        }
        // One core with SMT: the first sibling serves, the others compute.
        [one] => CpuSet::from_iter(one.first()),
        [first, ..] => first.clone(),
    };
    Ok(RoleCpus {
        team: cpus.difference(&service),
        service,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_come_from_the_names_torch_and_nccl_give() {
        assert_eq!(classify(10, 10, "python3", None), Role::Main);
        assert_eq!(classify(10, 11, "python3", None), Role::Unknown);
        assert_eq!(classify(10, 12, "pt_gloo_runloop", None), Role::Comm);
        assert_eq!(classify(10, 13, "gloo_tcp_loop", None), Role::Comm);
        assert_eq!(classify(10, 14, "pt_autograd_0", None), Role::Autograd);
        assert_eq!(classify(10, 15, "NCCL Service  0", None), Role::Comm);
        assert_eq!(classify(10, 16, "pt_nccl_watchdg", None), Role::Comm);
        assert_eq!(classify(10, 17, "pt_thread_pool", None), Role::InterOp);
        assert_eq!(classify(10, 18, "Thread-3 (_pin_", None), Role::PinMemory);
        assert_eq!(classify(10, 19, "Thread-4 (run)", None), Role::Unknown);
        assert_eq!(
            classify(10, 20, "python3", Some(Role::PinMemory)),
            Role::PinMemory
        );
        // The first thread is main whatever it is called.
        assert_eq!(classify(10, 10, "pt_main_thread", None), Role::Main);
    }

    fn machine(cores: usize, smt: usize) -> Topology {
        crate::topology::synthetic::parse(&format!("core:{cores} pu:{smt}")).unwrap()
    }

    #[test]
    fn the_layout_keeps_one_core_for_the_service_threads() {
        let t = machine(4, 2);
        let all = t.allowed_cpus.clone();
        let l = layout(&t, &all).unwrap();
        assert_eq!(l.service.len(), 2, "{l:?}");
        assert_eq!(l.team.len(), 6);
        assert!(!l.service.intersects(&l.team));
        assert_eq!(l.service.union(&l.team), all);
        // One core with two siblings: one each.
        let core: CpuSet = t.cores[1].cpus.clone();
        let l = layout(&t, &core).unwrap();
        assert_eq!((l.service.len(), l.team.len()), (1, 1));
        // One CPU: too few.
        let one = CpuSet::from_iter(core.first());
        assert!(layout(&t, &one).unwrap_err().contains("one CPU"));
        // Two cores without SMT: one each.
        let t = machine(2, 1);
        let l = layout(&t, &t.allowed_cpus).unwrap();
        assert_eq!((l.service.len(), l.team.len()), (1, 1));
        assert_eq!(*l.of(Role::Main), l.service);
        assert_eq!(*l.of(Role::Unknown), l.team);
        assert_eq!(*l.of(Role::Comm), l.service);
    }
}
