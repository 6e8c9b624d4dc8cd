//! `threadwise tune`: build the configurations, run them through the real
//! runner with a progress bar, rewrite the report files after every trial,
//! print the table, save the winner's plan.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::args::{StrategyArg, TuneCmd};
use super::topo::{load, request};
use super::{Failure, SourceArgs, emit};
use crate::measure::gpu::GpuSampler;
use crate::plan::{self, Facts, Plan};
use crate::tune::export::{self, ReportExporter};
use crate::tune::grid::{self, TuneConfig};
use crate::tune::metric::Metric;
use crate::tune::runner::Runner;
use crate::tune::{Event, Strategy, TuneOptions, TuneReport, new_report, tune};

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
    facts: &Facts,
) -> Result<Vec<TuneConfig>, Failure> {
    let bad = |e: grid::GridError| {
        Failure::usage(
            e.to_string(),
            "see threadwise tune --help for --grid and --config",
        )
    };
    let mut v = if a.grid.is_empty() {
        grid::defaults(base, &facts.allocators)
    } else {
        grid::expand(base, &a.grid).map_err(bad)?
    };
    for c in &a.config {
        v.push(grid::parse_config(base, c).map_err(bad)?);
    }
    grid::dedupe(v).map_err(bad)
}

fn exports(a: &TuneCmd) -> Vec<(Box<dyn ReportExporter>, PathBuf)> {
    [
        ("json", &a.export_json),
        ("csv", &a.export_csv),
        ("markdown", &a.export_markdown),
        ("svg", &a.export_svg),
    ]
    .into_iter()
    .filter_map(|(f, p)| Some((export::exporter(f)?, p.clone()?)))
    .collect()
}

fn write_all(files: &[(Box<dyn ReportExporter>, PathBuf)], r: &TuneReport) -> Result<(), Failure> {
    for (e, p) in files {
        export::write(p, &e.render(r)).map_err(|err| {
            Failure::env(
                format!("cannot write {}: {err}", p.display()),
                "check the export path",
            )
        })?;
    }
    Ok(())
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
    if c.unset_threads {
        p.unset_threads();
    }
    p.reasons.push(format!(
        "chosen by threadwise tune: configuration {}",
        c.name
    ));
    Some(p)
}

/// The command each rank runs: the user's, or the built-in workload with its sizes.
fn trial_argv(a: &TuneCmd) -> Result<Vec<OsString>, Failure> {
    if !a.command.is_empty() {
        crate::launch::resolve(&a.command[0])?;
        return Ok(a.command.clone());
    }
    let mut v: Vec<OsString> = vec![workload_binary()?.into()];
    for (k, val) in [
        ("--seconds", a.work_seconds),
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

fn check_numbers(a: &TuneCmd) -> Result<(), Failure> {
    if a.runs == 0 {
        return Err(Failure::usage("--runs must be at least 1", "e.g. --runs 3"));
    }
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        return Err(Failure::usage(
            format!(
                "--timeout {}: must be a positive number of seconds",
                a.timeout
            ),
            "e.g. --timeout 600",
        ));
    }
    if !(a.work_seconds > 0.0 && a.work_seconds.is_finite()) {
        return Err(Failure::usage(
            format!(
                "--work-seconds {}: must be a positive number",
                a.work_seconds
            ),
            "e.g. --work-seconds 1.5",
        ));
    }
    Ok(())
}

fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
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
        eprintln!("threadwise: no winner, so no plan saved");
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&p)
        .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
    export::write(path, &(text + "\n")).map_err(|e| {
        Failure::env(
            format!("cannot write {}: {e}", path.display()),
            "check the path",
        )
    })?;
    eprintln!(
        "threadwise: saved the winner's plan to {0} (threadwise run --plan {0} -- CMD)",
        path.display()
    );
    Ok(())
}

pub fn tune_cmd(a: TuneCmd) -> Result<(), Failure> {
    check_numbers(&a)?;
    let metric = Metric::new(a.metric.as_deref())
        .map_err(|e| Failure::usage(e.to_string(), "e.g. --metric 'speed: ([0-9.]+)'"))?;
    let topo = load(&SourceArgs::default())?;
    let base = request(&a.plan);
    let facts = Facts {
        allocators: plan::find_allocators(),
    };
    // The base request must make sense on this machine before anything runs.
    let base_plan = plan::plan(&topo, &base, &facts)?;
    let configs = configs(&a, &base, &facts)?;
    let argv = trial_argv(&a)?;
    let files = exports(&a);
    let shown: Vec<String> = argv
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let report = new_report(shown, base_plan.nproc, topo.source.clone(), topo.cpu_budget);
    write_all(&files, &report)?;
    let mut runner = Runner {
        topology: topo.clone(),
        facts: facts.clone(),
        argv,
        timeout: Duration::from_secs_f64(a.timeout),
        grace: Duration::from_secs(5),
        gpu: GpuSampler::new(),
    };
    let strategy = match a.strategy {
        StrategyArg::All => Strategy::All,
        StrategyArg::Halving => Strategy::Halving,
    };
    let opts = TuneOptions {
        runs: a.runs,
        warmup: a.warmup,
        strategy,
        metric,
        cpu_budget: topo.cpu_budget,
    };
    let bar = progress_bar();
    let mut write_error = None;
    let report = tune(&configs, report, &opts, &mut runner, &mut |e| match e {
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
            if let Err(f) = write_all(&files, r) {
                write_error.get_or_insert(f);
            }
        }
    });
    bar.finish_and_clear();
    if let Some(f) = write_error {
        return Err(f);
    }
    emit(&crate::tune::report::render(&report))?;
    for (_, p) in &files {
        eprintln!("threadwise: wrote {}", p.display());
    }
    if let Some(path) = &a.save_plan {
        save_winner(path, winner_plan(&configs, &report, &topo, &facts))?;
    }
    if !report.complete {
        return Err(Failure {
            message: String::new(),
            hint: None,
            code: 130,
        });
    }
    Ok(())
}
