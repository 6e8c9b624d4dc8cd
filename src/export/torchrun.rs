//! `--format torchrun`: the torchrun line that applies this plan per rank
//! through `threadwise bind` (torchrun's `--no-python` runs it directly).

use super::{Context, ExportError, Exporter, quote_all};
use crate::plan::{
    Amount, GpuSelect, MemPolicy, NProc, Plan, PlanRequest, Policy, Profile, Reserve, WaitPolicy,
};

/// The plan options that reproduce a request (defaults left out).
pub fn request_args(req: &PlanRequest) -> Vec<String> {
    let d = PlanRequest::default();
    let mut a = vec![];
    let mut opt = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    if req.nproc != NProc::Auto {
        opt("nproc-per-node", req.nproc.to_string());
    }
    if req.gpus != GpuSelect::Auto {
        opt("gpus", req.gpus.to_string());
    }
    if req.policy != Policy::Exclusive {
        opt("policy", req.policy.to_string());
    }
    if req.threads != Amount::Auto {
        opt("threads", req.threads.to_string());
    }
    if req.workers != Amount::Auto {
        opt("workers", req.workers.to_string());
    }
    if req.mem != MemPolicy::Local {
        opt("mem", req.mem.to_string());
    }
    if req.allocator != d.allocator {
        opt("allocator", req.allocator.to_string());
    }
    if req.profile == Profile::Seed {
        opt("profile", "seed".to_string());
    }
    if req.nnodes != 1 {
        opt("nnodes", req.nnodes.to_string());
    }
    if req.omp_wait != WaitPolicy::Default {
        opt("omp-wait", req.omp_wait.to_string());
    }
    if req.reserve != Reserve::None {
        opt("reserve", req.reserve.to_string());
    }
    for (flag, on) in [
        ("--smt", req.smt),
        ("--amp", req.amp),
        ("--oversubscribe", req.oversubscribe),
        ("--omp-bind", req.omp_bind),
    ] {
        if on {
            a.push(flag.to_string());
        }
    }
    a
}

/// The options `threadwise bind` needs to compute the same node plan: the
/// request's, with the local rank count always spelled out.
pub fn bind_args(plan: &Plan) -> Vec<String> {
    let mut a = request_args(&plan.request);
    if plan.request.nproc == NProc::Auto {
        a.splice(
            0..0,
            ["--nproc-per-node".to_string(), plan.nproc.to_string()],
        );
    }
    a
}

pub struct Torchrun;

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
