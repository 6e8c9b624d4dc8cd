//! tune's entry point to a launch: a trial's ranks started and watched to
//! their end under a timeout, their output captured and not shown, their
//! pids and lines given to the trial runner as events (`events`); and, for
//! `tune --nnodes`, the rendezvous each trial's nodes report their use to.
//! tune's runners build no launch pipeline of their own.

use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use super::events::{Event, Shared};
use crate::error::Hinted;
pub(crate) use crate::launch::RankLaunch;
use crate::launch::env::{self, DEFAULT_ROLE, Job};
use crate::launch::output::OutputOptions;
use crate::launch::supervise::{self, Outcome, RunOptions};
use crate::launch::{LaunchError, node_launches, plan_launches, prepare};
use crate::measure::throughput::Hit;
use crate::measure::usage::NodeUsage;
use crate::plan::Plan;

/// One trial's ranks.
#[derive(Debug, Clone)]
pub(crate) struct Trial<'a> {
    pub launches: &'a [RankLaunch],
    pub grace: Duration,
    pub timeout: Duration,
    /// Move the ranks' DataLoader workers to their worker CPUs.
    pub move_workers: bool,
    /// Prefix each line with its rank (as the reporter reads it).
    pub prefix: bool,
}

/// Run a trial's ranks to their end; `r` hears them start and each line.
pub(crate) fn run(t: &Trial<'_>, r: Shared) -> Result<Outcome, LaunchError> {
    let (spawned, held, sink) = super::node::hooks(&r, 0, None, None);
    let opts = RunOptions {
        grace: t.grace,
        timeout: Some(t.timeout),
        output: OutputOptions {
            rank_base: 0,
            prefix_of: None,
            duplicate: [None, None],
            prefix: t.prefix,
            show: Some(vec![]),
            sink,
        },
        log_dir: None,
        on_spawned: Some(spawned),
        move_workers: t.move_workers,
        hold: crate::proc::hold::Hold::On,
        on_held: Some(held),
        peer: None,
    };
    let o = supervise::run(t.launches, &opts);
    r.event(&Event::RoundEnded {
        round: 0,
        outcome: o.as_ref().ok(),
    });
    o
}

/// A plan's launches on this machine for a trial (rank 0 at 127.0.0.1, a
/// free port), every binding tried first.
pub(crate) fn launches(p: &Plan, argv: &[OsString]) -> Result<Vec<RankLaunch>, String> {
    let mut ls =
        node_launches(p, argv, "127.0.0.1", None, DEFAULT_ROLE).map_err(|e| e.to_string())?;
    prepare::check_bindings(&mut ls, false).map_err(|e| e.to_string())?;
    Ok(ls)
}

/// What a trial of `p` launches, to tell configurations that launch alike
/// (the port and run id, which differ between any two launches, left out).
pub(crate) fn launch_key(p: &Plan, argv: &[OsString]) -> Vec<RankLaunch> {
    let job = Job::single(p.nproc, "127.0.0.1", 0, String::new());
    plan_launches(p, argv, &job)
}

/// The rendezvous a `tune --nnodes` trial's nodes report to: hosted here,
/// without taking part.
pub(crate) struct ReportHost {
    hosted: crate::rdzv::Hosted,
    /// Its port on every address of this host.
    pub port: u16,
}

/// One node's report: its use, and global rank 0's throughput where it ran.
pub(crate) type NodeReport = (NodeUsage, Option<Hit>);

impl ReportHost {
    /// Host a trial's rendezvous for `nnodes` nodes of run id `id`, in the
    /// authentication mode the agents will inherit from this environment.
    pub(crate) fn start(
        nnodes: usize,
        id: &str,
        join_timeout: Duration,
        heartbeat_timeout: Duration,
    ) -> Result<ReportHost, String> {
        let auth = crate::rdzv::auth::for_job(None, &env::current)
            .map_err(|e| format!("{e} ({})", e.hint()))?;
        let cannot = |e: std::io::Error| format!("cannot host the rendezvous: {e}");
        let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(cannot)?;
        let port = l.local_addr().map_err(cannot)?.port();
        let hosted = crate::rdzv::host(l, nnodes, id, join_timeout, heartbeat_timeout, auth)
            .map_err(cannot)?;
        Ok(ReportHost { hosted, port })
    }

    /// The trial is over: the nodes' reports.
    pub(crate) fn finish(self) -> Vec<NodeReport> {
        self.hosted
            .finish()
            .reports()
            .into_iter()
            .map(|r| (r.usage, r.hit))
            .collect()
    }
}
