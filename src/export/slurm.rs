//! `--format slurm`: an srun line that binds each task with `mask_cpu`, in
//! local-rank order (Slurm's SLURM_LOCALID order), plus the shared thread
//! variables. Per-rank variables need `threadwise bind` under srun instead.

use super::{Context, ExportError, Exporter, bind_args, quote, quote_all};
use crate::plan::Plan;

pub(super) struct Slurm;

impl Exporter<Plan, Context> for Slurm {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let masks: Vec<String> = plan.ranks.iter().map(|r| r.cpus.to_hex()).collect();
        let bind = if plan.ranks.iter().all(|r| r.bind) {
            format!(" --cpu-bind=mask_cpu:{}", masks.join(","))
        } else {
            " --cpu-bind=none".to_string()
        };
        // Variables every rank shares go into --export, which splits at
        // commas: a value holding one (MALLOC_CONF) is set by env instead.
        let first = &plan.ranks[0].env;
        let (listed, with_comma): (Vec<_>, Vec<_>) = first
            .iter()
            .filter(|(k, v)| plan.ranks.iter().all(|r| r.env.get(*k) == Some(v)))
            .map(|(k, v)| format!("{k}={v}"))
            .partition(|kv| !kv.contains(','));
        let mut cmd = ctx.command_line();
        if !with_comma.is_empty() {
            cmd = format!("env {} {cmd}", quote_all(&with_comma));
        }
        let mut out = format!(
            "srun --ntasks-per-node={}{bind} --export={} {cmd}\n",
            plan.nproc,
            quote(&format!("ALL,{}", listed.join(",")))
        );
        let mut bind = vec![ctx.program.clone(), "bind".to_string()];
        bind.extend(bind_args(plan));
        out.push_str(&format!(
            "# or, with every per-rank variable: srun --ntasks-per-node={} --cpu-bind=none {} -- {cmd}\n",
            plan.nproc,
            quote_all(&bind)
        ));
        Ok(out)
    }
}
