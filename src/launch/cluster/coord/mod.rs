//! The rendezvous host's decisions, pure: which nodes joined, which node
//! rank each gets, when a round starts, stops, restarts or ends, which node
//! is lost. Events in (a node joined, said something, went silent), messages
//! out; `server.rs` does the sockets and the clock. Unit tests drive it with
//! made-up nodes and instants.

use std::time::{Duration, Instant};

use super::proto::{Failure, Hello, Report, Start, ToAgent};

/// A connection's id, given by the server.
pub(crate) type Conn = usize;

/// A node that joined the job.
#[derive(Debug, Clone)]
struct Member {
    conn: Conn,
    hello: Hello,
    /// The address the node connected from (MASTER_ADDR when it is node 0).
    addr: String,
    node_rank: usize,
    last_seen: Instant,
    ended: bool,
    lost: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Joining {
        since: Instant,
    },
    Running,
    /// The round is stopping: why, the job's exit code, and whether a restart may follow.
    Stopping {
        failure: Failure,
    },
    Over,
}

/// What the rendezvous host knows.
#[derive(Debug)]
pub(crate) struct Coordinator {
    nnodes: usize,
    run_id: String,
    max_restarts: u32,
    master_port: Option<u16>,
    join_timeout: Duration,
    heartbeat_timeout: Duration,
    nodes: Vec<Member>,
    phase: Phase,
    round: u32,
    /// The nodes' reports of the latest round that sent any.
    reports: Vec<(u32, Report)>,
    /// This host's address as a node on another host reached it: node 0's
    /// MASTER_ADDR when node 0 is this host's own agent, which connected
    /// over loopback (an endpoint of `localhost`, as TorchX gives node 0).
    reached_at: Option<String>,
}

/// A message for one connection; `close` after sending it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Out {
    pub conn: Conn,
    pub msg: ToAgent,
    pub close: bool,
}

impl Coordinator {
    pub(crate) fn new(
        nnodes: usize,
        run_id: &str,
        max_restarts: u32,
        master_port: Option<u16>,
        join_timeout: Duration,
        heartbeat_timeout: Duration,
        now: Instant,
    ) -> Coordinator {
        Coordinator {
            nnodes,
            run_id: run_id.to_string(),
            max_restarts,
            master_port,
            join_timeout,
            heartbeat_timeout,
            nodes: vec![],
            phase: Phase::Joining { since: now },
            round: 0,
            reports: vec![],
            reached_at: None,
        }
    }

    /// The job's run id (every node's hello must carry it).
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    /// A node on another host reached this host at `local`.
    pub(crate) fn reached_at(&mut self, local: &str) {
        if self.reached_at.is_none() {
            self.reached_at = Some(local.to_string());
        }
    }

    /// MASTER_ADDR: node 0's address as the others reach it.
    fn master_addr(&self) -> String {
        let first = &self.nodes[0].addr;
        let loopback = first
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
        match &self.reached_at {
            Some(a) if loopback => a.clone(),
            _ => first.clone(),
        }
    }

    /// A node's report of a round (kept by node rank; an earlier round's are dropped).
    pub(crate) fn report(&mut self, conn: Conn, round: u32, report: Report) {
        let Some(i) = self.index(conn) else {
            return;
        };
        let mut report = report;
        // The node rank is ours to say, not the node's.
        report.usage.node_rank = self.nodes[i].node_rank;
        self.reports.retain(|(r, _)| *r == round);
        self.reports
            .retain(|(_, x)| x.usage.node_rank != report.usage.node_rank);
        self.reports.push((round, report));
        self.reports.sort_by_key(|(_, x)| x.usage.node_rank);
    }

    /// The latest round's reports, by node rank.
    pub(crate) fn reports(&self) -> Vec<Report> {
        self.reports.iter().map(|(_, r)| r.clone()).collect()
    }

    /// The job is over: every node was told how it ended.
    pub(crate) fn over(&self) -> bool {
        self.phase == Phase::Over
    }

    /// The live connections (for heartbeats).
    pub(crate) fn live(&self) -> Vec<Conn> {
        self.nodes
            .iter()
            .filter(|n| !n.lost)
            .map(|n| n.conn)
            .collect()
    }

    fn refuse(conn: Conn, why: String) -> Vec<Out> {
        vec![Out {
            conn,
            msg: ToAgent::Refused { why },
            close: true,
        }]
    }

    /// A node said hello from `addr`.
    pub(crate) fn join(&mut self, conn: Conn, hello: Hello, addr: &str, now: Instant) -> Vec<Out> {
        if !matches!(self.phase, Phase::Joining { .. }) {
            return Self::refuse(
                conn,
                format!(
                    "the job has already started with its {} node(s)",
                    self.nnodes
                ),
            );
        }
        if hello.run_id != self.run_id {
            return Self::refuse(
                conn,
                format!(
                    "run id {:?} differs from the job's {:?} (--rdzv-id)",
                    hello.run_id, self.run_id
                ),
            );
        }
        if hello.nnodes != self.nnodes {
            return Self::refuse(
                conn,
                format!(
                    "--nnodes {} differs from the rendezvous host's {}",
                    hello.nnodes, self.nnodes
                ),
            );
        }
        if let Some(r) = hello.node_rank {
            if r >= self.nnodes {
                return Self::refuse(
                    conn,
                    format!("--node-rank {r} is not below --nnodes {}", self.nnodes),
                );
            }
            if let Some(other) = self.nodes.iter().find(|n| n.hello.node_rank == Some(r)) {
                return Self::refuse(
                    conn,
                    format!("--node-rank {r} is taken by {}", other.hello.host),
                );
            }
        }
        self.nodes.push(Member {
            conn,
            hello,
            addr: addr.to_string(),
            node_rank: 0,
            last_seen: now,
            ended: false,
            lost: false,
        });
        if self.nodes.len() < self.nnodes {
            return vec![];
        }
        self.assign_ranks();
        self.start()
    }

    /// Node ranks: the ones asked for, then the rendezvous host's own node,
    /// then the rest in the order they joined.
    fn assign_ranks(&mut self) {
        let mut free: Vec<usize> = (0..self.nnodes)
            .filter(|r| !self.nodes.iter().any(|n| n.hello.node_rank == Some(*r)))
            .collect();
        free.reverse();
        let mut order: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].hello.node_rank.is_none())
            .collect();
        order.sort_by_key(|&i| !self.nodes[i].hello.hosting);
        for i in 0..self.nodes.len() {
            if let Some(r) = self.nodes[i].hello.node_rank {
                self.nodes[i].node_rank = r;
            }
        }
        for i in order {
            self.nodes[i].node_rank = free.pop().unwrap_or(0);
        }
        self.nodes.sort_by_key(|n| n.node_rank);
    }

    /// Start a round on every node.
    fn start(&mut self) -> Vec<Out> {
        self.phase = Phase::Running;
        let world: usize = self.nodes.iter().map(|n| n.hello.nproc).sum();
        let master_addr = self.master_addr();
        let first = &self.nodes[0];
        let master_port = self.master_port.unwrap_or(first.hello.port);
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.hello.host.clone()).collect();
        let mut offset = 0;
        let mut out = vec![];
        for n in &mut self.nodes {
            n.ended = false;
            out.push(Out {
                conn: n.conn,
                msg: ToAgent::Start(Start {
                    round: self.round,
                    node_rank: n.node_rank,
                    nnodes: self.nnodes,
                    rank_offset: offset,
                    world_size: world,
                    master_addr: master_addr.clone(),
                    master_port,
                    max_restarts: self.max_restarts,
                    hosts: hosts.clone(),
                }),
                close: false,
            });
            offset += n.hello.nproc;
        }
        out
    }

    fn index(&self, conn: Conn) -> Option<usize> {
        self.nodes.iter().position(|n| n.conn == conn)
    }

    /// Any message from `conn` shows it is alive.
    pub(crate) fn seen(&mut self, conn: Conn, now: Instant) {
        if let Some(i) = self.index(conn) {
            self.nodes[i].last_seen = now;
        }
    }

    /// The first failure of a round stops it on every other node.
    pub(crate) fn failed(&mut self, conn: Conn, f: Failure) -> Vec<Out> {
        // Only a node of the job can fail it (a refused peer's word is nothing).
        if self.index(conn).is_none() || self.phase != Phase::Running || f.round != self.round {
            return vec![];
        }
        self.phase = Phase::Stopping { failure: f.clone() };
        self.nodes
            .iter()
            .filter(|n| n.conn != conn && !n.lost && !n.ended)
            .map(|n| Out {
                conn: n.conn,
                msg: ToAgent::Stop {
                    round: self.round,
                    cause: f.cause.clone(),
                },
                close: false,
            })
            .collect()
    }

    /// A node's ranks all ended in `round`; `port` is free on it for the next.
    pub(crate) fn ended(&mut self, conn: Conn, round: u32, code: i32, port: u16) -> Vec<Out> {
        let Some(i) = self.index(conn) else {
            return vec![];
        };
        if round != self.round {
            return vec![];
        }
        self.nodes[i].ended = true;
        self.nodes[i].hello.port = port;
        if code != 0 && self.phase == Phase::Running {
            // A failure the node did not report first: its ranks could not
            // start (the agent ends the round with the launch error's code).
            let host = self.nodes[i].hello.host.clone();
            let mut out = self.failed(
                conn,
                Failure {
                    round,
                    cause: format!("{host}: its ranks ended with code {code}"),
                    code,
                    restartable: true,
                },
            );
            out.extend(self.round_over());
            return out;
        }
        self.round_over()
    }

    /// A node is gone: its connection closed or it went silent.
    pub(crate) fn lost(&mut self, conn: Conn, why: &str) -> Vec<Out> {
        let Some(i) = self.index(conn) else {
            return vec![];
        };
        if let Phase::Joining { .. } = self.phase {
            // Gone before the job started: it never counted.
            self.nodes.remove(i);
            return vec![];
        }
        if self.nodes[i].lost || self.phase == Phase::Over {
            return vec![];
        }
        self.nodes[i].lost = true;
        let host = self.nodes[i].hello.host.clone();
        let node_rank = self.nodes[i].node_rank;
        // While stopping, the first failure stays the cause; round_over
        // allows no restart once a node is lost.
        let mut out = vec![];
        if self.phase == Phase::Running {
            let f = Failure {
                round: self.round,
                cause: format!("node {node_rank} ({host}) was lost: {why}"),
                code: 1,
                restartable: false,
            };
            out = self.failed(conn, f);
        }
        out.extend(self.round_over());
        out
    }

    /// Once every live node ended the round: restart, or end the job.
    fn round_over(&mut self) -> Vec<Out> {
        if self.nodes.iter().any(|n| !n.lost && !n.ended) {
            return vec![];
        }
        let any_lost = self.nodes.iter().any(|n| n.lost);
        match self.phase.clone() {
            Phase::Stopping { failure }
                if failure.restartable && !any_lost && self.round < self.max_restarts =>
            {
                self.round += 1;
                self.start()
            }
            Phase::Stopping { failure } => self.end(failure.code, Some(failure.cause)),
            Phase::Running => self.end(0, None),
            _ => vec![],
        }
    }

    fn end(&mut self, code: i32, cause: Option<String>) -> Vec<Out> {
        self.phase = Phase::Over;
        self.nodes
            .iter()
            .filter(|n| !n.lost)
            .map(|n| Out {
                conn: n.conn,
                msg: ToAgent::End {
                    code,
                    cause: cause.clone(),
                },
                close: true,
            })
            .collect()
    }

    /// Time passed: nodes silent too long are lost; a rendezvous that waited
    /// too long ends.
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Out> {
        if let Phase::Joining { since } = self.phase {
            if now.duration_since(since) >= self.join_timeout {
                let joined: Vec<String> = self.nodes.iter().map(|n| n.hello.host.clone()).collect();
                let why = format!(
                    "only {} of {} node(s) joined in {} s ({})",
                    joined.len(),
                    self.nnodes,
                    self.join_timeout.as_secs(),
                    if joined.is_empty() {
                        "none".to_string()
                    } else {
                        joined.join(", ")
                    }
                );
                self.phase = Phase::Over;
                return self
                    .nodes
                    .iter()
                    .map(|n| Out {
                        conn: n.conn,
                        msg: ToAgent::Incomplete { why: why.clone() },
                        close: true,
                    })
                    .collect();
            }
            return vec![];
        }
        let silent: Vec<(Conn, u64)> = self
            .nodes
            .iter()
            .filter(|n| !n.lost && now.duration_since(n.last_seen) >= self.heartbeat_timeout)
            .map(|n| (n.conn, now.duration_since(n.last_seen).as_secs()))
            .collect();
        let mut out = vec![];
        for (conn, secs) in silent {
            out.extend(self.lost(conn, &format!("no heartbeat for {secs} s")));
        }
        out
    }
}

#[cfg(test)]
mod tests;
