//! `threadwise run` and `threadwise bind`: the options into typed settings
//! (`launch::settings::RunSettings`, one node's agent settings), then the launch
//! entry point (`launch::job`) or bind's exec; the result into an exit code.

use std::path::PathBuf;

use super::args::{BindCmd, RunCmd};
use super::pet::{self, FromEnv};
use super::settings::{load, request};
use super::{Exit, Failure, SourceArgs, settings};
use crate::launch::cluster::AgentConfig;
use crate::launch::env::current;
use crate::launch::job;
use crate::launch::prepare::{self, PrepareError};
use crate::launch::settings::{ClusterSettings, JobError, RunSettings};
use crate::launch::{LaunchError, bind, resolve};
use crate::measure::throughput::Metric;
use crate::plan::{self, Plan, PlanRequest};
use crate::top::watch::TopWatcher;
use crate::topology::Topology;

impl From<LaunchError> for Failure {
    fn from(e: LaunchError) -> Self {
        Failure {
            code: e.code(),
            message: e.to_string(),
            hint: Some(e.hint().to_string()),
        }
    }
}

impl From<PrepareError> for Failure {
    fn from(e: PrepareError) -> Self {
        Failure {
            code: e.code(),
            message: e.to_string(),
            hint: Some(e.hint()),
        }
    }
}

impl From<JobError> for Failure {
    fn from(e: JobError) -> Self {
        Failure {
            code: e.code(),
            message: e.to_string(),
            hint: Some(e.hint()).filter(|h| !h.is_empty()),
        }
    }
}

/// The agent's settings from the options; the run id defaults to Slurm's job id.
fn agent_config(a: &RunCmd, nproc: usize) -> AgentConfig {
    AgentConfig {
        endpoint: a.rdzv_endpoint.clone().unwrap_or_default(),
        nnodes: a.plan.nnodes as usize,
        node_rank: a
            .node_rank
            .map(|r| r as usize)
            .or_else(|| crate::launch::detect::slurm_node_rank(&current, a.plan.nnodes as usize)),
        run_id: a
            .rdzv_id
            .clone()
            .or_else(|| current("SLURM_JOB_ID"))
            .unwrap_or_else(|| "none".into()),
        nproc,
        max_restarts: a.max_restarts,
        master_port: a.master_port,
        join_timeout: a.rdzv_timeout,
        heartbeat_timeout: a.heartbeat_timeout,
        host: crate::os::hostname(),
        linger: a.grace + std::time::Duration::from_secs(3),
    }
}

/// The run's settings: what the user typed, checked, with the plan made.
fn run_settings(
    a: RunCmd,
    program: PathBuf,
    plan: Plan,
    topology: Topology,
) -> Result<RunSettings, Failure> {
    let report =
        match a.report_node {
            true => Some(Metric::new(a.report_metric.as_deref()).map_err(|e| {
                Failure::usage(e.to_string(), "give a regex with one capture group")
            })?),
            false => None,
        };
    let cluster = (a.plan.nnodes > 1 || a.rdzv_endpoint.is_some()).then(|| ClusterSettings {
        agent: agent_config(&a, plan.nproc),
        report,
    });
    Ok(RunSettings {
        command: a.command,
        program,
        plan,
        topology,
        master_addr: a.master_addr,
        master_port: a.master_port,
        grace: a.grace,
        prefix: !a.no_prefix,
        // The live view takes the terminal; the output still goes to the logs.
        show: if a.top {
            Some(vec![])
        } else {
            a.local_ranks_filter
        },
        move_workers: !a.no_move_workers,
        log_dir: a.log_dir,
        allow_unbound: a.allow_unbound,
        watcher: Some(Box::new(TopWatcher { live: a.top })),
        quiet: a.quiet,
        cluster,
    })
}

/// The plan request: the plan options, or the JSON tune --nnodes hands over.
fn run_request(a: &RunCmd) -> Result<PlanRequest, Failure> {
    let Some(json) = &a.plan_request else {
        return Ok(request(&a.plan));
    };
    let mut req: PlanRequest = serde_json::from_str(json).map_err(|e| {
        Failure::usage(
            format!("--plan-request is not a plan request: {e}"),
            "give the `request` object of plan --json",
        )
    })?;
    req.nnodes = a.plan.nnodes as usize;
    Ok(req)
}

pub(super) fn run(mut a: RunCmd, from_env: &[FromEnv]) -> Result<Exit, Failure> {
    let Some(first) = a.command.first() else {
        return Err(LaunchError::NoCommand.into());
    };
    let program = resolve(first)?;
    // What came from torchrun's environment, said at start-up and in the dry run.
    let mut notes: Vec<String> = pet::said(from_env).into_iter().collect();
    // torchrun's static shape (node ranks and a master, no endpoint, as
    // Kubeflow's trainer v2 gives): the rendezvous at MASTER_ADDR:MASTER_PORT,
    // the ranks' MASTER_PORT a free port of node 0 (torchrun's static backend
    // does the same).
    if a.plan.nnodes > 1
        && a.rdzv_endpoint.is_none()
        && let Some(port) = a.master_port.take()
    {
        let endpoint = format!("{}:{port}", a.master_addr);
        notes.push(format!(
            "no --rdzv-endpoint: the rendezvous is at the master {endpoint} (torchrun's static \
             shape); the ranks' MASTER_PORT is a port free on node 0"
        ));
        a.rdzv_endpoint = Some(endpoint);
    }
    settings::check_run(&a)?;
    let req = run_request(&a)?;
    let t = load(&SourceArgs::default())?;
    let p = match &a.plan_file {
        Some(path) => prepare::saved_plan(path, &t)?,
        None => plan::plan(&t, &req, &crate::host::facts(&req))?,
    };
    settings::check_run_plan(&a, p.nproc)?;
    let (dry, doctor) = (a.dry_run, !a.no_doctor);
    let s = run_settings(a, program, p, t)?;
    if dry {
        let lines: String = notes.iter().map(|n| format!("{n}\n")).collect();
        return super::emit(&format!("{lines}{}", job::dry_run(&s)?));
    }
    for n in &notes {
        crate::say!("threadwise: {n}");
    }
    if doctor {
        crate::doctor::say_preflight(&s.topology, s.plan.nproc);
    }
    Ok(Exit(job::run(&s)?))
}

pub(super) fn bind_cmd(a: BindCmd) -> Result<Exit, Failure> {
    if a.command.is_empty() && !a.json {
        return Err(LaunchError::NoCommand.into());
    }
    let given = match (a.local_rank, a.local_world_size) {
        (Some(k), Some(n)) if n == 0 || k >= n => {
            return Err(Failure::usage(
                format!(
                    "--local-rank {k} with --local-world-size {n}: a local rank is 0 to size - 1"
                ),
                "give the process's index among the ranks of this node, and their number",
            ));
        }
        (Some(k), Some(n)) => Some((k, n)),
        _ => None,
    };
    let t = load(&SourceArgs::default())?;
    let (p, l, launcher) = prepare::bind_launch(t, request(&a.plan), &a.command, &current, given)?;
    if a.json {
        let doc = prepare::bind_json(&p, &l, &launcher).map_err(|e| {
            Failure::env(
                format!("cannot serialise the slice: {e}"),
                "report this as a bug",
            )
        })?;
        return super::emit(&doc);
    }
    // Said once per job (by task 0), not once per task.
    let derived: Vec<String> = ["MASTER_ADDR", "MASTER_PORT"]
        .iter()
        .filter(|k| current(k).is_none())
        .filter_map(|k| Some(format!("{k}={}", l.env.get(*k)?)))
        .collect();
    if !derived.is_empty() && !a.dry_run && current("SLURM_PROCID").as_deref() == Some("0") {
        crate::say!(
            "threadwise: {} (unset: from the step's first node and 15000 + the job id's last 4 digits, as Lightning does)",
            derived.join(" ")
        );
    }
    if a.dry_run {
        let one = Plan {
            nproc: 1,
            ..p.clone()
        };
        return super::emit(&prepare::dry_run(&one, &[l], false, &current));
    }
    Err(bind::exec_rank(&l, a.allow_unbound).into())
}
