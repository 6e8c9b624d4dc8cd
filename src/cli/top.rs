//! `threadwise top`: the options into targets, then the view (once, as JSON
//! lines, or the terminal UI). `run`'s hooks for top are in `top::watch`.

use super::args::TopCmd;
use super::settings::load;
use super::{Exit, Failure, SourceArgs, emit};
use crate::top::find;
use crate::top::{Sampler, Target, View, ui};

/// Plain text of one view, for `--once` without `--json`.
fn text(v: &View) -> String {
    let mut out = format!("{} rank(s) over {:.1} s\n", v.ranks.len(), v.interval_s);
    for r in &v.ranks {
        out.push_str(&format!(
            "rank {} pid {} {}: cpu {:.0}% usr {:.0}% sys, {} threads ({} runnable), \
             {:.0}/{:.0} cs/s, planned {} ran on {}, {:.0} MiB, {} worker(s)\n",
            r.local_rank,
            r.pid,
            r.comm,
            r.cpu_user_pct,
            r.cpu_sys_pct,
            r.threads,
            r.runnable,
            r.voluntary_cs_per_s,
            r.involuntary_cs_per_s,
            r.planned,
            r.ran_on,
            r.rss_mib,
            r.workers.len()
        ));
        if let Some(line) = roles_line(r) {
            out.push_str(&line);
        }
    }
    for a in &v.alerts {
        out.push_str(&format!("alert {}: {}\n", a.kind, a.reason));
    }
    out
}

/// A rank's threads by role: how many of each, how many are off their
/// role's CPUs, and the corrections `run` made.
fn roles_line(r: &crate::top::RankView) -> Option<String> {
    if r.by_thread.is_empty() {
        return None;
    }
    let mut by: std::collections::BTreeMap<crate::roles::Role, usize> = Default::default();
    for t in &r.by_thread {
        *by.entry(t.role).or_default() += 1;
    }
    let counts: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let off = r
        .by_thread
        .iter()
        .filter(|t| !t.cpus.is_subset(&t.role_cpus))
        .count();
    let fixed: u32 = r.by_thread.iter().map(|t| t.corrections).sum();
    Some(format!(
        "  threads by role: {}; {off} off their role's CPUs; {fixed} correction(s) by run\n",
        counts.join(", ")
    ))
}

fn find_targets(a: &TopCmd) -> Result<Vec<Target>, Failure> {
    if !a.pid.is_empty() {
        let mut out = vec![];
        let runs = find::live_runs();
        for (i, pid) in a.pid.iter().enumerate() {
            // A `threadwise run`'s own pid: its ranks, as its state file says.
            if let Some(r) = runs.iter().find(|r| r.pid == *pid) {
                out.extend(r.ranks.iter().cloned());
                continue;
            }
            let env = crate::measure::process::environ(*pid).map_err(|e| {
                Failure::usage(
                    format!("--pid {pid}: cannot read the process: {e}"),
                    "give the pid of a running rank you may read",
                )
            })?;
            let mut t = find::target_from_env(*pid, &env).unwrap_or(Target {
                local_rank: i,
                pid: *pid,
                cpus: Default::default(),
                worker_cpus: Default::default(),
                mem_nodes: vec![],
                gpu: None,
                roles: None,
                corrections: Default::default(),
            });
            if t.cpus.is_empty() {
                t.cpus = crate::measure::process::affinity(*pid);
            }
            out.push(t);
        }
        return Ok(out);
    }
    if a.all {
        let t = find::all_ranks();
        if t.is_empty() {
            return Err(Failure::usage(
                "--all: no rank of torchrun, srun or mpirun is running that you may read",
                "start a job, or give --pid PID",
            ));
        }
        return Ok(t);
    }
    match find::live_runs().into_iter().next() {
        Some(s) => Ok(s.ranks),
        None => Err(Failure::usage(
            format!(
                "no threadwise run is running (no live state file in {})",
                find::state_dir().display()
            ),
            "start one with threadwise run, or give --pid PID or --all",
        )),
    }
}

pub(super) fn top_cmd(a: TopCmd) -> Result<Exit, Failure> {
    if !a.once
        && !a.json
        && let Err(why) = ui::terminal()
    {
        return Err(Failure::usage(
            format!("top's live view needs a terminal: {why}"),
            "use --once for one view (text, or --json), or --json for a line per interval",
        ));
    }
    let targets = find_targets(&a)?;
    let mut s = Sampler::new(targets);
    if a.once {
        let v = s.after(a.interval);
        return if a.json {
            let t = serde_json::to_string(&v)
                .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
            emit(&(t + "\n"))
        } else {
            emit(&text(&v))
        };
    }
    if a.json {
        loop {
            let v = s.after(a.interval);
            let all_gone = v.ranks.iter().all(|r| !r.alive);
            let t = serde_json::to_string(&v)
                .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
            emit(&(t + "\n"))?;
            if all_gone {
                return Ok(Exit::OK);
            }
        }
    }
    let topo = load(&SourceArgs::default())?;
    ui::run(&topo, &mut s, a.interval, &|| false)
        .map_err(|e| Failure::env(format!("the terminal view failed: {e}"), "use --json"))?;
    Ok(Exit::OK)
}
