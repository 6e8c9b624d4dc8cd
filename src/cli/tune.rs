//! `threadwise tune`: build the configurations, run them through the real
//! runner with a progress bar, rewrite the report files after every trial,
//! print the table, save the winner's plan.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::args::TuneCmd;
use super::settings::{load_for, request};
use super::{Exit, Failure, emit, settings};
use crate::files::write_output;
use crate::host::facts_with_allocators;
use crate::measure::gpu::GpuSampler;
use crate::measure::throughput::Metric;
use crate::plan::{self, Facts, Plan};
use crate::tune::export::{ReportFiles, ReportFormat, WriteError};
use crate::tune::grid::{self, TuneConfig};
use crate::tune::runner::Runner;
use crate::tune::{Event, TuneOptions, TuneReport, new_report, tune};

/// The built-in workload, beside this binary.
fn workload_binary() -> Result<PathBuf, Failure> {
    let me = std::env::current_exe().map_err(|e| {
        Failure::env(
            format!("cannot find this binary: {e}"),
            "run threadwise by its path",
        )
    })?;
    let w = me.with_file_name("threadwise-workload");
    if w.is_file() {
        Ok(w)
    } else {
        Err(Failure::env(
            format!("the built-in workload {} is missing", w.display()),
            "cargo build --release builds it next to threadwise; or give your own command after --",
        ))
    }
}

fn configs(
    a: &TuneCmd,
    base: &plan::PlanRequest,
    base_plan: &Plan,
    facts: &Facts,
) -> Result<Vec<TuneConfig>, Failure> {
    let planned = base_plan
        .ranks
        .first()
        .map_or((1, 1), |r| (r.threads, r.workers));
    let bad = |e: grid::GridError| {
        Failure::usage(
            e.to_string(),
            "see threadwise tune --help for --grid and --config",
        )
    };
    let mut v = if a.grid.is_empty() {
        grid::defaults(base, planned, &facts.allocators)
    } else {
        grid::expand(base, &a.grid).map_err(bad)?
    };
    for c in &a.config {
        v.push(grid::parse_config(base, c).map_err(bad)?);
    }
    grid::dedupe(v).map_err(bad)
}

/// The most trials an undecided row runs: --max-runs, else 4 x --runs.
fn max_runs(a: &TuneCmd) -> usize {
    a.max_runs
        .unwrap_or(crate::tune::DEFAULT_BLOCKS * a.runs)
        .max(a.runs)
}

/// What `tune --dry-run` prints: the trials it would run, the command each
/// runs, and every configuration's placement (rank by rank) as the runner
/// would launch it; a configuration that cannot be planned says why.
fn dry_run(
    a: &TuneCmd,
    configs: &[TuneConfig],
    topo: &crate::topology::Topology,
    facts: &Facts,
    argv: &[OsString],
) -> String {
    let n = configs.len();
    let max = max_runs(a);
    let shown: Vec<String> = argv
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let mut out = format!(
        "tune (dry run) on {}: {n} configuration(s) x {} round(s) = {} trials{}{}; each trial \
         runs:\n  {}\n",
        topo.source,
        a.runs,
        n * a.runs,
        if a.warmup > 0 {
            format!(" after {} warm-up trial(s)", n * a.warmup)
        } else {
            String::new()
        },
        if max > a.runs {
            format!(" (a row still undecided then runs again, up to {max} trials)")
        } else {
            String::new()
        },
        shown.join(" ")
    );
    if a.grid.is_empty() {
        out.push_str(
            "  (after the second round, one more row combines every change that beat the plan)\n",
        );
    }
    let width = configs
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    out.push_str(&format!(
        "{:<width$}  {:>7}  {:>7}  {:<9}  {:<10}  {:<10}  CPUs per rank\n",
        "config", "threads", "workers", "policy", "mem", "allocator"
    ));
    for c in configs {
        let r = &c.request;
        let line = match plan::plan(topo, r, facts) {
            Ok(p) => {
                let first = p.ranks.first();
                let threads = if r.unset_threads {
                    "unset".to_string()
                } else {
                    first.map_or("-".into(), |x| x.threads.to_string())
                };
                // Up to four ranks' CPUs, then how many there are.
                let mut cpus: Vec<String> = p
                    .ranks
                    .iter()
                    .take(4)
                    .map(|x| {
                        if x.bind {
                            x.cpus.to_string()
                        } else {
                            "any".into()
                        }
                    })
                    .collect();
                if p.ranks.len() > 4 {
                    cpus.push(format!("... ({} ranks)", p.ranks.len()));
                }
                format!(
                    "{:>7}  {:>7}  {:<9}  {:<10}  {:<10}  {}",
                    threads,
                    first.map_or(0, |x| x.workers),
                    r.policy.to_string(),
                    r.mem.to_string(),
                    p.allocator
                        .as_ref()
                        .map_or("none".to_string(), |x| x.kind.to_string()),
                    cpus.join(" | ")
                )
            }
            Err(e) => format!("cannot be planned here: {e}"),
        };
        out.push_str(&format!("{:<width$}  {line}\n", c.name));
    }
    out
}

/// The report files asked for, each with its format.
fn exports(a: &TuneCmd) -> ReportFiles {
    ReportFiles(
        ReportFormat::ALL
            .into_iter()
            .filter_map(|f| {
                let path = match f {
                    ReportFormat::Json => &a.export_json,
                    ReportFormat::Csv => &a.export_csv,
                    ReportFormat::Markdown => &a.export_markdown,
                    ReportFormat::Svg => &a.export_svg,
                };
                Some((f, path.clone()?))
            })
            .collect(),
    )
}

fn rewrite(files: &ReportFiles, r: &TuneReport) -> Result<(), Failure> {
    files.rewrite(r).map_err(|e| match e {
        WriteError::Write(f) => f.into(),
        WriteError::Render(e) => Failure::env(e.to_string(), "report this bug"),
    })
}

/// The winner's plan, as `threadwise run --plan FILE` takes it.
fn winner_plan(
    configs: &[TuneConfig],
    r: &TuneReport,
    topo: &crate::topology::Topology,
    facts: &Facts,
) -> Option<Plan> {
    let c = configs
        .iter()
        .find(|c| Some(&c.name) == r.winner.as_ref())?;
    let mut p = plan::plan(topo, &c.request, facts).ok()?;
    p.reasons.push(format!(
        "chosen by threadwise tune: configuration {}",
        c.name
    ));
    Some(p)
}

/// `tune --nnodes N`: trials through srun on the allocation's nodes.
fn nodes_runner(
    nnodes: usize,
    argv: Vec<OsString>,
    timeout: Duration,
) -> Result<crate::tune::srun::SrunRunner, Failure> {
    let env = |k: &str| std::env::var(k).ok();
    let Some(job) = env("SLURM_JOB_ID") else {
        return Err(Failure::usage(
            format!(
                "tune --nnodes {nnodes} runs each trial through srun, outside a Slurm allocation here"
            ),
            format!(
                "run it inside one: salloc -N{nnodes} --exclusive threadwise tune --nnodes {nnodes} ..., or from an sbatch script"
            ),
        ));
    };
    let have: usize = env("SLURM_JOB_NUM_NODES")
        .or_else(|| env("SLURM_NNODES"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if have < nnodes {
        return Err(Failure::usage(
            format!("--nnodes {nnodes}, but Slurm job {job} has {have} node(s)"),
            format!("allocate {nnodes} nodes (salloc -N{nnodes}) or tune fewer"),
        ));
    }
    let srun = crate::launch::resolve(&"srun".into())?;
    let list = env("SLURM_JOB_NODELIST").or_else(|| env("SLURM_NODELIST"));
    let host = crate::os::hostname();
    let me = std::env::current_exe().map_err(|e| {
        Failure::env(
            format!("cannot find this binary: {e}"),
            "run threadwise by its path",
        )
    })?;
    let cpus = env("SLURM_JOB_CPUS_PER_NODE")
        .as_deref()
        .and_then(crate::tune::srun::min_cpus_per_node);
    crate::say!(
        "threadwise: tuning on {nnodes} node(s) of Slurm job {job} ({}), each trial one srun step; \
         the rendezvous hosted here ({host}), where every node reports",
        list.unwrap_or_default()
    );
    Ok(crate::tune::srun::SrunRunner::new(
        nnodes, srun, me, host, cpus, argv, timeout,
    ))
}

/// A seed from the clock, for a run that was given none.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
}

/// The command each rank runs: the user's, or the built-in workload with its sizes.
fn trial_argv(a: &TuneCmd) -> Result<Vec<OsString>, Failure> {
    if !a.command.is_empty() {
        crate::launch::resolve(&a.command[0])?;
        return Ok(a.command.clone());
    }
    let mut v: Vec<OsString> = vec![workload_binary()?.into()];
    for (k, val) in [
        ("--seconds", a.work_seconds.as_secs_f64()),
        ("--size", a.work_size as f64),
        ("--batch", a.work_batch as f64),
        ("--layers", a.work_layers as f64),
        ("--loader-work", a.work_loader as f64),
    ] {
        v.push(k.into());
        v.push(val.to_string().into());
    }
    Ok(v)
}

fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    // Ticks between trials too, so the elapsed time and spinner move.
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials, ETA {eta}  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn save_winner(path: &std::path::Path, plan: Option<Plan>) -> Result<(), Failure> {
    let Some(p) = plan else {
        crate::say!("threadwise: no winner, so no plan saved");
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&p)
        .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
    write_output(path, (text + "\n").as_bytes())?;
    crate::say!(
        "threadwise: saved the winner's plan to {0} (threadwise run --plan {0} -- CMD)",
        path.display()
    );
    Ok(())
}

/// The session's options from the command line.
fn tune_options(
    a: &TuneCmd,
    base: &crate::plan::PlanRequest,
    metric: Metric,
    cpu_budget: f64,
) -> TuneOptions {
    TuneOptions {
        // The default search combines what beat the plan; a --grid is measured as given.
        combine: a.grid.is_empty().then(|| base.clone()),
        runs: a.runs,
        max_runs: max_runs(a),
        warmup: a.warmup,
        strategy: a.strategy,
        margin: a.margin,
        metric,
        cpu_budget,
        seed: a.seed.unwrap_or_else(clock_seed),
    }
}

pub(super) fn tune_cmd(a: TuneCmd) -> Result<Exit, Failure> {
    settings::check_tune(&a)?;
    let metric = Metric::new(a.metric.as_deref())
        .map_err(|e| Failure::usage(e.to_string(), "e.g. --metric 'speed: ([0-9.]+)'"))?;
    let topo = load_for(&a.source, a.dry_run)?;
    let base = request(&a.plan);
    // Every configuration may name an allocator: look them up once.
    let facts = facts_with_allocators();
    // The base request must make sense on this machine before anything runs.
    let base_plan = plan::plan(&topo, &base, &facts)?;
    let configs = configs(&a, &base, &base_plan, &facts)?;
    let argv = trial_argv(&a)?;
    if a.dry_run {
        return emit(&dry_run(&a, &configs, &topo, &facts, &argv));
    }
    let files = exports(&a);
    let shown: Vec<String> = argv
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let report = new_report(shown, base_plan.nproc, topo.source.clone(), topo.cpu_budget);
    rewrite(&files, &report)?;
    let mut runner: Box<dyn crate::tune::TrialRunner> = if base.nnodes > 1 {
        Box::new(nodes_runner(base.nnodes, argv, a.timeout)?)
    } else {
        let grace = Duration::from_secs(5);
        let (t, f) = (topo.clone(), facts.clone());
        Box::new(Runner::new(t, f, argv, a.timeout, grace, GpuSampler::new()))
    };
    let opts = tune_options(&a, &base, metric, topo.cpu_budget);
    let bar = progress_bar();
    let mut write_error = None;
    let report = tune(&configs, report, &opts, runner.as_mut(), &mut |e| match e {
        Event::Start { total } => bar.set_length(total as u64),
        Event::TrialStart {
            config,
            round,
            warmup,
        } => {
            bar.set_message(format!(
                "{config} ({} {})",
                if warmup { "warm-up" } else { "round" },
                round + 1
            ));
        }
        Event::Updated(r) => {
            let done =
                r.configs.iter().map(|c| c.trials.len()).sum::<usize>() + r.warmup * configs.len();
            bar.set_position(done as u64);
            if let Err(f) = rewrite(&files, r) {
                write_error.get_or_insert(f);
            }
        }
    });
    bar.finish_and_clear();
    if let Some(f) = write_error {
        return Err(f);
    }
    emit(&crate::tune::report::render(&report))?;
    for p in files.paths() {
        crate::say!("threadwise: wrote {}", p.display());
    }
    if let Some(path) = &a.save_plan {
        save_winner(path, winner_plan(&configs, &report, &topo, &facts))?;
    }
    // An interrupted tune ends like an interrupted command: 128 + SIGINT.
    Ok(if report.complete { Exit::OK } else { Exit(130) })
}
