//! What node agents and the rendezvous host say to each other: one JSON
//! object per line over TCP, so a session can be read with `nc` and a
//! mismatched peer fails on a readable line, not on bytes.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::measure::throughput::Hit;

/// The protocol's name and version, in every hello.
pub(crate) const PROTOCOL: &str = "threadwise.rdzv/2";

/// A node asking to join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub host: String,
    /// Ranks it runs.
    pub nproc: usize,
    pub nnodes: usize,
    /// The node rank it was given (--node-rank), if any.
    pub node_rank: Option<usize>,
    pub run_id: String,
    /// It runs the rendezvous host (node 0 unless ranks were given).
    pub hosting: bool,
    /// A port free on it: MASTER_PORT should it be node 0.
    pub port: u16,
    /// How it authenticates (`auth::Auth::mode`): none, secret or munge.
    #[serde(default)]
    pub auth: String,
    /// Its fresh nonce, for the host's proof.
    #[serde(default)]
    pub nonce: String,
}

/// How a node's part of a round went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub round: u32,
    /// The root-cause line: host, rank, pid, signal or code.
    pub cause: String,
    /// The job's exit code (the failing rank's own).
    pub code: i32,
    /// A rank failed (a restart may follow); not a user's signal.
    pub restartable: bool,
}

/// Where a node stands in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Start {
    pub round: u32,
    pub node_rank: usize,
    pub nnodes: usize,
    pub rank_offset: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub max_restarts: u32,
    /// Every node's host name, by node rank.
    pub hosts: Vec<String>,
}

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

/// What a node reports of a round for `tune --nnodes` (`run --report-node`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    pub usage: NodeUsage,
    /// The throughput global rank 0 printed, on the node that ran it.
    pub hit: Option<Hit>,
}

/// Node to rendezvous host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum ToHost {
    Hello {
        protocol: String,
        hello: Hello,
    },
    Beat,
    /// The agent's proof, answering the host's challenge.
    Proof {
        proof: String,
    },
    Failed(Failure),
    /// The node's use in `round` (sent before its Ended).
    Report {
        round: u32,
        report: Report,
    },
    /// Every rank of the node ended in `round` (`code`: 0 or the failure's).
    Ended {
        round: u32,
        code: i32,
        port: u16,
    },
}

/// Rendezvous host to node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum ToAgent {
    /// The host's proof of the agent's nonce, and its own nonce to prove.
    Challenge {
        nonce: String,
        proof: String,
    },
    /// The node is through the door (authenticated, where the job asks it);
    /// the coordinator may still refuse it.
    Welcome,
    /// Too many connections are waiting to say hello: try again.
    Busy,
    Start(Start),
    Beat,
    /// Stop this round's ranks: the job failed elsewhere.
    Stop {
        round: u32,
        cause: String,
    },
    /// The job is over: exit with `code`.
    End {
        code: i32,
        cause: Option<String>,
    },
    /// The rendezvous would not take this node.
    Refused {
        why: String,
    },
    /// Not every node joined in time.
    Incomplete {
        why: String,
    },
}

/// Write one message as a line.
pub(crate) fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Read one message; None at the end of the stream. Lines over 64 KiB are
/// refused (nothing we send is near that).
pub(crate) fn recv<T: for<'de> Deserialize<'de>>(
    r: &mut impl BufRead,
) -> std::io::Result<Option<T>> {
    let mut line = Vec::new();
    let n = std::io::Read::take(&mut *r, 64 * 1024).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a message line was cut short or over 64 KiB",
        ));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_lines() {
        let msgs = vec![
            ToAgent::Beat,
            ToAgent::Stop {
                round: 2,
                cause: "host1: rank 3 exited with code 1".into(),
            },
            ToAgent::End {
                code: 137,
                cause: None,
            },
        ];
        let mut buf = vec![];
        for m in &msgs {
            send(&mut buf, m).unwrap();
        }
        assert_eq!(buf.iter().filter(|b| **b == b'\n').count(), 3);
        assert!(String::from_utf8_lossy(&buf).starts_with("{\"msg\":\"beat\"}\n"));
        let mut r = std::io::BufReader::new(&buf[..]);
        for m in &msgs {
            assert_eq!(recv::<ToAgent>(&mut r).unwrap().as_ref(), Some(m));
        }
        assert_eq!(recv::<ToAgent>(&mut r).unwrap(), None);
        // Garbage and a cut line are errors, not panics.
        let mut bad = std::io::BufReader::new(&b"hello\n{\"msg\":"[..]);
        assert!(recv::<ToAgent>(&mut bad).is_err());
        assert!(recv::<ToAgent>(&mut bad).is_err());
    }
}
