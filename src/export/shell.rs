//! Shell forms: `env` (exports for one rank, to `eval`), and one `numactl` or
//! `taskset` command line per rank. Every value is quoted for a POSIX shell.

use super::{Context, ExportError, Exporter};
use crate::plan::{MemPolicy, Plan, RankPlan};

/// Quote a word for a POSIX shell, only when it needs it (shell-words).
pub(crate) fn quote(s: &str) -> String {
    shell_words::quote(s).into_owned()
}

pub(crate) fn quote_all(words: &[String]) -> String {
    shell_words::join(words)
}

fn env_words(rank: &RankPlan) -> String {
    rank.env
        .iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) struct Env;

impl Exporter<Plan, Context> for Env {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let max = plan.ranks.len().saturating_sub(1);
        // One rank: it is the one (no --local-rank to ask for).
        let k = match (ctx.local_rank, plan.ranks.len()) {
            (Some(k), _) => k,
            (None, 1) => 0,
            (None, _) => return Err(ExportError::NeedRank { max }),
        };
        let rank = plan
            .ranks
            .get(k)
            .ok_or(ExportError::NoSuchRank { rank: k, max })?;
        let mut out = String::new();
        for (key, value) in &rank.env {
            out.push_str(&format!("export {key}={}\n", quote(value)));
        }
        Ok(out)
    }
}

fn numactl_args(rank: &RankPlan) -> Vec<String> {
    let nodes = rank
        .mem_nodes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![];
    if rank.bind {
        args.push(format!("--physcpubind={}", rank.cpus));
    }
    match rank.mem_policy {
        MemPolicy::Local => args.push("--localalloc".to_string()),
        MemPolicy::Preferred => {
            if let Some(n) = rank.mem_nodes.first() {
                args.push(format!("--preferred={n}"));
            }
        }
        MemPolicy::Bind if !nodes.is_empty() => args.push(format!("--membind={nodes}")),
        MemPolicy::Interleave if !nodes.is_empty() => args.push(format!("--interleave={nodes}")),
        _ => {}
    }
    args
}

pub(super) struct Numactl;

impl Exporter<Plan, Context> for Numactl {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let mut out = String::new();
        for r in &plan.ranks {
            out.push_str(&format!(
                "env LOCAL_RANK={} {} numactl {} -- {}\n",
                r.local_rank,
                env_words(r),
                numactl_args(r).join(" "),
                ctx.command_line()
            ));
        }
        Ok(out)
    }
}

pub(super) struct Taskset;

impl Exporter<Plan, Context> for Taskset {
    fn render(&self, plan: &Plan, ctx: &Context) -> Result<String, ExportError> {
        let mut out = String::new();
        for r in &plan.ranks {
            let bind = if r.bind {
                format!("taskset -c {} ", r.cpus)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "env LOCAL_RANK={} {} {bind}{}\n",
                r.local_rank,
                env_words(r),
                ctx.command_line()
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("abc-1,2"), "abc-1,2");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's $HOME"), "'it'\\''s $HOME'");
        assert_eq!(quote("`rm -rf`"), "'`rm -rf`'");
    }
}
