//! The default view: one row per rank, then (with --explain) every reason.

use comfy_table::{Table as Grid, presets::UTF8_FULL_CONDENSED};

use super::{Context, ExportError, Exporter};
use crate::plan::Plan;

pub(super) struct Table;

impl Exporter<Plan, Context> for Table {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let mut grid = Grid::new();
        grid.load_preset(UTF8_FULL_CONDENSED);
        grid.set_header([
            "rank",
            "cpus",
            "cores",
            "memory",
            "gpu",
            "threads",
            "workers",
            "worker cpus",
        ]);
        for r in &plan.ranks {
            let mem = if r.mem_nodes.is_empty() {
                r.mem_policy.to_string()
            } else {
                let nodes: Vec<String> = r.mem_nodes.iter().map(usize::to_string).collect();
                format!("{} {}", r.mem_policy, nodes.join(","))
            };
            let cpus = match (&r.roles, r.bind) {
                (Some(l), _) => format!("{} (service {}, team {})", r.cpus, l.service, l.team),
                (None, true) => r.cpus.to_string(),
                (None, false) => format!("{} (unbound)", r.cpus),
            };
            let gpu = match (&r.gpu, r.gpu_ordinal) {
                (Some(bus), Some(i)) => format!("cuda:{i} {bus}"),
                (Some(bus), None) => bus.clone(),
                _ => "-".to_string(),
            };
            grid.add_row([
                r.local_rank.to_string(),
                cpus,
                r.cores.to_string(),
                mem,
                gpu,
                r.threads.to_string(),
                r.workers.to_string(),
                r.worker_cpus.to_string(),
            ]);
        }
        let mut out = format!(
            "{} rank(s), policy {}, on {} (allowed {}, budget {:.2} CPUs)\n{grid}\n",
            plan.nproc, plan.request.policy, plan.source, plan.allowed_cpus, plan.cpu_budget
        );
        if let Some(a) = &plan.allocator {
            out.push_str(&format!("allocator: {} ({})\n", a.kind, a.path));
        }
        if ctx.explain {
            out.push_str("why:\n");
            for r in &plan.reasons {
                out.push_str(&format!("  - {r}\n"));
            }
            // A reason every rank shares is said once.
            let shared = |r: &String| {
                plan.ranks.len() > 1 && plan.ranks.iter().all(|k| k.reasons.contains(r))
            };
            for r in plan.ranks[0].reasons.iter().filter(|r| shared(r)) {
                out.push_str(&format!("  - every rank: {r}\n"));
            }
            for rank in &plan.ranks {
                for r in rank.reasons.iter().filter(|r| !shared(r)) {
                    out.push_str(&format!("  - rank {}: {r}\n", rank.local_rank));
                }
            }
        } else {
            out.push_str("(--explain for the reasons, --format env|numactl|taskset|slurm|torchrun|json for other forms)\n");
        }
        Ok(out)
    }
}
