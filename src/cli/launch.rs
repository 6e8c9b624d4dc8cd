//! `threadwise run` and `threadwise bind`: plan on the live machine, turn each
//! rank plan into a launch, then supervise (run) or exec (bind).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use super::args::{BindCmd, RunCmd};
use super::topo::{facts, load, request};
use super::{Exit, Failure, SourceArgs, settings};
use crate::export::{bind_args, quote, quote_all};
use crate::launch::env::overridden;
use crate::launch::output::OutputOptions;
use crate::launch::supervise::{self, RunOptions};
use crate::launch::{
    LaunchError, RankLaunch, bind, check_placements, detect, node_launches, rank_launch, resolve,
};
use crate::plan::{self, NProc, Plan};
use crate::topology::Topology;

impl From<LaunchError> for Failure {
    fn from(e: LaunchError) -> Self {
        let code = match e {
            LaunchError::Placement { .. }
            | LaunchError::LogDir { .. }
            | LaunchError::LogFile { .. }
            | LaunchError::Port(_) => 3,
            _ => 2,
        };
        Failure {
            message: e.to_string(),
            hint: Some(e.hint().to_string()),
            code,
        }
    }
}

fn current(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Say which of the user's variables a launch replaces (once, on stderr).
fn note_overrides(l: &RankLaunch) {
    let o = overridden(&l.env, &current);
    if !o.is_empty() {
        let list: Vec<String> = o
            .iter()
            .map(|(k, old, new)| format!("{k}={old} -> {new}"))
            .collect();
        crate::say!(
            "threadwise: the plan replaces variables from your environment: {} (--threads/--workers set the plan's own)",
            list.join(", ")
        );
    }
}

/// `--dry-run`: what each rank would get. `mover`: run moves DataLoader
/// workers (bind does not).
fn dry_run(plan: &Plan, launches: &[RankLaunch], mover: bool) -> String {
    let inherited = std::env::vars_os().count();
    let mut s = format!(
        "{} rank(s); each inherits your environment ({inherited} variables) except what is listed\n",
        plan.nproc
    );

    for l in launches {
        s.push_str(&format!(
            "rank {}: cpus {}, memory {}\n  argv: {}\n",
            l.local_rank,
            l.cpus,
            l.mem,
            quote_all(
                &l.argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            )
        ));
        let workers = plan.ranks.get(l.local_rank).map(|r| &r.worker_cpus);
        if let Some(w) = workers.filter(|_| l.worker_mask.is_some()) {
            s.push_str(&if mover {
                format!("  DataLoader workers: moved to CPUs {w} (checked every 100 ms)\n")
            } else {
                format!(
                    "  DataLoader workers: stay on the rank's CPUs (bind leaves no process to move \
                     them); THREADWISE_WORKER_CPUS={w} for a worker_init_fn\n"
                )
            });
        }
        for (k, v) in &l.env {
            let was = match current(k) {
                Some(old) if old != *v => format!("   (replaces {})", quote(&old)),
                _ => String::new(),
            };
            s.push_str(&format!("  {k}={}{was}\n", quote(v)));
        }
    }
    s
}

/// A plan saved by `tune --save-plan`, checked against this machine.
fn saved_plan(path: &std::path::Path, t: &Topology) -> Result<Plan, Failure> {
    use crate::topology::fsread::{MAX_SYSFS_FILE, read_bounded};
    let text = read_bounded(path, MAX_SYSFS_FILE).map_err(|e| {
        Failure::usage(
            format!("cannot read --plan {}: {e}", path.display()),
            "give a file from threadwise tune --save-plan or plan --json",
        )
    })?;
    let p: Plan = serde_json::from_str(&text).map_err(|e| {
        Failure::usage(
            format!(
                "--plan {} is not a threadwise.plan/1 document: {e}",
                path.display()
            ),
            "give a file from threadwise tune --save-plan or plan --json",
        )
    })?;
    p.validate().map_err(|why| {
        Failure::usage(
            format!("--plan {}: {why}", path.display()),
            "re-create it with threadwise tune --save-plan or plan --json",
        )
    })?;
    // A preload the file names is held to the rules of one we would choose.
    for r in &p.ranks {
        if let Some(lib) = r.env.get("LD_PRELOAD")
            && let Some(why) = crate::host::preload_refusal(std::path::Path::new(lib))
        {
            return Err(Failure::usage(
                format!(
                    "--plan {}: rank {}: LD_PRELOAD={lib}: {why}",
                    path.display(),
                    r.local_rank
                ),
                "plan again on this machine (threadwise tune --save-plan)",
            ));
        }
    }
    if let Some(r) = p
        .ranks
        .iter()
        .find(|r| r.bind && !r.cpus.is_subset(&t.allowed_cpus))
    {
        return Err(Failure::env(
            format!(
                "--plan {}: rank {} uses CPUs {} but this process may use {}",
                path.display(),
                r.local_rank,
                r.cpus,
                t.allowed_cpus
            ),
            "the plan was made for another machine or cgroup; plan again here",
        ));
    }
    Ok(p)
}

fn live_topology() -> Result<Topology, Failure> {
    load(&SourceArgs::default())
}

/// Try every rank's binding before anything starts; on refusal, stop, or (with
/// --allow-unbound) say so and run every rank unbound.
fn check_bindings(launches: &mut [RankLaunch], allow_unbound: bool) -> Result<(), Failure> {
    match check_placements(launches) {
        Ok(()) => Ok(()),
        Err(e) if allow_unbound => {
            crate::say!("threadwise: warning: ranks run unbound ({e})");
            for l in launches {
                l.placement = Default::default();
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// What the user sees at the end, and our exit code.
fn finish_run(
    a: &RunCmd,
    outcome: &supervise::Outcome,
    errors: &std::path::Path,
) -> Result<Exit, Failure> {
    if !a.quiet {
        crate::say_text!(supervise::summary(outcome));
    }
    if let Some(report) = supervise::failure_report(outcome, Some(errors)) {
        crate::say_text!(report);
    } else if let Some(sig) = outcome.signal {
        crate::say!("threadwise: stopped by {}", crate::os::signal_name(sig));
    }
    if outcome.split_lines {
        crate::say!(
            "threadwise: a line longer than {} MiB was shown in pieces (the log files keep it whole)",
            crate::launch::output::MAX_LINE >> 20
        );
    }
    if let Some(dir) = &a.log_dir {
        crate::say!("threadwise: logs in {}", dir.display());
    }
    for (file, why) in &outcome.log_errors {
        crate::say!("threadwise: error: the log {file} is incomplete: {why}");
    }
    // Ranks that succeeded with logs lost still make a failed run: exit 3.
    Ok(match outcome.code() {
        0 if !outcome.log_errors.is_empty() => Exit(3),
        code => Exit(code),
    })
}

pub fn run(a: RunCmd) -> Result<Exit, Failure> {
    let Some(program) = a.command.first() else {
        return Err(LaunchError::NoCommand.into());
    };
    let program = resolve(program)?;
    settings::check_run(&a)?;
    let req = request(&a.plan);
    let t = live_topology()?;
    let p = match &a.plan_file {
        Some(path) => saved_plan(path, &t)?,
        None => plan::plan(&t, &req, &facts(&req))?,
    };
    if a.plan.nnodes > 1 || a.rdzv_endpoint.is_some() {
        return multi_node(&a, &p);
    }
    settings::check_run_plan(&a, p.nproc)?;
    let mut launches = node_launches(&p, &a.command, &a.master_addr, a.master_port)?;
    if a.dry_run {
        let contain = crate::launch::contain::JobCgroup::probe();
        return super::emit(&format!(
            "{}containment: {contain}\n",
            dry_run(&p, &launches, !a.no_move_workers)
        ));
    }
    if let Some(first) = launches.first() {
        note_overrides(first);
    }
    if !a.no_doctor {
        super::doctor::preflight(&t, p.nproc);
    }
    check_bindings(&mut launches, a.allow_unbound)?;
    // Where torch's @record puts a failing rank's exception, as torchrun sets
    // it: beside the logs, or in a private directory removed at the end.
    let private = match &a.log_dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("threadwise-errors-")
                .tempdir()
                .map_err(|e| {
                    Failure::env(
                        format!("cannot create a directory for the ranks' error files: {e}"),
                        "check TMPDIR",
                    )
                })?,
        ),
    };
    let errors = a.log_dir.clone().unwrap_or_else(|| {
        private
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default()
    });
    for l in &mut launches {
        l.program = Some(program.clone());
        let f = crate::launch::env::error_file(&errors, l.local_rank);
        // A previous run's record is no root cause of this one.
        let _ = std::fs::remove_file(&f);
        l.env
            .insert("TORCHELASTIC_ERROR_FILE".into(), f.display().to_string());
    }
    let watch = std::sync::Arc::new(super::top::RunWatch::default());
    let shown: Vec<String> = a
        .command
        .iter()
        .map(|x| x.to_string_lossy().into_owned())
        .collect();
    let opts = RunOptions {
        grace: a.grace,
        output: OutputOptions {
            prefix: !a.no_prefix,
            // The live view takes the terminal; the output still goes to the logs.
            show: if a.top {
                Some(vec![])
            } else {
                a.local_ranks_filter.clone()
            },
            sink: None,
        },
        timeout: None,
        move_workers: !a.no_move_workers,
        log_dir: a.log_dir.clone(),
        on_spawned: Some(watch.hook(
            &p,
            &t,
            shown,
            a.log_dir.as_ref().map(|d| d.display().to_string()),
            a.top,
        )),
    };
    if let Some(w) = a.log_dir.as_deref().and_then(settings::log_dir_warning) {
        crate::say!("threadwise: warning: {w}");
    }
    let outcome = supervise::run(&launches, &opts);
    watch.finish();
    finish_run(&a, &outcome?, &errors)
}

/// Hand the job to torchrun's elastic agent; each rank runs `threadwise bind`.
fn multi_node(a: &RunCmd, p: &Plan) -> Result<Exit, Failure> {
    let torchrun = a.torchrun.clone().unwrap_or_else(|| "torchrun".into());
    let torchrun_path = resolve(&torchrun).map_err(|_| {
        Failure::env(
            format!(
                "multi-node runs go through torchrun, and {} was not found",
                torchrun.to_string_lossy()
            ),
            "install PyTorch in this environment, or give --torchrun PATH",
        )
    })?;
    let me = std::env::current_exe().map_err(|e| {
        Failure::env(
            format!("cannot find this binary: {e}"),
            "run threadwise by its path",
        )
    })?;
    // settings::check_run made sure a multi-node job has its endpoint.
    let endpoint = a.rdzv_endpoint.clone().unwrap_or_default();
    let mut args: Vec<OsString> = vec![
        "--nnodes".into(),
        a.plan.nnodes.to_string().into(),
        "--nproc-per-node".into(),
        p.nproc.to_string().into(),
        "--rdzv-backend".into(),
        a.rdzv_backend.clone().into(),
        "--rdzv-endpoint".into(),
        endpoint.into(),
        "--rdzv-id".into(),
        a.rdzv_id
            .clone()
            .unwrap_or_else(|| "threadwise".into())
            .into(),
        "--max-restarts".into(),
        a.max_restarts.to_string().into(),
    ];
    if let Some(r) = a.node_rank {
        args.extend(["--node-rank".into(), r.to_string().into()]);
    }
    args.extend(["--no-python".into(), me.into_os_string(), "bind".into()]);
    let mut req_args = bind_args(p);
    if a.allow_unbound {
        req_args.push("--allow-unbound".into());
    }
    args.extend(req_args.into_iter().map(OsString::from));
    args.push("--".into());
    args.extend(a.command.iter().cloned());
    if a.dry_run {
        let words: Vec<String> = std::iter::once(torchrun_path.display().to_string())
            .chain(args.iter().map(|x| x.to_string_lossy().into_owned()))
            .collect();
        return super::emit(&(quote_all(&words) + "\n"));
    }
    let err = std::process::Command::new(&torchrun_path)
        .args(&args)
        .exec();
    Err(Failure::env(
        format!("cannot exec {}: {err}", torchrun_path.display()),
        "check the torchrun installation",
    ))
}

pub fn bind_cmd(a: BindCmd) -> Result<Exit, Failure> {
    if a.command.is_empty() {
        return Err(LaunchError::NoCommand.into());
    }
    let launcher = detect::detect(&current)?;
    let mut t = live_topology()?;
    if launcher.binds_ranks {
        // srun and mpirun bind each rank already: its mask is its own, not the
        // node's. Plan from what every sibling sees alike: the union of the
        // masks Slurm applied, else the cgroup (the job's CPUs).
        t.limits.affinity = (launcher.name == "Slurm")
            .then(|| detect::slurm_node_cpus(&current))
            .flatten();
        t.apply_limits();
    }
    let mut req = request(&a.plan);
    match req.nproc {
        NProc::Count(n) if n != launcher.local_size => {
            return Err(Failure::usage(
                format!(
                    "--nproc-per-node {n}, but {} started {} ranks on this node",
                    launcher.name, launcher.local_size
                ),
                "leave --nproc-per-node out under a launcher, or make them agree",
            ));
        }
        _ => req.nproc = NProc::Count(launcher.local_size),
    }
    let p = plan::plan(&t, &req, &facts(&req))?;
    let rank = &p.ranks[launcher.local_rank];
    let mut extra = BTreeMap::new();
    for (k, v) in [
        ("LOCAL_RANK", launcher.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", launcher.local_size.to_string()),
    ] {
        if current(k).is_none() {
            extra.insert(k.to_string(), v);
        }
    }
    if let Some((rank_no, world)) = launcher.global {
        for (k, v) in [("RANK", rank_no), ("WORLD_SIZE", world)] {
            if current(k).is_none() {
                extra.insert(k.to_string(), v.to_string());
            }
        }
    }
    let l = rank_launch(rank, &a.command, extra);
    if a.dry_run {
        return super::emit(&dry_run(
            &Plan {
                nproc: 1,
                ..p.clone()
            },
            &[l],
            false,
        ));
    }
    Err(bind::exec_rank(&l, a.allow_unbound).into())
}
