//! A job of one node: its rounds decided by the same coordinator and agent
//! state as a job of many, carried in this process (no socket, no secret, no
//! heartbeat: the one node cannot be lost). So `--max-restarts`,
//! TORCHELASTIC_RESTART_COUNT, the root cause and the exit code mean the same
//! on one node as on many, as they do under `torchrun --standalone`.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::agent::{self, AgentConfig, Carrier, RoundEnd};
use super::coord::{Conn, Coordinator, Out};
use super::proto::{Hello, Start, ToAgent, ToHost};
use super::state::{Action, AgentState, Event};
use super::{ClusterError, JobEnd};
use crate::launch::supervise::{LocalFailure, Peer};
use crate::proc::signals::SignalPipe;

/// The one node's connection id at the coordinator.
const ONE: Conn = 0;

/// The coordinator and the agent's state, side by side.
#[derive(Debug)]
struct Both {
    coord: Coordinator,
    state: AgentState,
}

impl Both {
    /// Carry messages both ways until neither side has more to say; starts
    /// and the end go to the main thread.
    fn settle(&mut self, mut outs: Vec<Out>, mut acts: Vec<Action>, todo: &Sender<Action>) {
        let now = Instant::now();
        // Bounded: every message moves the job forward (each round starts,
        // stops and ends once), and the agent says nothing once it is done.
        for _ in 0..1000 {
            for o in outs.drain(..) {
                if o.conn == ONE {
                    acts.extend(self.state.on(Event::Msg(o.msg), now));
                }
            }
            if acts.is_empty() {
                return;
            }
            for a in acts.drain(..) {
                match a {
                    Action::Send(m) => {
                        outs.extend(super::server::on_message(&mut self.coord, ONE, m))
                    }
                    other => {
                        let _ = todo.send(other);
                    }
                }
            }
        }
    }

    /// Time passed: the coordinator's clock, and the host "heard" (it is us).
    fn tick(&mut self, todo: &Sender<Action>) {
        let now = Instant::now();
        self.coord.seen(ONE, now);
        let outs = self.coord.tick(now);
        let acts = self.state.on(Event::Msg(ToAgent::Beat), now);
        self.settle(outs, acts, todo);
    }
}

/// The one node's carrier: what the agent sends goes straight to the
/// coordinator, and what it answers straight back.
#[derive(Debug)]
struct Local {
    both: Mutex<Both>,
    todo: Sender<Action>,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, Both> {
        self.both.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Peer for Local {
    fn stop_requested(&self) -> bool {
        let mut b = self.lock();
        b.tick(&self.todo);
        b.state.stop_requested(Instant::now())
    }

    fn local_failure(&self, what: LocalFailure) {
        self.apply(Event::Local(what));
    }
}

impl Carrier for Local {
    fn apply(&self, ev: Event) {
        let mut b = self.lock();
        if matches!(ev, Event::Tick) {
            b.tick(&self.todo);
        }
        let acts = b.state.on(ev, Instant::now());
        b.settle(vec![], acts, &self.todo);
    }

    fn send(&self, m: &ToHost) {
        let mut b = self.lock();
        let outs = super::server::on_message(&mut b.coord, ONE, m.clone());
        b.settle(outs, vec![], &self.todo);
    }
}

/// Run a one-node job's rounds: `round` starts and supervises the ranks for a
/// `Start` and says how they ended. `cfg.nnodes` is 1; MASTER_ADDR is
/// `cfg.local_addr`, MASTER_PORT `cfg.master_port` or a free port.
pub(crate) fn run(
    cfg: &AgentConfig,
    mut round: impl FnMut(&Start, Arc<dyn Peer>) -> RoundEnd,
) -> Result<JobEnd, ClusterError> {
    let pipe = SignalPipe::get().map_err(|e| ClusterError::Io(e.to_string()))?;
    let now = Instant::now();
    let hello = Hello {
        host: cfg.host.clone(),
        nproc: cfg.nproc,
        nnodes: 1,
        min_nodes: 0,
        node_rank: Some(0),
        run_id: cfg.run_id.clone(),
        hosting: true,
        port: match cfg.master_port {
            Some(p) => p,
            None => crate::launch::env::free_port().map_err(|e| {
                ClusterError::Io(format!("cannot find a free port for MASTER_PORT: {e}"))
            })?,
        },
        auth: String::new(),
        nonce: String::new(),
        addr: cfg.local_addr.clone(),
        ticket: String::new(),
    };
    let (todo, rx) = mpsc::channel();
    let mut both = Both {
        coord: agent::coordinator(cfg),
        state: AgentState::new(
            &cfg.host,
            "(this process)",
            cfg.join_timeout,
            cfg.heartbeat_timeout,
            now,
        ),
    };
    let outs = both.coord.join(ONE, hello, "127.0.0.1", now);
    both.settle(outs, vec![], &todo);
    let link = Arc::new(Local {
        both: Mutex::new(both),
        todo,
    });
    agent::rounds(&link, &rx, pipe, &mut round)
}
