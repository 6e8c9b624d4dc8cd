//! `tune --nnodes N` inside a Slurm allocation: each trial is one srun step
//! of one `threadwise run --nnodes N` agent per node, the configuration
//! given as plan options so every node plans it from its own topology. The
//! metric is read from global rank 0's lines; every agent reports its node's
//! CPU (and GPU) use on a `threadwise-node:` line (`run --report-node`).
//!
//! Why srun and not torchrun's agents: srun is the allocation's own way onto
//! its nodes (no ssh, its cgroups and accounting), it starts the agents
//! together and kills the step as a whole on Ctrl-C or a timeout; the agents
//! then form the job through their own rendezvous, as a user's job does.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::metric::{Hit, Metric};
use super::{NodeUsage, TrialEnd, TrialOutcome, TuneConfig};
use crate::export::request_args;
use crate::launch::RankLaunch;
use crate::launch::output::{LineSink, OutputOptions};
use crate::launch::supervise::{self, RunOptions};

/// The marker of an agent's node report.
pub const NODE_LINE: &str = "threadwise-node: ";

/// How trials reach the nodes.
#[derive(Debug, Clone)]
pub struct NodesRunner {
    pub nnodes: usize,
    pub srun: PathBuf,
    /// This threadwise, as the nodes run it (a shared path, as srun needs).
    pub me: PathBuf,
    /// The allocation's first node: it hosts every trial's rendezvous.
    pub first_host: String,
    /// CPUs each agent's task takes (the allocation's per-node count).
    pub cpus_per_task: Option<usize>,
    pub argv: Vec<OsString>,
    pub timeout: Duration,
    pub grace: Duration,
    /// The first rendezvous port; each trial takes the next.
    pub port: u16,
    trials: usize,
}

/// SLURM_JOB_CPUS_PER_NODE ("8(x2),4"): the smallest count, so one task per
/// node fits on every node.
pub fn min_cpus_per_node(s: &str) -> Option<usize> {
    s.split(',')
        .filter_map(|part| part.split('(').next()?.trim().parse::<usize>().ok())
        .min()
}

impl NodesRunner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        nnodes: usize,
        srun: PathBuf,
        me: PathBuf,
        first_host: String,
        cpus_per_task: Option<usize>,
        argv: Vec<OsString>,
        timeout: Duration,
        port: u16,
    ) -> NodesRunner {
        NodesRunner {
            nnodes,
            srun,
            me,
            first_host,
            cpus_per_task,
            argv,
            timeout,
            grace: Duration::from_secs(5),
            port,
            trials: 0,
        }
    }

    /// The srun command line of one trial of `c`.
    pub fn command(&self, c: &TuneConfig, port: u16, id: &str) -> Vec<OsString> {
        let mut req = c.request.clone();
        req.nnodes = self.nnodes;
        let mut v: Vec<OsString> = vec![
            self.srun.clone().into(),
            format!("--nodes={}", self.nnodes).into(),
            "--ntasks-per-node=1".into(),
            "--kill-on-bad-exit=1".into(),
        ];
        if let Some(c) = self.cpus_per_task {
            v.push(format!("--cpus-per-task={c}").into());
        }
        v.extend([
            self.me.clone().into_os_string(),
            "run".into(),
            "--rdzv-endpoint".into(),
            format!("{}:{port}", self.first_host).into(),
            "--rdzv-id".into(),
            id.into(),
            "--rdzv-timeout".into(),
            "60".into(),
            "--report-node".into(),
            "--no-doctor".into(),
            "--quiet".into(),
        ]);
        v.extend(request_args(&req).into_iter().map(OsString::from));
        v.push("--".into());
        v.extend(self.argv.iter().cloned());
        v
    }
}

/// Global rank 0's text, from an agent's prefixed line.
fn rank0(line: &str) -> Option<&str> {
    line.strip_prefix("[rank 0] ")
        .or_else(|| line.starts_with("[rank0]:").then_some(line))
}

impl super::TrialRunner for NodesRunner {
    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let port = self.port.wrapping_add(self.trials as u16).max(1024);
        let id = format!("tune-{}-{}", std::process::id(), self.trials);
        self.trials += 1;
        let argv = self.command(c, port, &id);
        let launch = RankLaunch {
            local_rank: 0,
            program: Some(self.srun.clone()),
            argv,
            env: Default::default(),
            env_remove: vec![],
            placement: Default::default(),
            cpus: "(srun)".into(),
            mem: "(srun)".into(),
            worker_mask: None,
        };
        let hit: Arc<Mutex<Option<Hit>>> = Arc::default();
        let nodes: Arc<Mutex<Vec<NodeUsage>>> = Arc::default();
        let (m, h, n) = (metric.clone(), hit.clone(), nodes.clone());
        let sink: LineSink = Arc::new(move |_, line| {
            if let Some(json) = line.strip_prefix(NODE_LINE) {
                if let Ok(u) = serde_json::from_str::<NodeUsage>(json) {
                    n.lock().unwrap_or_else(|e| e.into_inner()).push(u);
                }
            } else if let Some(found) = rank0(line).and_then(|l| m.scan(0, l)) {
                found.keep_in(&h);
            }
        });
        let opts = RunOptions {
            grace: self.grace,
            timeout: Some(self.timeout),
            output: OutputOptions {
                rank_base: 0,
                prefix: false,
                show: Some(vec![]),
                sink: Some(sink),
            },
            log_dir: None,
            on_spawned: None,
            move_workers: false,
            peer: None,
        };
        let o = match supervise::run(&[launch], &opts) {
            Ok(o) => o,
            Err(e) => return TrialOutcome::not_started(e.to_string()),
        };
        let mut nodes = std::mem::take(&mut *nodes.lock().unwrap_or_else(|e| e.into_inner()));
        nodes.sort_by_key(|n| n.node_rank);
        nodes.dedup_by_key(|n| n.node_rank);
        let srun = o.results.first();
        let end = if o.signal.is_some() {
            TrialEnd::Interrupted
        } else if o.timed_out {
            TrialEnd::TimedOut
        } else if let Some(r) = srun.filter(|r| !r.exit.success()) {
            TrialEnd::RankFailed {
                local_rank: 0,
                pid: r.pid,
                exit: r.exit,
            }
        } else if nodes.len() != self.nnodes {
            TrialEnd::NotStarted(format!(
                "{} of {} node(s) reported their use (is threadwise at {} on every node?)",
                nodes.len(),
                self.nnodes,
                self.me.display()
            ))
        } else {
            TrialEnd::Ok
        };
        let gpu: Vec<f64> = nodes.iter().filter_map(|n| n.gpu_util_pct).collect();
        TrialOutcome {
            end,
            hit: hit.lock().unwrap_or_else(|e| e.into_inner()).take(),
            wall: o.wall,
            cpu: Duration::from_secs_f64(nodes.iter().map(|n| n.cpu_s).sum()),
            voluntary_cs: nodes.iter().map(|n| n.voluntary_cs).sum(),
            involuntary_cs: nodes.iter().map(|n| n.involuntary_cs).sum(),
            peak_rss_kib: nodes.iter().map(|n| n.peak_rss_kib).sum(),
            stderr_tail: o.tails.first().cloned().unwrap_or_default(),
            gpu_util_pct: (!gpu.is_empty()).then(|| gpu.iter().sum::<f64>() / gpu.len() as f64),
            gpu_mem_mib: None,
            gpu_job_mem_mib: None,
            gpu_others: vec![],
            // Other nodes' /proc/stat is not ours to read: no disturbance figure.
            outside_cpu: None,
            steal: None,
            nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_node_cpus_and_rank_0_lines() {
        assert_eq!(min_cpus_per_node("8(x2),4"), Some(4));
        assert_eq!(min_cpus_per_node("2(x2)"), Some(2));
        assert_eq!(min_cpus_per_node("x"), None);
        assert_eq!(
            rank0("[rank 0] threadwise: throughput=5 img/s"),
            Some("threadwise: throughput=5 img/s")
        );
        assert_eq!(rank0("[rank 1] threadwise: throughput=5 img/s"), None);
        assert_eq!(rank0("[rank0]: loss 1"), Some("[rank0]: loss 1"));
    }
}
