//! `--format slurm`: an srun line that binds each task with `mask_cpu`, in
//! local-rank order (Slurm's SLURM_LOCALID order), plus the shared thread
//! variables. Per-rank variables need `threadwise bind` under srun instead.

use super::{Context, ExportError, Exporter, quote, request_args};
use crate::plan::Plan;

pub struct Slurm;

impl Exporter for Slurm {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let masks: Vec<String> = plan.ranks.iter().map(|r| r.cpus.to_hex()).collect();
        let bind = if plan.ranks.iter().all(|r| r.bind) {
            format!(" --cpu-bind=mask_cpu:{}", masks.join(","))
        } else {
            " --cpu-bind=none".to_string()
        };
        // Variables every rank shares go into --export.
        let first = &plan.ranks[0].env;
        let shared: Vec<String> = first
            .iter()
            .filter(|(k, v)| plan.ranks.iter().all(|r| r.env.get(*k) == Some(v)))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let cmd = if ctx.command.is_empty() {
            "\"$@\"".to_string()
        } else {
            super::quote_all(&ctx.command)
        };
        let mut out = format!(
            "srun --ntasks-per-node={}{bind} --export={} {cmd}\n",
            plan.nproc,
            quote(&format!("ALL,{}", shared.join(",")))
        );
        let mut bind = vec![ctx.program.clone(), "bind".to_string()];
        bind.extend(request_args(&plan.request));
        out.push_str(&format!(
            "# or, with every per-rank variable: srun --ntasks-per-node={} --cpu-bind=none {} -- {cmd}\n",
            plan.nproc,
            super::quote_all(&bind)
        ));
        Ok(out)
    }
}
