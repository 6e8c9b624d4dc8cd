//! Who may be part of the job: a hello that fits it, the elastic range, and
//! when a newcomer to a running job is admitted.

use std::time::Duration;

use std::time::Instant;

use super::{Coordinator, Out, Phase};
use crate::rdzv::proto::Failure;

/// The most ranks one node may say it runs (one per CPU threadwise plans).
pub(crate) const MAX_NODE_RANKS: usize = crate::cpuset::MAX_CPU;
/// The most nodes of one job.
pub(crate) const MAX_NODES: usize = 1 << 23;
use crate::rdzv::proto::Hello;

impl Coordinator {
    /// An elastic job: from `min` to the `nnodes` given, with `last_call`.
    pub(crate) fn elastic(mut self, min: usize, last_call: Duration) -> Coordinator {
        self.min_nodes = min.clamp(1, self.nnodes);
        self.last_call = last_call;
        self
    }

    pub(super) fn is_elastic(&self) -> bool {
        self.min_nodes < self.nnodes
    }

    /// `--nnodes` as the user wrote it.
    pub(super) fn range(&self) -> String {
        match self.is_elastic() {
            true => format!("{}:{}", self.min_nodes, self.nnodes),
            false => self.nnodes.to_string(),
        }
    }

    /// Why a hello does not fit this job, if it does not. Every count from
    /// the wire is bounded here, so the world's sums cannot wrap and no
    /// rank runs with WORLD_SIZE 0: a node runs 1 to `MAX_NODE_RANKS` ranks,
    /// a job has at most `MAX_NODES` nodes (the world at most their product,
    /// 2^36, far from any overflow).
    pub(super) fn misfit(&self, hello: &Hello) -> Option<String> {
        if hello.nproc == 0 || hello.nproc > MAX_NODE_RANKS {
            return Some(format!(
                "it says it runs {} ranks: a node runs 1 to {MAX_NODE_RANKS}",
                hello.nproc
            ));
        }
        if hello.nnodes == 0 || hello.nnodes > MAX_NODES {
            return Some(format!(
                "--nnodes {}: a job has 1 to {MAX_NODES} nodes",
                hello.nnodes
            ));
        }
        if hello.run_id != self.run_id {
            return Some(format!(
                "run id {:?} differs from the job's {:?} (--rdzv-id)",
                hello.run_id, self.run_id
            ));
        }
        let min = match hello.min_nodes {
            0 => hello.nnodes,
            m => m,
        };
        if hello.nnodes != self.nnodes || min != self.min_nodes {
            let theirs = match min < hello.nnodes {
                true => format!("{min}:{}", hello.nnodes),
                false => hello.nnodes.to_string(),
            };
            return Some(format!(
                "--nnodes {theirs} differs from the rendezvous host's {}",
                self.range()
            ));
        }
        if let Some(r) = hello.node_rank {
            if r >= self.nnodes {
                return Some(format!(
                    "--node-rank {r} is not below --nnodes {}",
                    self.nnodes
                ));
            }
            if let Some(other) = self.nodes.iter().find(|n| n.hello.node_rank == Some(r)) {
                return Some(format!("--node-rank {r} is taken by {}", other.hello.host));
            }
        }
        None
    }

    /// When the coordinator next needs a `tick` before its heartbeat one: a
    /// newcomer's admission.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        if self.phase != Phase::Running {
            return None;
        }
        let ready = self
            .pending
            .iter()
            .map(|n| n.joined_at + ADMIT_AFTER)
            .min()?;
        Some(match self.last_membership {
            Some(last) => ready.max(last + MEMBERSHIP_EVERY),
            None => ready,
        })
    }

    /// Stop a running round for the newcomers that have stayed `ADMIT_AFTER`
    /// (one gone sooner never stops it), at most once every
    /// `MEMBERSHIP_EVERY`: the running ranks restart for membership at most
    /// twice a minute, however nodes come and go.
    pub(super) fn admit_pending(&mut self, now: Instant) -> Vec<Out> {
        if self.wake_at().is_none_or(|at| now < at) {
            return vec![];
        }
        self.last_membership = Some(now);
        let members = self.nodes.iter().filter(|n| !n.lost).count() + self.pending.len();
        let hosts: Vec<&str> = self.pending.iter().map(|n| n.hello.host.as_str()).collect();
        let f = Failure {
            round: self.round,
            cause: format!(
                "{} joined: the ranks restart with {members} node(s)",
                hosts.join(", ")
            ),
            code: 0,
            restartable: true,
        };
        self.stop_round(None, f, false)
    }
}

/// How long a node that joins a running elastic job must stay before the
/// running ranks stop for it: one that leaves right after its welcome
/// stops nothing.
pub(crate) const ADMIT_AFTER: Duration = Duration::from_millis(100);
/// The least time between two restarts for membership (joins): at most two
/// in a minute, whatever the churn.
pub(crate) const MEMBERSHIP_EVERY: Duration = Duration::from_secs(30);
