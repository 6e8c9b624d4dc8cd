//! What one node of a `tune --nnodes` trial used, as its agent reports it
//! (a wire type of the rendezvous, and what tune's model reads).

use serde::{Deserialize, Serialize};

/// One node's part of a multi-node trial, as its agent reported it
/// (`threadwise run --report-node`, in its `Report`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeUsage {
    pub host: String,
    pub node_rank: usize,
    pub ranks: usize,
    pub wall_s: f64,
    /// CPU seconds of the node's ranks and their children.
    pub cpu_s: f64,
    /// The node's CPU budget (allowed CPUs capped by its cgroup quota).
    pub cpu_budget: f64,
    pub voluntary_cs: i64,
    pub involuntary_cs: i64,
    pub peak_rss_kib: i64,
    /// Mean utilisation of the node's GPUs that the plan used, where NVML answers.
    pub gpu_util_pct: Option<f64>,
}

impl NodeUsage {
    /// CPU % of the node's budget.
    pub(crate) fn cpu_util_pct(&self) -> f64 {
        100.0 * self.cpu_s / (self.wall_s.max(1e-9) * self.cpu_budget.max(1e-9))
    }
}
