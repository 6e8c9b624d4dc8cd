//! `--format torchrun`: the torchrun line that applies this plan per rank
//! through `threadwise bind` (torchrun's `--no-python` runs it directly).

use super::{Context, ExportError, Exporter, quote_all};
use crate::plan::{NProc, Plan, PlanRequest};

/// The plan options that reproduce a request (defaults left out).
pub(crate) fn request_args(req: &PlanRequest) -> Vec<String> {
    let d = PlanRequest::default();
    let mut a = vec![];
    let mut opt = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    if req.nproc != d.nproc {
        opt("nproc-per-node", req.nproc.to_string());
    }
    if req.gpus != d.gpus {
        opt("gpus", req.gpus.to_string());
    }
    if req.policy != d.policy {
        opt("policy", req.policy.to_string());
    }
    if req.threads != d.threads {
        opt("threads", req.threads.to_string());
    }
    if req.workers != d.workers {
        opt("workers", req.workers.to_string());
    }
    if req.mem != d.mem {
        opt("mem", req.mem.to_string());
    }
    if req.allocator != d.allocator {
        opt("allocator", req.allocator.to_string());
    }
    if req.profile != d.profile {
        opt("profile", req.profile.to_string());
    }
    if req.nnodes != d.nnodes {
        opt("nnodes", req.nnodes.to_string());
    }
    if req.omp_wait != d.omp_wait {
        opt("omp-wait", req.omp_wait.to_string());
    }
    if req.reserve != d.reserve {
        opt("reserve", req.reserve.to_string());
    }
    for (flag, on, default) in [
        ("--smt", req.smt, d.smt),
        ("--amp", req.amp, d.amp),
        ("--oversubscribe", req.oversubscribe, d.oversubscribe),
        ("--omp-bind", req.omp_bind, d.omp_bind),
        ("--roles", req.roles, d.roles),
    ] {
        if on && !default {
            a.push(flag.to_string());
        }
    }
    a
}

/// The options `threadwise bind` needs to compute the same node plan: the
/// request's, with the local rank count always spelled out.
pub(crate) fn bind_args(plan: &Plan) -> Vec<String> {
    let mut a = request_args(&plan.request);
    if plan.request.nproc == NProc::Auto {
        a.splice(
            0..0,
            ["--nproc-per-node".to_string(), plan.nproc.to_string()],
        );
    }
    a
}

pub(super) struct Torchrun;

impl Exporter<Plan, Context> for Torchrun {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let cmd = ctx.command_line();
        let bind = bind_args(plan);
        let nodes = if plan.request.nnodes > 1 {
            format!(
                "--nnodes {} --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id JOB",
                plan.request.nnodes
            )
        } else {
            "--standalone".to_string()
        };
        Ok(format!(
            "torchrun {nodes} --nproc-per-node {} --no-python {} bind {} -- {cmd}\n",
            plan.nproc,
            ctx.program,
            quote_all(&bind)
        ))
    }
}
