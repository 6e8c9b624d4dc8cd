//! A job's rounds on this node, alike for one node and many: a one-node job
//! runs them with the coordinator in the process (`rdzv::local`), one node
//! of many (`--nnodes N`) joins the rendezvous (`rdzv::run`); every round
//! starts this node's ranks with the same supervision
//! (`node::supervise_node`); the job's end, its root cause and exit code are
//! the same on every node, and on one node as on many.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::events::{Level, Reporter, Shared, say};
use crate::error::Hinted;
use crate::job::node::{before_start, duplicates, supervise_node};
use crate::job::settings::{JobError, RunSettings};
use crate::launch::env::{Job, current};
use crate::launch::output::LineSink;
use crate::launch::prepare::{self, ErrorFiles};
use crate::launch::report;
use crate::launch::supervise::{self, Peer};
use crate::launch::{RankLaunch, plan_launches};
use crate::measure::throughput::{Hit, Metric};
use crate::measure::usage::NodeUsage;
use crate::netif;
use crate::plan::Plan;
use crate::rdzv::Report;
use crate::rdzv::{AgentConfig, RoundEnd, Start};

fn job_of(s: &Start, nproc: usize, run_id: &str, role: &str) -> Job {
    Job {
        nproc,
        master_addr: s.master_addr.clone(),
        master_port: s.master_port,
        run_id: run_id.to_string(),
        role: role.to_string(),
        node_rank: s.node_rank,
        nnodes: s.nnodes,
        rank_offset: s.rank_offset,
        world_size: s.world_size,
        restart_count: s.restarts,
        max_restarts: s.max_restarts,
    }
}

/// This node's launches for a round; the rendezvous secret is the agents',
/// not the ranks': it leaves their environment.
fn launches_of(s: &RunSettings, start: &Start, run_id: &str) -> Vec<RankLaunch> {
    let p = &s.plan;
    let mut ls = plan_launches(p, &s.command, &job_of(start, p.nproc, run_id, &s.role));
    for l in &mut ls {
        l.env_remove.push(crate::rdzv::auth::SECRET_VAR.to_string());
    }
    s.torchrun.set_env(&mut ls);
    ls
}

/// GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME: the interface that routes to
/// node 0 (MASTER_ADDR), set where unset; a user's value that cannot reach
/// it is kept and warned about.
fn collective_ifname(master: &str, launches: &mut [RankLaunch], warn: Option<&dyn Reporter>) {
    let Some((ifname, _)) = netif::route_to(master) else {
        return;
    };
    for var in netif::IFNAME_VARS {
        match netif::decide(var, &ifname, current(var).as_deref()) {
            Ok(Some(v)) => {
                for l in launches.iter_mut() {
                    l.env.insert(var.to_string(), v.clone());
                }
            }
            Ok(None) => {}
            Err(w) => {
                if let Some(r) = warn {
                    say(r, Level::Warning, w);
                }
            }
        }
    }
}

/// What the ranks get before the rendezvous fills in their place: this
/// node as node `--node-rank` (else 0) of equal nodes, node 0 at the endpoint.
fn guess(cfg: &AgentConfig, p: &Plan) -> Start {
    let node = cfg.node_rank.unwrap_or(0);
    Start {
        round: 0,
        restarts: 0,
        node_rank: node,
        nnodes: cfg.nnodes,
        rank_offset: node * p.nproc,
        world_size: cfg.nnodes * p.nproc,
        master_addr: cfg.endpoint.host().to_string(),
        master_port: cfg.master_port.unwrap_or(0),
        max_restarts: cfg.max_restarts,
        hosts: vec![],
    }
}

/// The job's nodes in words: `2 node(s)`, or an elastic job's range and
/// when it starts.
fn nodes_said(cfg: &AgentConfig) -> String {
    match cfg.min_nodes < cfg.nnodes {
        true => format!(
            "{} to {} node(s) (elastic: the job starts with {}, or with {} or more once they \
             have waited {} s for more; a node that joins later restarts the ranks with it, a \
             node lost leaves the others to go on while {} remain)",
            cfg.min_nodes,
            cfg.nnodes,
            cfg.nnodes,
            cfg.min_nodes,
            cfg.last_call.as_secs_f64(),
            cfg.min_nodes
        ),
        false => format!("{} node(s)", cfg.nnodes),
    }
}

/// `--dry-run` of one node: the rendezvous it would join and its ranks.
pub(crate) fn dry_run(s: &RunSettings, cfg: &AgentConfig) -> String {
    let p = &s.plan;
    let g = guess(cfg, p);
    let mut probe = launches_of(s, &g, &cfg.run_id);
    collective_ifname(&g.master_addr, &mut probe, None);
    let shown = prepare::dry_run(p, &probe, s.move_workers, &current);
    format!(
        "node {}: joins the rendezvous at {} (id {:?}) as one of {}; threadwise \
         supervises this node's ranks\n\
         RANK, GROUP_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT below assume {}; the \
         rendezvous sets them\n{shown}",
        cfg.host,
        cfg.endpoint,
        cfg.run_id,
        nodes_said(cfg),
        match cfg.node_rank {
            Some(r) => format!("node rank {r}"),
            None => "node rank 0, the same number of ranks on every node".into(),
        }
    )
}

/// A one-node job as a job of one node: its coordinator in the process, no
/// secret, MASTER_ADDR and MASTER_PORT as given (or a free port).
fn one_node(s: &RunSettings) -> AgentConfig {
    AgentConfig {
        // Not dialled: the coordinator is in the process.
        endpoint: crate::netif::Endpoint::new(&s.master_addr, s.master_port.unwrap_or(0)),
        nnodes: 1,
        min_nodes: 1,
        last_call: std::time::Duration::ZERO,
        node_rank: Some(0),
        run_id: crate::launch::env::run_id(),
        nproc: s.plan.nproc,
        max_restarts: s.max_restarts,
        master_port: s.master_port,
        join_timeout: std::time::Duration::from_secs(60),
        // The one node is this process: it cannot go silent.
        heartbeat_timeout: std::time::Duration::from_secs(365 * 86400),
        host: crate::os::hostname(),
        local_addr: Some(s.master_addr.clone()),
        linger: std::time::Duration::ZERO,
        auth: crate::rdzv::auth::Auth::Open,
    }
}

/// Run this node's part of every round of the job; the job's exit code.
pub(crate) fn run(s: &RunSettings, r: Shared) -> Result<i32, JobError> {
    let (cfg, multi) = match &s.cluster {
        Some(c) => (c.agent.clone(), true),
        None => (one_node(s), false),
    };
    let p = &s.plan;
    let host = cfg.host.clone();
    let mut probe = launches_of(s, &guess(&cfg, p), &cfg.run_id);
    before_start(s, &probe, &*r);
    let (relaxed, said) = prepare::check_bindings(&mut probe, s.allow_unbound)?;
    if let Some(w) = said {
        say(&*r, Level::Warning, w);
    }
    let report = s.cluster.as_ref().and_then(|c| c.report.clone());
    let mut node = Rounds {
        s,
        duplicate: duplicates(s)?,
        multi,
        r: r.clone(),
        // Every node's logs under DIR/<host>, so nodes sharing a file system
        // never write each other's files; one node's in DIR.
        logs: s.log_dir.as_ref().map(|d| match multi {
            true => d.join(&host),
            false => d.clone(),
        }),
        logs_made: false,
        relaxed,
        run_id: cfg.run_id.clone(),
        // Loaded once (NVML's start can take seconds), for tune's reports.
        gpu: report
            .as_ref()
            .and_then(|_| crate::measure::gpu::GpuSampler::new()),
        report,
        host,
        failures: vec![],
        last: Last::default(),
    };
    let end = if multi {
        say(
            &*r,
            Level::Note,
            format!(
                "{}: joining the rendezvous at {} ({}, id {:?})",
                node.host,
                cfg.endpoint,
                match cfg.min_nodes < cfg.nnodes {
                    true => format!("{} to {} node(s)", cfg.min_nodes, cfg.nnodes),
                    false => format!("{} node(s)", cfg.nnodes),
                },
                cfg.run_id
            ),
        );
        crate::rdzv::run(&cfg, |st, peer| node.round(st, peer))
    } else {
        crate::rdzv::local::run(&cfg, |st, peer| node.round(st, peer))
    };
    for f in &node.failures {
        say(&*r, Level::Text, f);
    }
    let end = end?;
    match (&end.cause, multi, node.last.signal) {
        (Some(cause), true, _) => say(&*r, Level::Note, format!("the job ended: {cause}")),
        (_, false, Some(sig)) if node.failures.is_empty() => say(
            &*r,
            Level::Note,
            format!("stopped by {}", crate::os::signal_name(sig)),
        ),
        _ => {}
    }
    if node.last.split_lines {
        say(
            &*r,
            Level::Note,
            format!(
                "a line longer than {} MiB was shown in pieces (the log files keep it whole)",
                crate::launch::output::MAX_LINE >> 20
            ),
        );
    }
    if let Some(d) = node.logs.as_ref().filter(|_| node.logs_made) {
        say(&*r, Level::Note, format!("logs in {}", d.display()));
    }
    for e in &node.last.log_errors {
        say(&*r, Level::Error, e);
    }
    // Ranks that succeeded with logs lost still make a failed run: exit 3.
    Ok(match end.code {
        0 if !node.last.log_errors.is_empty() => 3,
        code => code,
    })
}

/// What the rounds left to say at the end.
#[derive(Debug, Default)]
struct Last {
    /// The user's signal that stopped the ranks.
    signal: Option<i32>,
    split_lines: bool,
    /// Logs that could not be written whole, in any round.
    log_errors: Vec<String>,
}

/// The node's use in this round, for `tune --nnodes`.
fn usage(
    host: &str,
    s: &Start,
    p: &Plan,
    t: &crate::topology::Topology,
    o: &supervise::Outcome,
    gpu: Option<crate::measure::gpu::GpuSample>,
) -> NodeUsage {
    NodeUsage {
        host: host.to_string(),
        node_rank: s.node_rank,
        ranks: p.nproc,
        wall_s: o.wall.as_secs_f64(),
        cpu_s: o.results.iter().map(|r| r.cpu.as_secs_f64()).sum(),
        cpu_budget: t.cpu_budget,
        voluntary_cs: o.results.iter().map(|r| r.voluntary_cs).sum(),
        involuntary_cs: o.results.iter().map(|r| r.involuntary_cs).sum(),
        peak_rss_kib: o.results.iter().map(|r| r.max_rss_kib).sum(),
        gpu_util_pct: gpu.and_then(|g| g.util_pct),
    }
}

/// A sink that reads the throughput global rank 0 prints (this node's local
/// rank 0, when the node's first rank is global rank 0).
fn rank0_sink(metric: &Metric, s: &Start, best: &Arc<Mutex<Option<Hit>>>) -> Option<LineSink> {
    if s.rank_offset != 0 {
        return None;
    }
    let (m, best) = (metric.clone(), best.clone());
    Some(Arc::new(move |rank, line| {
        if let Some(hit) = (rank == 0).then(|| m.scan(0, line)).flatten() {
            hit.keep_in(&best);
        }
    }))
}

/// What every round on this node shares.
struct Rounds<'a> {
    s: &'a RunSettings,
    /// One node of many (else a one-node job: no host in its words).
    multi: bool,
    r: Shared,
    last: Last,
    /// torchrun's filtered copies of the output, one file each for the job.
    duplicate: [Option<LineSink>; 2],
    /// Report the node's use after each round, and global rank 0's
    /// throughput read this way (tune --nnodes).
    report: Option<Metric>,
    logs: Option<PathBuf>,
    /// A round's log directory was made: only then are the logs said to be
    /// there.
    logs_made: bool,
    /// What the kernel refused of the placements, given up in every round.
    relaxed: prepare::Relaxed,
    run_id: String,
    gpu: Option<crate::measure::gpu::GpuSampler>,
    host: String,
    /// Failure reports and errors of the latest round: said before the next
    /// starts, or once the job is over.
    failures: Vec<String>,
}

impl Rounds<'_> {
    /// One round: this node's ranks, supervised; how they ended.
    fn round(&mut self, s: &Start, peer: Arc<dyn Peer>) -> RoundEnd {
        let (run, p, host) = (self.s, &self.s.plan, self.host.clone());
        let r = self.r.clone();
        let last = s.rank_offset + p.nproc - 1;
        // The last round's failure, said before the ranks start again (a
        // job that recovers ends with no failure report).
        for f in self.failures.drain(..) {
            say(&*r, Level::Text, f);
        }
        let again = match s.round {
            0 => String::new(),
            round => format!(
                " (round {round}; restarts {} of {})",
                s.restarts, s.max_restarts
            ),
        };
        match self.multi {
            true => say(
                &*r,
                Level::Note,
                format!(
                    "{host}: node {} of {} ({}), ranks {}-{last} of {}, MASTER_ADDR={} MASTER_PORT={}{again}",
                    s.node_rank,
                    s.nnodes,
                    crate::launch::report::compact_hosts(&s.hosts),
                    s.rank_offset,
                    s.world_size,
                    s.master_addr,
                    s.master_port,
                ),
            ),
            false if s.round > 0 => say(&*r, Level::Note, format!("the ranks start again{again}")),
            false => {}
        }
        let mut launches = launches_of(run, s, &self.run_id);
        self.relaxed.apply(&mut launches);
        let on = match self.multi {
            true => format!("{host}: "),
            false => String::new(),
        };
        if !run.quiet {
            let line = crate::launch::report::placement_line(&launches, s.rank_offset);
            say(&*r, Level::Note, format!("{on}{line}"));
        }
        if self.multi {
            collective_ifname(&s.master_addr, &mut launches, (s.round == 0).then_some(&*r));
        }
        let dir = self.logs.as_ref().map(|d| match s.round {
            0 => d.clone(),
            r => d.join(format!("restart-{r}")),
        });
        let errors = match ErrorFiles::new(dir.as_deref()) {
            Ok(e) => e,
            Err(e) => {
                self.failures.push(format!("error: {e}\n"));
                return 3.into();
            }
        };
        if let Some(g) = &mut self.gpu {
            g.start(p.gpus(), Default::default());
        }
        let hit: Arc<Mutex<Option<Hit>>> = Arc::default();
        let sink = self.report.as_ref().and_then(|m| rank0_sink(m, s, &hit));
        let outcome = supervise_node(
            run,
            launches,
            &errors,
            Some(peer),
            (s.round, s.rank_offset),
            (sink, &self.duplicate),
            &r,
        );
        let gpu = self.gpu.as_mut().map(|g| g.stop());
        match outcome {
            Ok(o) => {
                // The ranks ran: their logs are there.
                self.logs_made |= dir.is_some();
                let named = self.multi.then_some(host.as_str());
                if let Some(f) = report::failure_report_on(&o, Some(&errors.dir), named) {
                    self.failures.push(f);
                }
                for (file, why) in &o.log_errors {
                    self.last
                        .log_errors
                        .push(format!("the log {file} is incomplete: {why}"));
                }
                self.last.signal = self.last.signal.or(o.signal);
                self.last.split_lines |= o.split_lines;
                RoundEnd {
                    // Ranks stopped for the rest of the job (SIGTERM from
                    // us) are no failure of this node's, but neither did
                    // they finish: the rendezvous hears their own code, so
                    // it can tell a round every node finished from one it
                    // stopped (an elastic job's newcomer).
                    code: match o.code() {
                        0 => o
                            .results
                            .iter()
                            .map(|r| r.exit.code())
                            .find(|c| *c != 0)
                            .unwrap_or(0),
                        c => c,
                    },
                    report: self.report.as_ref().map(|_| Report {
                        usage: usage(&host, s, p, &run.topology, &o, gpu),
                        hit: hit.lock().unwrap_or_else(|e| e.into_inner()).take(),
                    }),
                }
            }
            Err(e) => {
                self.failures
                    .push(format!("error: {e}\nhint: {}\n", e.hint()));
                e.code().into()
            }
        }
    }
}
