//! `tune --nnodes N` inside a Slurm allocation: each trial is one srun step
//! of one `threadwise run --nnodes N` agent per node, the configuration's
//! plan request handed over whole (`--plan-request`, JSON) so every node
//! plans it from its own topology. tune hosts each trial's rendezvous
//! itself, and every agent reports its node's CPU (and GPU) use there, the
//! node that runs global rank 0 with the throughput it printed
//! (`run --report-node`): typed messages, nothing read back from output.
//!
//! Why srun and not torchrun's agents: srun is the allocation's own way onto
//! its nodes (no ssh, its cgroups and accounting), it starts the agents
//! together and kills the step as a whole on Ctrl-C or a timeout; the agents
//! then form the job through their own rendezvous, as a user's job does.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::trial::Used;
use super::{TrialEnd, TrialOutcome, TuneConfig};
use crate::job::trial::{self as launch, RankLaunch, ReportHost, Trial};
use crate::measure::throughput::Metric;

/// How long a trial's nodes may take to join, and be silent.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// How trials reach the nodes.
#[derive(Debug, Clone)]
pub(crate) struct SrunRunner {
    pub nnodes: usize,
    pub srun: PathBuf,
    /// This threadwise, as the nodes run it (a shared path, as srun needs).
    pub me: PathBuf,
    /// This host's name, as the nodes reach the rendezvous tune hosts.
    pub host: String,
    /// CPUs each agent's task takes (the allocation's per-node count).
    pub cpus_per_task: Option<usize>,
    pub argv: Vec<OsString>,
    pub timeout: Duration,
    pub grace: Duration,
    trials: usize,
}

/// SLURM_JOB_CPUS_PER_NODE ("8(x2),4"): the smallest count, so one task per
/// node fits on every node.
pub(crate) fn min_cpus_per_node(s: &str) -> Option<usize> {
    s.split(',')
        .filter_map(|part| part.split('(').next()?.trim().parse::<usize>().ok())
        .min()
}

impl SrunRunner {
    pub(crate) fn new(
        nnodes: usize,
        srun: PathBuf,
        me: PathBuf,
        host: String,
        cpus_per_task: Option<usize>,
        argv: Vec<OsString>,
        timeout: Duration,
    ) -> SrunRunner {
        SrunRunner {
            nnodes,
            srun,
            me,
            host,
            cpus_per_task,
            argv,
            timeout,
            grace: Duration::from_secs(5),
            trials: 0,
        }
    }

    /// The srun command line of one trial of `c`, its rendezvous at `port`
    /// of this host.
    pub(crate) fn command(
        &self,
        c: &TuneConfig,
        port: u16,
        id: &str,
        metric: &Metric,
    ) -> Vec<OsString> {
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
            format!("{}:{port}", self.host).into(),
            "--rdzv-id".into(),
            id.into(),
            "--rdzv-timeout".into(),
            JOIN_TIMEOUT.as_secs().to_string().into(),
            "--heartbeat-timeout".into(),
            HEARTBEAT_TIMEOUT.as_secs().to_string().into(),
            "--report-node".into(),
            "--no-doctor".into(),
            "--quiet".into(),
            "--nnodes".into(),
            self.nnodes.to_string().into(),
            "--plan-request".into(),
            serde_json::to_string(&req).unwrap_or_default().into(),
        ]);
        if let Some(re) = metric.pattern() {
            v.extend(["--report-metric".into(), re.into()]);
        }
        v.push("--".into());
        v.extend(self.argv.iter().cloned());
        v
    }
}

impl super::TrialRunner for SrunRunner {
    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let id = format!("tune-{}-{}", std::process::id(), self.trials);
        self.trials += 1;
        // A port free here, so trials (and tunes of other jobs) never collide.
        // The agents srun starts inherit this environment: the same mode.
        let hosted = match ReportHost::start(self.nnodes, &id, JOIN_TIMEOUT, HEARTBEAT_TIMEOUT) {
            Ok(h) => h,
            Err(e) => return TrialOutcome::not_started(e),
        };
        let port = hosted.port;
        let launch = RankLaunch {
            local_rank: 0,
            program: Some(self.srun.clone()),
            argv: self.command(c, port, &id, metric),
            env: Default::default(),
            env_remove: vec![],
            placement: Default::default(),
            cpus: "(srun)".into(),
            mem: "(srun)".into(),
            worker_mask: None,
            hold: None,
        };
        let t = Trial {
            launches: std::slice::from_ref(&launch),
            grace: self.grace,
            timeout: self.timeout,
            move_workers: false,
            prefix: false,
        };
        let o = launch::run(&t, Arc::new(crate::job::events::Quiet));
        let reports = hosted.finish();
        let o = match o {
            Ok(o) => o,
            Err(e) => return TrialOutcome::not_started(e.to_string()),
        };
        let hit = reports.iter().find_map(|(_, hit)| hit.clone());
        let nodes: Vec<_> = reports.into_iter().map(|(usage, _)| usage).collect();
        let mut t = TrialOutcome::of(&o, hit, Used::of_nodes(&nodes));
        if t.end == TrialEnd::Ok && nodes.len() != self.nnodes {
            t.end = TrialEnd::NotStarted(format!(
                "{} of {} node(s) reported their use (is threadwise at {} on every node?)",
                nodes.len(),
                self.nnodes,
                self.me.display()
            ));
        }
        let gpu: Vec<f64> = nodes.iter().filter_map(|n| n.gpu_util_pct).collect();
        t.gpu_util_pct = (!gpu.is_empty()).then(|| gpu.iter().sum::<f64>() / gpu.len() as f64);
        // Other nodes' /proc/stat is not ours to read: no disturbance figure.
        t.nodes = nodes;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_node_cpus() {
        assert_eq!(min_cpus_per_node("8(x2),4"), Some(4));
        assert_eq!(min_cpus_per_node("2(x2)"), Some(2));
        assert_eq!(min_cpus_per_node("x"), None);
    }
}
