//! The node agent's decisions, pure: events in (what the rendezvous host
//! said, its connection closing, time passing, this node's own failure or a
//! user's signal, the end of a round's ranks), actions out (a message to
//! send, a round to start, the node's end). `agent.rs` carries them out with
//! a socket and two threads, as `server.rs` does for `coord.rs`; unit tests
//! drive it with made-up messages and instants.

use std::time::{Duration, Instant};

use super::proto::{Failure, Report, Start, ToAgent, ToHost};
use super::{ClusterError, JobEnd};
use crate::launch::supervise::LocalFailure;

/// What happens to the agent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// The rendezvous host said this.
    Msg(ToAgent),
    /// Its connection closed or failed (why).
    Closed(String),
    /// Time passed (between rounds; during one, the supervisor polls).
    Tick,
    /// A stopping signal between rounds.
    Signal(i32),
    /// This node's part went wrong on its own during a round.
    Local(LocalFailure),
    /// The round's ranks all ended with `code` (and the node's report, when
    /// asked for); `port` is free here for the next.
    RoundEnded {
        code: i32,
        port: u16,
        report: Option<Report>,
    },
}

/// What the agent does.
#[derive(Debug)]
pub(crate) enum Action {
    Send(ToHost),
    /// Start this node's ranks for the round and supervise them.
    Start(Start),
    /// The node's part of the job is over.
    Finish(Result<JobEnd, ClusterError>),
}

/// What one node's agent knows.
#[derive(Debug)]
pub(crate) struct AgentState {
    host: String,
    endpoint: String,
    heartbeat_timeout: Duration,
    /// Until the first start: when to give up on a host that never answers.
    join_deadline: Option<Instant>,
    join_wait: Duration,
    last_heard: Instant,
    /// When this node last looked (between rounds every 100 ms, during one
    /// as its supervisor polls): a long gap means this node itself did not
    /// run (SIGSTOP, a debugger, a paused machine), not that the host went
    /// silent.
    last_looked: Instant,
    /// The round under way (from its Start until its ranks ended).
    running: Option<Start>,
    /// The latest round we heard of (a stop names it).
    round: u32,
    rank_offset: usize,
    /// The ranks of the round under way must stop.
    stop: bool,
    /// Our failure in this round, as sent.
    failed: Option<Failure>,
    /// Why the rendezvous host is gone, once it is.
    lost: Option<String>,
    /// Finish was given: nothing more happens.
    done: bool,
}

impl AgentState {
    /// An agent that has said hello at `now`; the rendezvous itself ends at
    /// its own timeout (`join_timeout`), a little more covers a host that
    /// never answers. Later waits are bounded by the heartbeat.
    pub(crate) fn new(
        host: &str,
        endpoint: &str,
        join_timeout: Duration,
        heartbeat_timeout: Duration,
        now: Instant,
    ) -> AgentState {
        let join_wait = join_timeout + Duration::from_secs(5);
        AgentState {
            host: host.to_string(),
            endpoint: endpoint.to_string(),
            heartbeat_timeout,
            join_deadline: Some(now + join_wait),
            join_wait,
            last_heard: now,
            last_looked: now,
            running: None,
            round: 0,
            rank_offset: 0,
            stop: false,
            failed: None,
            lost: None,
            done: false,
        }
    }

    /// The node's part is over; later events change nothing.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Must the ranks of the round under way stop? (The supervisor polls
    /// this; silence from the host counts from here too.)
    pub(crate) fn stop_requested(&mut self, now: Instant) -> bool {
        self.check_silence(now);
        self.stop
    }

    fn check_silence(&mut self, now: Instant) {
        let silent = now.saturating_duration_since(self.last_heard);
        let paused = now.saturating_duration_since(self.last_looked);
        self.last_looked = now;
        if silent >= self.heartbeat_timeout && !self.done {
            // Who stopped answering: where this node did not run for as long,
            // it is this node (the host kept beating, or was this process).
            self.lose(match paused >= self.heartbeat_timeout {
                true => format!(
                    "this node ({}) did not run for {} s (stopped by SIGSTOP, a debugger or a \
                     paused machine): it missed the rendezvous host {}'s heartbeats, and the \
                     job went on without it",
                    self.host,
                    paused.as_secs(),
                    self.endpoint
                ),
                false => format!(
                    "no heartbeat from the rendezvous host {} for {} s",
                    self.endpoint,
                    silent.as_secs()
                ),
            });
        }
    }

    fn lose(&mut self, why: String) {
        if self.lost.is_none() {
            self.lost = Some(why);
        }
        self.stop = true;
    }

    fn finish(&mut self, r: Result<JobEnd, ClusterError>) -> Vec<Action> {
        self.done = true;
        self.stop = true;
        vec![Action::Finish(r)]
    }

    /// Between rounds a lost host ends the node; during one, the round's end does.
    fn finish_if_lost(&mut self) -> Vec<Action> {
        match (&self.lost, &self.running) {
            (Some(why), None) => {
                let why = why.clone();
                self.finish(Err(ClusterError::Lost(why)))
            }
            _ => vec![],
        }
    }

    pub(crate) fn on(&mut self, ev: Event, now: Instant) -> Vec<Action> {
        if self.done {
            return vec![];
        }
        match ev {
            Event::Msg(m) => {
                self.last_heard = now;
                self.message(m)
            }
            Event::Closed(why) => {
                self.lose(why);
                self.finish_if_lost()
            }
            Event::Tick => {
                self.check_silence(now);
                if self.join_deadline.is_some_and(|d| now >= d) {
                    return self.finish(Err(ClusterError::Lost(format!(
                        "the rendezvous host {} did not answer in {} s",
                        self.endpoint,
                        self.join_wait.as_secs()
                    ))));
                }
                self.finish_if_lost()
            }
            Event::Signal(sig) => {
                // Stopped between rounds or before the start: the others hear
                // it as a stop, not as a lost node.
                let mut out = self.local(LocalFailure::Signal(sig));
                out.extend(self.finish(Err(ClusterError::Signal(sig))));
                out
            }
            Event::Local(what) => self.local(what),
            Event::RoundEnded { code, port, report } => self.round_ended(code, port, report),
        }
    }

    fn message(&mut self, m: ToAgent) -> Vec<Action> {
        match m {
            // The door's messages belong to the handshake (`agent::handshake`);
            // past it they mean nothing.
            ToAgent::Beat | ToAgent::Challenge { .. } | ToAgent::Welcome | ToAgent::Busy => vec![],
            ToAgent::Stop { round, .. } => {
                // The cause comes again with the End; nothing to keep.
                if round == self.round {
                    self.stop = true;
                }
                vec![]
            }
            ToAgent::Start(st) => {
                self.join_deadline = None;
                self.round = st.round;
                self.rank_offset = st.rank_offset;
                self.failed = None;
                self.stop = false;
                self.running = Some(st.clone());
                vec![Action::Start(st)]
            }
            ToAgent::End { code, cause } => self.finish(Ok(JobEnd { code, cause })),
            ToAgent::Refused { why } => self.finish(Err(ClusterError::Refused(why))),
            ToAgent::Incomplete { why } => self.finish(Err(ClusterError::Incomplete(why))),
        }
    }

    fn local(&mut self, what: LocalFailure) -> Vec<Action> {
        let f = match what {
            LocalFailure::Rank(local, pid, exit) => Failure {
                round: self.round,
                cause: format!(
                    "{}: rank {} (local rank {local}, pid {pid}) {}",
                    self.host,
                    self.rank_offset + local,
                    exit.describe()
                ),
                code: exit.code(),
                restartable: true,
            },
            LocalFailure::Signal(sig) => Failure {
                round: self.round,
                cause: format!(
                    "{}: threadwise was stopped by {}",
                    self.host,
                    crate::os::signal_name(sig)
                ),
                code: 128 + sig,
                restartable: false,
            },
        };
        self.failed = Some(f.clone());
        vec![Action::Send(ToHost::Failed(f))]
    }

    fn round_ended(&mut self, code: i32, port: u16, report: Option<Report>) -> Vec<Action> {
        let Some(st) = self.running.take() else {
            return vec![];
        };
        if let Some(why) = self.lost.clone() {
            return self.finish(Err(ClusterError::Lost(why)));
        }
        let mut out: Vec<Action> = report
            .map(|report| {
                Action::Send(ToHost::Report {
                    round: st.round,
                    report,
                })
            })
            .into_iter()
            .collect();
        out.push(Action::Send(ToHost::Ended {
            round: st.round,
            code,
            port,
        }));
        // Stopped by the user: the others were told; we do not wait.
        match self.failed.clone() {
            Some(f) if !f.restartable => out.extend(self.finish(Ok(JobEnd {
                code: f.code,
                cause: Some(f.cause),
            }))),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::machine::Exit;

    fn start(round: u32) -> Start {
        Start {
            round,
            restarts: 0,
            node_rank: 1,
            nnodes: 2,
            rank_offset: 2,
            world_size: 4,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            max_restarts: 1,
            hosts: vec!["a".into(), "b".into()],
        }
    }

    fn agent(t0: Instant) -> AgentState {
        AgentState::new(
            "b",
            "a:29400",
            Duration::from_secs(10),
            Duration::from_secs(3),
            t0,
        )
    }

    fn finished(out: &[Action]) -> Option<&Result<JobEnd, ClusterError>> {
        out.iter().find_map(|a| match a {
            Action::Finish(r) => Some(r),
            _ => None,
        })
    }

    fn sent(out: &[Action]) -> Vec<&ToHost> {
        out.iter()
            .filter_map(|a| match a {
                Action::Send(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_round_that_succeeds_then_the_end() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        let out = a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        assert!(matches!(&out[..], [Action::Start(s)] if s.round == 0));
        assert!(!a.stop_requested(t0));
        let out = a.on(
            Event::RoundEnded {
                code: 0,
                port: 7,
                report: None,
            },
            t0,
        );
        assert_eq!(
            sent(&out),
            vec![&ToHost::Ended {
                round: 0,
                code: 0,
                port: 7
            }]
        );
        assert!(finished(&out).is_none());
        let out = a.on(
            Event::Msg(ToAgent::End {
                code: 0,
                cause: None,
            }),
            t0,
        );
        let Some(Ok(end)) = finished(&out) else {
            panic!("{out:?}")
        };
        assert_eq!((end.code, end.cause.as_deref()), (0, None));
        assert!(a.done());
        assert!(a.on(Event::Tick, t0 + Duration::from_secs(99)).is_empty());
    }

    #[test]
    fn a_rank_failure_is_told_with_its_global_rank_and_a_stop_for_the_round_stops() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        let out = a.on(Event::Local(LocalFailure::Rank(1, 42, Exit::Code(3))), t0);
        let [ToHost::Failed(f)] = &sent(&out)[..] else {
            panic!("{out:?}")
        };
        assert_eq!(f.code, 3);
        assert!(f.restartable);
        assert!(
            f.cause.starts_with("b: rank 3 (local rank 1, pid 42)"),
            "{}",
            f.cause
        );
        // A stop for another round is stale; for this one it stops the ranks.
        a.on(
            Event::Msg(ToAgent::Stop {
                round: 5,
                cause: "x".into(),
            }),
            t0,
        );
        assert!(!a.stop_requested(t0));
        a.on(
            Event::Msg(ToAgent::Stop {
                round: 0,
                cause: "x".into(),
            }),
            t0,
        );
        assert!(a.stop_requested(t0));
        // A restart's start clears the stop and the failure.
        let out = a.on(
            Event::RoundEnded {
                code: 3,
                port: 1,
                report: None,
            },
            t0,
        );
        assert!(finished(&out).is_none());
        a.on(Event::Msg(ToAgent::Start(start(1))), t0);
        assert!(!a.stop_requested(t0));
        let out = a.on(
            Event::RoundEnded {
                code: 0,
                port: 1,
                report: None,
            },
            t0,
        );
        assert!(matches!(
            sent(&out)[..],
            [ToHost::Ended {
                round: 1,
                code: 0,
                ..
            }]
        ));
    }

    #[test]
    fn silence_stops_the_round_and_ends_the_node_as_lost() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        assert!(!a.stop_requested(t0 + Duration::from_secs(2)));
        assert!(a.stop_requested(t0 + Duration::from_secs(3)));
        let out = a.on(
            Event::RoundEnded {
                code: 0,
                port: 1,
                report: None,
            },
            t0,
        );
        assert!(sent(&out).is_empty(), "no Ended to a lost host");
        let Some(Err(ClusterError::Lost(why))) = finished(&out) else {
            panic!("{out:?}")
        };
        assert!(
            why.contains("no heartbeat from the rendezvous host a:29400"),
            "{why}"
        );
    }

    /// After SIGSTOP/SIGCONT of this node (the host's agent, say), the loss
    /// names this node as the one that stopped answering, not the host.
    #[test]
    fn a_node_that_did_not_run_says_so_rather_than_blame_the_host() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        assert!(!a.stop_requested(t0 + Duration::from_secs(1)));
        // Nothing ran for 5 s (the heartbeat timeout is 3).
        assert!(a.stop_requested(t0 + Duration::from_secs(6)));
        let out = a.on(
            Event::RoundEnded {
                code: 0,
                port: 1,
                report: None,
            },
            t0 + Duration::from_secs(6),
        );
        let Some(Err(ClusterError::Lost(why))) = finished(&out) else {
            panic!("{out:?}")
        };
        assert!(
            why.contains("this node (b) did not run for 5 s") && why.contains("SIGSTOP"),
            "{why}"
        );
    }

    #[test]
    fn a_closed_connection_between_rounds_ends_at_once_during_one_at_its_end() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        let out = a.on(Event::Closed("closed".into()), t0);
        assert!(matches!(finished(&out), Some(Err(ClusterError::Lost(w))) if w == "closed"));

        let mut a = agent(t0);
        a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        assert!(a.on(Event::Closed("closed".into()), t0).is_empty());
        assert!(a.stop_requested(t0));
        let out = a.on(
            Event::RoundEnded {
                code: 143,
                port: 1,
                report: None,
            },
            t0,
        );
        assert!(matches!(finished(&out), Some(Err(ClusterError::Lost(_)))));
    }

    #[test]
    fn a_host_that_never_starts_the_job_is_given_up_on() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        // Beats keep it alive, but no start comes: the join wait ends it.
        for s in 1..15 {
            a.on(Event::Msg(ToAgent::Beat), t0 + Duration::from_secs(s));
            assert!(a.on(Event::Tick, t0 + Duration::from_secs(s)).is_empty());
        }
        let out = a.on(Event::Tick, t0 + Duration::from_secs(15));
        assert!(
            matches!(finished(&out), Some(Err(ClusterError::Lost(w))) if w.contains("did not answer in 15 s"))
        );
    }

    #[test]
    fn a_signal_between_rounds_is_told_as_a_stop_and_a_users_stop_ends_without_waiting() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        let out = a.on(Event::Signal(libc::SIGTERM), t0);
        let [ToHost::Failed(f)] = &sent(&out)[..] else {
            panic!("{out:?}")
        };
        assert!(!f.restartable);
        assert_eq!(f.code, 143);
        assert!(matches!(
            finished(&out),
            Some(Err(ClusterError::Signal(15)))
        ));

        // Stopped during a round: its end is told, then the node ends with 143.
        let mut a = agent(t0);
        a.on(Event::Msg(ToAgent::Start(start(0))), t0);
        a.on(Event::Local(LocalFailure::Signal(libc::SIGINT)), t0);
        let out = a.on(
            Event::RoundEnded {
                code: 130,
                port: 1,
                report: None,
            },
            t0,
        );
        assert!(matches!(sent(&out)[..], [ToHost::Ended { code: 130, .. }]));
        let Some(Ok(end)) = finished(&out) else {
            panic!("{out:?}")
        };
        assert_eq!(end.code, 130);
        assert!(end.cause.as_deref().unwrap().contains("stopped by SIGINT"));
    }

    #[test]
    fn refusals_and_an_incomplete_job_end_the_node() {
        let t0 = Instant::now();
        let mut a = agent(t0);
        let out = a.on(Event::Msg(ToAgent::Refused { why: "x".into() }), t0);
        assert!(matches!(
            finished(&out),
            Some(Err(ClusterError::Refused(_)))
        ));
        let mut a = agent(t0);
        let out = a.on(Event::Msg(ToAgent::Incomplete { why: "y".into() }), t0);
        assert!(matches!(
            finished(&out),
            Some(Err(ClusterError::Incomplete(_)))
        ));
    }
}
