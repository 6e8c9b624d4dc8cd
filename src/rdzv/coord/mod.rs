//! The rendezvous host's decisions, pure: which nodes joined, which node
//! rank each gets, when a round starts, stops, restarts or ends, which node
//! is lost. An elastic job (`--nnodes MIN:MAX`) starts at MAX nodes, or at
//! MIN once the last call has passed; a node that joins a running round is
//! admitted at the next (the round stops for it), and a lost node leaves
//! the survivors to form the next while at least MIN remain. Events in (a
//! node joined, said something, went silent), messages out; `server.rs` does
//! the sockets and the clock. Unit tests drive it with made-up nodes and
//! instants.

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
    /// When it came through the door (a newcomer waits `ADMIT_AFTER`).
    joined_at: Instant,
    last_seen: Instant,
    ended: bool,
    /// Its ranks' code in the round, once ended.
    code: i32,
    lost: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Joining {
        since: Instant,
    },
    Running,
    /// The round is stopping: why, the job's exit code, and whether a restart may follow;
    /// `counts`: the restart it leads to counts against --max-restarts (not
    /// so for a node joining).
    Stopping {
        failure: Failure,
        counts: bool,
    },
    Over,
}

/// What the rendezvous host knows.
#[derive(Debug)]
pub(crate) struct Coordinator {
    /// The most nodes (`--nnodes N`, or MAX).
    nnodes: usize,
    /// The fewest (MIN; `nnodes` for a fixed job).
    min_nodes: usize,
    /// How long an elastic rendezvous waits for more once MIN have joined.
    last_call: Duration,
    /// When MIN nodes were first there, while joining.
    min_since: Option<Instant>,
    /// Nodes that joined a running elastic job: in from the next round.
    pending: Vec<Member>,
    /// Restarts counted against `max_restarts` so far.
    restarts: u32,
    /// When the running ranks last stopped for a newcomer.
    last_membership: Option<Instant>,
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
            min_nodes: nnodes,
            last_call: Duration::ZERO,
            min_since: None,
            pending: vec![],
            restarts: 0,
            last_membership: None,
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
            .chain(&self.pending)
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
        if let Some(why) = self.misfit(&hello) {
            return Self::refuse(conn, why);
        }
        let member = Member {
            conn,
            // The address it names for itself (--local-addr), else the one it came from.
            addr: hello.addr.clone().unwrap_or_else(|| addr.to_string()),
            hello,
            node_rank: 0,
            joined_at: now,
            last_seen: now,
            ended: false,
            code: 0,
            lost: false,
        };
        match self.phase {
            Phase::Joining { .. } => {
                self.nodes.push(member);
                self.joined(now)
            }
            Phase::Running | Phase::Stopping { .. } if self.is_elastic() => {
                let members = self.nodes.iter().filter(|n| !n.lost).count() + self.pending.len();
                if members >= self.nnodes {
                    return Self::refuse(
                        conn,
                        format!(
                            "the job is full: it runs on its most nodes ({} of --nnodes {})",
                            self.nnodes,
                            self.range()
                        ),
                    );
                }
                // Admitted at the next round; the running ranks stop for it
                // only once it has stayed (`admit_pending`, from `tick`).
                self.pending.push(member);
                vec![]
            }
            _ => Self::refuse(
                conn,
                format!(
                    "the job has already started with its {} node(s)",
                    self.nnodes
                ),
            ),
        }
    }

    /// A node joined while joining: start at MAX nodes, or at MIN once the
    /// last call has passed (at once when it is zero).
    fn joined(&mut self, now: Instant) -> Vec<Out> {
        if self.nodes.len() < self.min_nodes {
            return vec![];
        }
        let since = *self.min_since.get_or_insert(now);
        if self.nodes.len() >= self.nnodes || now.duration_since(since) >= self.last_call {
            self.assign_ranks();
            return self.start();
        }
        vec![]
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

    /// The next round of an elastic job: the survivors, in their order (the
    /// rendezvous host's own node first), then those that joined meanwhile.
    fn next_members(&mut self) {
        self.nodes.retain(|n| !n.lost);
        let room = self.nnodes.saturating_sub(self.nodes.len());
        let take = room.min(self.pending.len());
        self.nodes.extend(self.pending.drain(..take));
        self.nodes.sort_by_key(|n| !n.hello.hosting);
        for (r, n) in self.nodes.iter_mut().enumerate() {
            n.node_rank = r;
        }
    }

    /// Start a round on every node.
    fn start(&mut self) -> Vec<Out> {
        self.phase = Phase::Running;
        self.min_since = None;
        let world: usize = self.nodes.iter().map(|n| n.hello.nproc).sum();
        let nnodes = self.nodes.len();
        let master_addr = self.master_addr();
        let first = &self.nodes[0];
        let master_port = self.master_port.unwrap_or(first.hello.port);
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.hello.host.clone()).collect();
        let mut offset = 0;
        let mut out = vec![];
        for n in &mut self.nodes {
            n.ended = false;
            n.code = 0;
            out.push(Out {
                conn: n.conn,
                msg: ToAgent::Start(Start {
                    round: self.round,
                    restarts: self.restarts,
                    node_rank: n.node_rank,
                    nnodes,
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
        for n in self.nodes.iter_mut().chain(self.pending.iter_mut()) {
            if n.conn == conn {
                n.last_seen = now;
            }
        }
    }

    /// The first failure of a round stops it on every other node.
    pub(crate) fn failed(&mut self, conn: Conn, f: Failure) -> Vec<Out> {
        // Only a node of the job can fail it (a refused peer's word is nothing).
        if self.index(conn).is_none() || self.phase != Phase::Running || f.round != self.round {
            return vec![];
        }
        self.stop_round(Some(conn), f, true)
    }

    /// Stop the round on every node but `from` (which knows). While it is
    /// already stopping for a node that joined, a failure takes over as the
    /// cause, and the restart then counts.
    fn stop_round(&mut self, from: Option<Conn>, f: Failure, counts: bool) -> Vec<Out> {
        match &self.phase {
            Phase::Running => {}
            Phase::Stopping { counts: false, .. } if counts => {
                self.phase = Phase::Stopping { failure: f, counts };
                return vec![];
            }
            _ => return vec![],
        }
        self.phase = Phase::Stopping {
            failure: f.clone(),
            counts,
        };
        self.nodes
            .iter()
            .filter(|n| Some(n.conn) != from && !n.lost && !n.ended)
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
        self.nodes[i].code = code;
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
        // One that waited for the next round never counted.
        if let Some(p) = self.pending.iter().position(|n| n.conn == conn) {
            self.pending.remove(p);
            return vec![];
        }
        let Some(i) = self.index(conn) else {
            return vec![];
        };
        if let Phase::Joining { .. } = self.phase {
            // Gone before the job started: it never counted.
            self.nodes.remove(i);
            if self.nodes.len() < self.min_nodes {
                self.min_since = None;
            }
            return vec![];
        }
        if self.nodes[i].lost || self.phase == Phase::Over {
            return vec![];
        }
        self.nodes[i].lost = true;
        let host = self.nodes[i].hello.host.clone();
        let node_rank = self.nodes[i].node_rank;
        // While stopping, the first failure stays the cause (a lost node
        // makes the restart count). A fixed job ends; an elastic one goes on
        // with the survivors if enough remain (round_over).
        let f = Failure {
            round: self.round,
            cause: format!("node {node_rank} ({host}) was lost: {why}"),
            code: 1,
            restartable: self.is_elastic(),
        };
        let mut out = self.stop_round(Some(conn), f, true);
        out.extend(self.round_over());
        out
    }

    /// Once every live node ended the round: restart, or end the job.
    fn round_over(&mut self) -> Vec<Out> {
        if self.nodes.iter().any(|n| !n.lost && !n.ended) {
            return vec![];
        }
        let alive = self.nodes.iter().filter(|n| !n.lost).count();
        let any_lost = alive < self.nodes.len();
        let (failure, counts) = match self.phase.clone() {
            Phase::Stopping { failure, counts } => (failure, counts),
            Phase::Running => return self.end(0, None),
            _ => return vec![],
        };
        if self.is_elastic() {
            // Every survivor's script finished as the round was stopping for
            // a newcomer: the job is done.
            if !counts && self.nodes.iter().all(|n| n.lost || n.code == 0) {
                return self.end(0, None);
            }
            let cause = if alive < self.min_nodes {
                Some(format!(
                    "{}; {alive} node(s) remain, fewer than --nnodes {} asks for",
                    failure.cause,
                    self.range()
                ))
            } else if counts && self.restarts >= self.max_restarts {
                Some(format!(
                    "{}; no restarts left (--max-restarts {})",
                    failure.cause, self.max_restarts
                ))
            } else if !failure.restartable {
                Some(failure.cause.clone())
            } else {
                None
            };
            if let Some(cause) = cause {
                return self.end(failure.code, Some(cause));
            }
            if counts {
                self.restarts += 1;
            }
            self.round += 1;
            self.next_members();
            return self.start();
        }
        if failure.restartable && !any_lost && self.round < self.max_restarts {
            self.round += 1;
            self.restarts += 1;
            return self.start();
        }
        self.end(failure.code, Some(failure.cause))
    }

    fn end(&mut self, code: i32, cause: Option<String>) -> Vec<Out> {
        self.phase = Phase::Over;
        self.nodes
            .iter()
            .filter(|n| !n.lost)
            .chain(&self.pending)
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
            if self
                .min_since
                .is_some_and(|m| now.duration_since(m) >= self.last_call)
            {
                return self.joined(now);
            }
            if now.duration_since(since) >= self.join_timeout {
                let joined: Vec<String> = self.nodes.iter().map(|n| n.hello.host.clone()).collect();
                let why = format!(
                    "only {} of {} node(s) joined in {} s ({})",
                    joined.len(),
                    match self.is_elastic() {
                        true => format!("the {} at least", self.min_nodes),
                        false => self.nnodes.to_string(),
                    },
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
            .filter(|n| !n.lost)
            .chain(&self.pending)
            .filter(|n| now.duration_since(n.last_seen) >= self.heartbeat_timeout)
            .map(|n| (n.conn, now.duration_since(n.last_seen).as_secs()))
            .collect();
        let mut out = vec![];
        for (conn, secs) in silent {
            out.extend(self.lost(conn, &format!("no heartbeat for {secs} s")));
        }
        out.extend(self.admit_pending(now));
        out
    }
}

mod admit;
#[cfg(test)]
use admit::ADMIT_AFTER;
#[cfg(test)]
mod tests;
