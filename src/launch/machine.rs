//! The supervisor's decisions, pure: events in (a rank ended, a signal came,
//! time passed), actions out (signal these ranks' process groups, stop
//! ourselves). nextest's rules: the first failure, the first stopping signal
//! or the timeout sends SIGTERM (or that signal) to every live rank, then the
//! grace period, then SIGKILL; a second stopping signal kills at once. The
//! loop in `supervise.rs` turns actions into syscalls; tests drive this with
//! made-up events and instants, no process needed.

use std::time::{Duration, Instant};

use crate::os;
use crate::proc::signals::{Action, action};

/// How a rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The shell convention: the code, or 128 + the signal number.
    pub(crate) fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
    pub(crate) fn success(self) -> bool {
        self == Exit::Code(0)
    }
    pub(crate) fn describe(self) -> String {
        match self {
            Exit::Code(0) => "exited 0".to_string(),
            Exit::Code(c) => format!("exited with code {c}"),
            Exit::Signal(s) => format!("killed by signal {s} ({})", os::signal_name(s)),
        }
    }
    pub(crate) fn from_status(status: libc::c_int) -> Exit {
        if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Rank `i` (its index in the launch) ended.
    Ended(usize, Exit),
    /// We received this signal.
    Signal(i32),
    /// Time passed (deadlines are checked against `now`).
    Tick,
    /// The job ended elsewhere (another node's rank failed, a node was
    /// lost): stop every rank as for a failure, none of ours to blame.
    Elsewhere,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Act {
    /// Send `sig` to the process groups of these ranks (indices).
    Signal(i32, Vec<usize>),
    /// Stop ourselves (the ranks were sent SIGTSTP first).
    SuspendSelf,
}

/// The supervisor's state between events.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    alive: Vec<bool>,
    first_failure: Option<usize>,
    user_signal: Option<i32>,
    /// When to SIGKILL whatever is still alive (set when stopping starts).
    kill_at: Option<Instant>,
    deadline: Option<Instant>,
    timed_out: bool,
    grace: Duration,
}

impl Machine {
    /// `ranks` running, a `grace` period, and an optional deadline.
    pub(crate) fn new(ranks: usize, grace: Duration, deadline: Option<Instant>) -> Machine {
        Machine {
            alive: vec![true; ranks],
            first_failure: None,
            user_signal: None,
            kill_at: None,
            deadline,
            timed_out: false,
            grace,
        }
    }

    fn live(&self) -> Vec<usize> {
        (0..self.alive.len()).filter(|&i| self.alive[i]).collect()
    }

    /// Every rank has ended.
    pub(crate) fn done(&self) -> bool {
        !self.alive.contains(&true)
    }

    /// The first rank that failed on its own.
    pub(crate) fn first_failure(&self) -> Option<usize> {
        self.first_failure
    }

    /// The first signal the user sent.
    pub(crate) fn user_signal(&self) -> Option<i32> {
        self.user_signal
    }

    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// `sig` to every live rank, then (a stopped rank must run to act on it)
    /// SIGCONT, and the grace period starts.
    fn stop(&mut self, sig: i32, now: Instant, out: &mut Vec<Act>) {
        let live = self.live();
        out.push(Act::Signal(sig, live.clone()));
        out.push(Act::Signal(libc::SIGCONT, live));
        self.kill_at = Some(now + self.grace);
    }

    /// One event at `now`: what to do.
    pub(crate) fn on(&mut self, event: Event, now: Instant) -> Vec<Act> {
        let mut out = vec![];
        match event {
            Event::Ended(i, exit) => {
                if let Some(a) = self.alive.get_mut(i) {
                    *a = false;
                }
                if !exit.success() && self.kill_at.is_none() {
                    self.first_failure = Some(i);
                    self.stop(libc::SIGTERM, now, &mut out);
                }
            }
            Event::Signal(sig) => match action(sig) {
                Some(Action::Stop(send)) => {
                    if self.user_signal.is_none() && self.kill_at.is_none() {
                        self.user_signal = Some(sig);
                        self.stop(send, now, &mut out);
                    } else {
                        self.user_signal.get_or_insert(sig);
                        self.kill_at = Some(now);
                    }
                }
                Some(Action::Forward) => out.push(Act::Signal(sig, self.live())),
                Some(Action::Suspend) => {
                    out.push(Act::Signal(libc::SIGTSTP, self.live()));
                    out.push(Act::SuspendSelf);
                }
                Some(Action::Child) | None => {}
            },
            Event::Tick => {}
            Event::Elsewhere => {
                if self.kill_at.is_none() {
                    self.stop(libc::SIGTERM, now, &mut out);
                }
            }
        }
        // Deadlines, after every event.
        if !self.timed_out && self.kill_at.is_none() && self.deadline.is_some_and(|d| now >= d) {
            self.timed_out = true;
            self.stop(libc::SIGTERM, now, &mut out);
        }
        if self.kill_at.is_some_and(|t| now >= t) && !self.done() {
            out.push(Act::Signal(libc::SIGKILL, self.live()));
        }
        out
    }

    /// Milliseconds from `now` until the next deadline, for poll (-1: none).
    pub(crate) fn wait_ms(&self, now: Instant) -> i32 {
        let wake = match (self.kill_at, self.deadline.filter(|_| !self.timed_out)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wake.map_or(-1, |t| {
            t.saturating_duration_since(now)
                .as_millis()
                .min(i32::MAX as u128 - 1) as i32
                + 1
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERM: i32 = libc::SIGTERM;
    const KILL: i32 = libc::SIGKILL;
    const CONT: i32 = libc::SIGCONT;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_stop_from_elsewhere_terminates_then_kills_and_blames_no_rank() {
        let t0 = Instant::now();
        let mut m = Machine::new(2, secs(5), None);
        let acts = m.on(Event::Elsewhere, t0);
        assert_eq!(
            acts,
            vec![Act::Signal(TERM, vec![0, 1]), Act::Signal(CONT, vec![0, 1])]
        );
        // A second stop changes nothing; the grace period still runs.
        assert!(m.on(Event::Elsewhere, t0 + secs(1)).is_empty());
        // Rank 0 dies of the SIGTERM: not a failure of its own.
        m.on(Event::Ended(0, Exit::Signal(TERM)), t0 + secs(2));
        assert_eq!(m.first_failure(), None);
        assert_eq!(
            m.on(Event::Tick, t0 + secs(5)),
            vec![Act::Signal(KILL, vec![1])]
        );
    }

    #[test]
    fn a_failing_rank_stops_the_others_then_grace_then_kill() {
        let t0 = Instant::now();
        let mut m = Machine::new(3, secs(10), None);
        assert_eq!(m.on(Event::Ended(0, Exit::Code(0)), t0), vec![]);
        assert_eq!(
            m.on(Event::Ended(1, Exit::Code(3)), t0),
            vec![Act::Signal(TERM, vec![2]), Act::Signal(CONT, vec![2])]
        );
        assert_eq!(m.first_failure(), Some(1));
        assert_eq!(m.wait_ms(t0), 10_001);
        assert_eq!(m.on(Event::Tick, t0 + secs(9)), vec![]);
        assert_eq!(
            m.on(Event::Tick, t0 + secs(10)),
            vec![Act::Signal(KILL, vec![2])]
        );
        // The others ending by our SIGTERM is no new failure.
        m.on(Event::Ended(2, Exit::Signal(TERM)), t0 + secs(10));
        assert_eq!(m.first_failure(), Some(1));
        assert!(m.done());
        assert_eq!(m.on(Event::Tick, t0 + secs(11)), vec![]);
    }

    #[test]
    fn first_signal_is_forwarded_and_a_second_kills_at_once() {
        let t0 = Instant::now();
        let mut m = Machine::new(2, secs(30), None);
        assert_eq!(
            m.on(Event::Signal(libc::SIGINT), t0),
            vec![
                Act::Signal(libc::SIGINT, vec![0, 1]),
                Act::Signal(CONT, vec![0, 1])
            ]
        );
        assert_eq!(m.user_signal(), Some(libc::SIGINT));
        assert_eq!(
            m.on(Event::Signal(libc::SIGINT), t0 + secs(1)),
            vec![Act::Signal(KILL, vec![0, 1])]
        );
        assert_eq!(m.user_signal(), Some(libc::SIGINT));
    }

    #[test]
    fn sigquit_stops_with_sigterm_and_usr1_is_passed_on() {
        let t0 = Instant::now();
        let mut m = Machine::new(2, secs(5), None);
        assert_eq!(
            m.on(Event::Signal(libc::SIGUSR1), t0),
            vec![Act::Signal(libc::SIGUSR1, vec![0, 1])]
        );
        assert_eq!(m.user_signal(), None, "USR1 stops nothing");
        let acts = m.on(Event::Signal(libc::SIGQUIT), t0);
        assert_eq!(acts[0], Act::Signal(TERM, vec![0, 1]));
        assert_eq!(m.user_signal(), Some(libc::SIGQUIT));
    }

    #[test]
    fn ctrl_z_stops_the_ranks_then_us() {
        let mut m = Machine::new(2, secs(5), None);
        assert_eq!(
            m.on(Event::Signal(libc::SIGTSTP), Instant::now()),
            vec![Act::Signal(libc::SIGTSTP, vec![0, 1]), Act::SuspendSelf]
        );
        assert_eq!(m.on(Event::Signal(libc::SIGCHLD), Instant::now()), vec![]);
    }

    #[test]
    fn the_timeout_stops_once_and_counts_no_rank_as_failed() {
        let t0 = Instant::now();
        let mut m = Machine::new(1, secs(2), Some(t0 + secs(60)));
        assert_eq!(m.wait_ms(t0), 60_001);
        assert_eq!(m.on(Event::Tick, t0 + secs(59)), vec![]);
        let acts = m.on(Event::Tick, t0 + secs(60));
        assert_eq!(acts[0], Act::Signal(TERM, vec![0]));
        assert!(m.timed_out());
        assert_eq!(m.on(Event::Tick, t0 + secs(61)), vec![]);
        assert_eq!(
            m.on(Event::Tick, t0 + secs(62)),
            vec![Act::Signal(KILL, vec![0])]
        );
        m.on(Event::Ended(0, Exit::Signal(TERM)), t0 + secs(62));
        assert_eq!(m.first_failure(), None, "stopped by us, not failed");
    }

    #[test]
    fn a_failure_after_stopping_began_is_not_the_first() {
        let t0 = Instant::now();
        let mut m = Machine::new(2, secs(5), None);
        m.on(Event::Signal(libc::SIGTERM), t0);
        assert_eq!(m.on(Event::Ended(0, Exit::Code(1)), t0), vec![]);
        assert_eq!(m.first_failure(), None);
        assert_eq!(m.wait_ms(t0 + secs(10)), 1, "kill time has passed");
    }

    #[test]
    fn exits_read_and_describe() {
        assert_eq!(Exit::Signal(9).code(), 137);
        assert_eq!(Exit::Code(3).describe(), "exited with code 3");
        assert_eq!(Exit::Signal(9).describe(), "killed by signal 9 (SIGKILL)");
        assert_eq!(Exit::from_status(3 << 8), Exit::Code(3));
        assert_eq!(Exit::from_status(9), Exit::Signal(9));
    }
}
