//! Multi-node `run`: threadwise stays the supervisor on every node. Each
//! node's agent joins a rendezvous at `--rdzv-endpoint` (hosted by the agent
//! on the node that owns that address, as torchrun's c10d backend does),
//! learns its node rank, the world size and MASTER_ADDR/MASTER_PORT (node 0's
//! address and a port free there), and starts its own ranks with the
//! single-node supervisor: prefixed output, logs, the job cgroup and
//! watchdog, moved DataLoader workers, the failing rank's exit code. The
//! ranks' own process group (torch.distributed's TCPStore at MASTER_ADDR) is
//! torch's, as under torchrun.
//!
//! What crosses nodes is ours (`proto`): heartbeats both ways every second,
//! the first failure (a rank's end, or a user's signal), stop, restart
//! (`--max-restarts`) and end. A node silent for the heartbeat timeout is
//! lost and ends the job on every other node, naming it.

pub(crate) mod agent;
pub(crate) mod auth;
pub(crate) mod coord;
pub(crate) mod local;
pub(crate) mod proto;
mod server;
pub(crate) mod state;
#[cfg(test)]
mod tests;

use crate::error::{Hinted, Kind};
pub(crate) use agent::{AgentConfig, RoundEnd, run};
pub(crate) use proto::{Report, Start};
pub(crate) use server::Hosted;

/// Host a rendezvous on `listener` without taking part (`tune --nnodes`
/// hosts each trial's, to hear the nodes' reports): no restarts, MASTER_PORT
/// from node 0.
pub(crate) fn host(
    listener: std::net::TcpListener,
    nnodes: usize,
    run_id: &str,
    join_timeout: std::time::Duration,
    heartbeat_timeout: std::time::Duration,
    auth: auth::Auth,
) -> std::io::Result<Hosted> {
    let coord = coord::Coordinator::new(
        nnodes,
        run_id,
        0,
        None,
        join_timeout,
        heartbeat_timeout,
        std::time::Instant::now(),
    );
    server::start(listener, coord, auth)
}

/// How a multi-node job ended for this node.
#[derive(Debug, Clone)]
pub(crate) struct JobEnd {
    /// The job's exit code: 0, or the first failing rank's own.
    pub code: i32,
    /// The root cause, when it failed: host, rank, pid, signal or code.
    pub cause: Option<String>,
}

/// What stops a node from taking part.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    #[error("cannot resolve the rendezvous endpoint {0}: {1}")]
    Resolve(String, String),
    #[error("the rendezvous host {endpoint} did not answer in {secs} s: {why}")]
    Unreachable {
        endpoint: String,
        secs: u64,
        why: String,
    },
    #[error("the rendezvous refused this node: {0}")]
    Refused(String),
    /// The host at the endpoint did not prove it is this job's.
    #[error("{0}")]
    NotGenuine(String),
    #[error("the job did not form: {0}")]
    Incomplete(String),
    #[error("{0}")]
    Lost(String),
    #[error("stopped by {}", crate::os::signal_name(*.0))]
    Signal(i32),
    #[error("{0}")]
    Io(String),
}

impl Hinted for ClusterError {
    /// The job never formed, a node was lost, or a signal stopped it.
    fn kind(&self) -> Kind {
        match self {
            ClusterError::Lost(_) => Kind::Lost,
            ClusterError::Signal(s) => Kind::Signal(*s),
            _ => Kind::Environment,
        }
    }

    fn hint(&self) -> String {
        match self {
            ClusterError::Resolve(..) => {
                "give every node an endpoint it can resolve (a host name in /etc/hosts or DNS, or an address)".into()
            }
            ClusterError::Unreachable { .. } => {
                "start threadwise run on the endpoint's host too (it hosts the rendezvous), check \
                 the address and firewall; --rdzv-timeout sets how long to wait"
                    .into()
            }
            ClusterError::Incomplete(_) => {
                "start threadwise run on every node with the same --rdzv-endpoint and --nnodes; \
                 --rdzv-timeout sets how long to wait"
                    .into()
            }
            ClusterError::Refused(_) => {
                "give every node the same --nnodes, --rdzv-id, secret (--rdzv-secret-file or \
                 THREADWISE_RDZV_SECRET) and threadwise version"
                    .into()
            }
            ClusterError::NotGenuine(_) => {
                "check --rdzv-endpoint, and give every node the same secret (or none): something \
                 else answers there, or this node's secret differs from the host's"
                    .into()
            }
            ClusterError::Lost(_) => {
                "this node's ranks were stopped; check the network to the rendezvous host and its \
                 threadwise's output"
                    .into()
            }
            ClusterError::Signal(_) => "".into(),
            ClusterError::Io(_) => "check the machine's limits on threads and sockets".into(),
        }
    }
}
