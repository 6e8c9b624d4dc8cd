//! What `run` was asked to do, typed: the settings the command line builds
//! once (ripgrep's LowArgs -> HiArgs), what one node of many adds, and why a
//! job could not run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Hinted, Kind};
use crate::launch::LaunchError;
use crate::launch::prepare::PrepareError;
use crate::plan::Plan;
use crate::rdzv::{AgentConfig, ClusterError};
use crate::topology::Topology;

/// What `run` was asked to do, checked and resolved: the plan is made, the
/// program found.
pub(crate) struct RunSettings {
    /// The command each rank runs, as typed (argv[0] as given).
    pub command: Vec<OsString>,
    /// argv[0] resolved on PATH.
    pub program: PathBuf,
    pub plan: Plan,
    pub topology: Topology,
    pub master_addr: String,
    pub master_port: Option<u16>,
    pub grace: Duration,
    pub prefix: bool,
    /// Show only these local ranks' output (`--local-ranks-filter`; none
    /// under `run --top`, whose view takes the terminal).
    pub show: Option<Vec<usize>>,
    pub move_workers: bool,
    /// Put back threads that leave their rank's CPUs (`--hold`).
    pub hold: crate::proc::hold::Hold,
    pub log_dir: Option<PathBuf>,
    pub allow_unbound: bool,
    /// Restarts of the ranks after a failure (`--max-restarts`), on one node
    /// as on many.
    pub max_restarts: u32,
    /// No per-rank summary at the end.
    pub quiet: bool,
    /// ROLE_NAME for every rank (torchrun's `--role`).
    pub role: String,
    /// One node of many: the rendezvous to join.
    pub cluster: Option<ClusterSettings>,
    /// What torchrun's own options change (`cli/torchrun.rs`).
    pub torchrun: TorchrunOutput,
}

/// What torchrun's options change in a run: variables every rank gets
/// (LOCAL_RANK=0 with --virtual-local-rank, TORCHELASTIC_SIGNALS_TO_HANDLE),
/// the output prefix's template, the filtered copies of the output and
/// where they go, the user signals that stop the job.
#[derive(Debug, Clone, Default)]
pub(crate) struct TorchrunOutput {
    pub env: Vec<(String, String)>,
    pub prefix_template: Option<String>,
    /// Filters for stdout and stderr (`--duplicate-std*-filters`).
    pub duplicate: [Option<Vec<String>>; 2],
    pub dup_dir: Option<PathBuf>,
    pub stop_on_usr: Vec<i32>,
}

impl TorchrunOutput {
    /// Every launch gets the variables torchrun's options set.
    pub(crate) fn set_env(&self, launches: &mut [crate::launch::RankLaunch]) {
        for l in launches {
            for (k, v) in &self.env {
                l.env.insert(k.clone(), v.clone());
            }
        }
    }
}

/// One node of a multi-node job.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSettings {
    pub agent: AgentConfig,
    /// Report this node's use to the rendezvous after each round, with global
    /// rank 0's throughput read by this metric (tune --nnodes).
    pub report: Option<crate::measure::throughput::Metric>,
}

/// Why a job could not run (its ranks' own failures are exit codes, not these).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl Hinted for JobError {
    fn kind(&self) -> Kind {
        match self {
            JobError::Launch(e) => e.kind(),
            JobError::Prepare(e) => e.kind(),
            JobError::Cluster(e) => e.kind(),
        }
    }

    /// What to do about it (empty when nothing is to be done).
    fn hint(&self) -> String {
        match self {
            JobError::Launch(e) => e.hint(),
            JobError::Prepare(e) => e.hint(),
            JobError::Cluster(e) => e.hint(),
        }
    }
}
