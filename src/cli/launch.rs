//! `threadwise run` and `threadwise bind`: the options into typed settings
//! (`job::settings::RunSettings`, one node's agent settings), then the job's
//! entry point (`job::run`, with the command line's reporter) or bind's exec;
//! the result into an exit code.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::args::{BindCmd, RunCmd};
use super::pet::{self, FromEnv};
use super::settings::{load_for, request};
use super::{Exit, Failure, settings};
use crate::adopt::bind;
use crate::job;
use crate::job::settings::{ClusterSettings, RunSettings};
use crate::launch::env::current;
use crate::launch::prepare;
use crate::launch::{LaunchError, resolve};
use crate::measure::throughput::Metric;
use crate::netif::Endpoint;
use crate::plan::{self, NProc, Plan, PlanRequest, Policy};
use crate::rdzv::AgentConfig;
use crate::rdzv::auth::{self, Auth};
use crate::top::watch::TopWatcher;
use crate::topology::Topology;

/// How long an elastic job's rendezvous waits for more nodes once MIN have
/// joined: --rdzv-conf's last_call_timeout, else torchrun's 30 s.
fn last_call(a: &RunCmd) -> Duration {
    a.rdzv_conf
        .as_ref()
        .and_then(|c| c.last_call_timeout)
        .unwrap_or(Duration::from_secs(30))
}

/// How long the rendezvous waits: --rdzv-timeout, else --rdzv-conf's
/// join_timeout, else torchrun's 600 s.
fn join_timeout(a: &RunCmd) -> Duration {
    a.rdzv_timeout
        .or_else(|| a.rdzv_conf.as_ref().and_then(|c| c.join_timeout))
        .unwrap_or(Duration::from_secs(600))
}

/// The whole command, quoted as a shell would need it.
fn shell_line(argv: &[OsString]) -> String {
    let shown: Vec<String> = argv
        .iter()
        .map(|s| crate::export::quote(&s.to_string_lossy()))
        .collect();
    shown.join(" ")
}

/// The command each rank runs. After `--`, as given. Without it, torchrun's
/// form: `SCRIPT ARGS` runs `python -u SCRIPT ARGS` (`-m`: `python -u -m
/// MODULE ARGS`; `--no-python`: SCRIPT is the program), with the first of
/// python and python3 on PATH (`find`), since threadwise is no Python
/// program whose own interpreter could be used as torchrun uses its own.
/// Also what to say about it.
fn rank_command(
    a: &RunCmd,
    find: &dyn Fn(&str) -> bool,
    is_file: &dyn Fn(&OsStr) -> bool,
) -> Result<(Vec<OsString>, Option<String>), Failure> {
    let cmd = a.command.clone();
    // argparse's rule: an option torchrun or threadwise does not know,
    // before the script, is an error (not the script's name).
    if let Some(first) = cmd.first().map(|c| c.to_string_lossy())
        && !a.after_dashes
        && first.starts_with('-')
        && first != "-"
    {
        return Err(Failure::usage(
            format!("unrecognized option {first} before the script"),
            "threadwise run takes torchrun's options and its own (threadwise run --help); put \
             -- before a command that starts with a dash",
        ));
    }
    if a.after_dashes {
        if a.module {
            return Err(Failure::usage(
                "-m (--module) goes with torchrun's form, without --",
                "threadwise run [OPTIONS] -m pkg.train ARGS, or -- python -m pkg.train ARGS",
            ));
        }
        return Ok((cmd, None));
    }
    if a.no_python && !a.torchrun.run_path {
        let note = format!(
            "torchrun's form (no --) with --no-python: each rank runs {}",
            shell_line(&cmd)
        );
        return Ok((cmd, Some(note)));
    }
    let Some(python) = ["python", "python3"].into_iter().find(|p| find(p)) else {
        return Err(Failure::env(
            "torchrun's form (no --) runs the script with Python, but neither python nor \
             python3 is on PATH",
            "put -- before the command to run it as it is, or add --no-python",
        ));
    };
    let first = &cmd[0];
    if !a.module && !is_file(first) && find(&first.to_string_lossy()) {
        let f = first.to_string_lossy();
        return Err(Failure::usage(
            format!(
                "{f} is a program, not a script: without --, torchrun's form runs \
                 `{python} -u SCRIPT`"
            ),
            format!(
                "put -- before the command (threadwise run [OPTIONS] -- {f} ...), or add --no-python"
            ),
        ));
    }
    let mut argv: Vec<OsString> = vec![python.into(), "-u".into()];
    if a.module {
        argv.push("-m".into());
    }
    argv.extend(cmd);
    let note = format!(
        "torchrun's form (no --): each rank runs {}{}",
        shell_line(&argv),
        if a.torchrun.run_path {
            " (--run-path: the script runs as __main__, in a Python of its own per rank)"
        } else {
            ""
        }
    );
    Ok((argv, Some(note)))
}

/// How the nodes of a multi-node job know each other, said on the
/// start-up line; open (and no note) on one node.
fn rendezvous_auth(
    a: &RunCmd,
    endpoint: Option<&Endpoint>,
    notes: &mut Vec<String>,
) -> Result<Auth, Failure> {
    let Some(endpoint) = endpoint else {
        if a.rdzv_secret_file.is_some() {
            return Err(Failure::usage(
                "--rdzv-secret-file goes with a multi-node job",
                "give --nnodes N and --rdzv-endpoint HOST:PORT too, or drop it",
            ));
        }
        return Ok(Auth::Open);
    };
    let auth = auth::for_job(a.rdzv_secret_file.as_deref(), &current)?;
    notes.push(auth::said(
        &auth,
        &endpoint.to_string(),
        a.rdzv_secret_file.as_deref(),
    ));
    Ok(auth)
}

/// torchrun's --print-completion: threadwise's own completion script.
fn print_completion(shell: &str) -> Result<Exit, Failure> {
    let shell = match shell {
        "bash" => clap_complete::Shell::Bash,
        "zsh" => clap_complete::Shell::Zsh,
        other => {
            return Err(Failure::usage(
                format!(
                    "--print-completion {other}: threadwise has completions for bash and zsh here"
                ),
                "threadwise completions SHELL also writes fish, elvish and powershell",
            ));
        }
    };
    let mut out = vec![];
    clap_complete::generate(shell, &mut super::completion_tree(), "threadwise", &mut out);
    super::emit(&String::from_utf8_lossy(&out))
}

/// What `run`'s options come to beyond themselves, derived once from the
/// parsed options (which stay as clap typed them): the ranks' command
/// (torchrun's forms resolved), the rendezvous and MASTER_PORT (torchrun's
/// static shape), the grace (torchrun's spelling of it).
struct Derived {
    command: Vec<OsString>,
    program: PathBuf,
    endpoint: Option<Endpoint>,
    master_port: Option<u16>,
    grace: Duration,
    /// `--top` where the live view can draw.
    live: bool,
}

/// The rendezvous endpoint and the ranks' MASTER_PORT: as given; or, in
/// torchrun's static shape (node ranks and a master, no endpoint, as
/// Kubeflow's trainer v2 gives), the rendezvous at MASTER_ADDR:MASTER_PORT
/// and the ranks' MASTER_PORT a free port of node 0 (torchrun's static
/// backend does the same).
fn rendezvous_of(a: &RunCmd, notes: &mut Vec<String>) -> (Option<Endpoint>, Option<u16>) {
    match (&a.rdzv_endpoint, a.master_port) {
        (None, Some(port)) if a.plan.nnodes.max > 1 => {
            let endpoint = Endpoint::new(&a.master_addr, port);
            notes.push(format!(
                "no --rdzv-endpoint: the rendezvous is at the master {endpoint} (torchrun's \
                 static shape); the ranks' MASTER_PORT is a port free on node 0"
            ));
            (Some(endpoint), None)
        }
        (endpoint, port) => (endpoint.clone(), port),
    }
}

/// The agent's settings from the options; the run id defaults to Slurm's job id.
fn agent_config(
    a: &RunCmd,
    d: &Derived,
    endpoint: Endpoint,
    nproc: usize,
    auth: Auth,
) -> AgentConfig {
    AgentConfig {
        endpoint,
        nnodes: a.plan.nnodes.max,
        min_nodes: a.plan.nnodes.min,
        last_call: last_call(a),
        // An elastic job's node ranks are the rendezvous's to give, round by
        // round (as torchrun's c10d backend does); Slurm's node id is not one.
        node_rank: match a.plan.nnodes.elastic() {
            true => None,
            false => a
                .node_rank
                .map(|r| r as usize)
                .or_else(|| crate::adopt::detect::slurm_node_rank(&current, a.plan.nnodes.max)),
        },
        run_id: a
            .rdzv_id
            .clone()
            .or_else(|| current("SLURM_JOB_ID"))
            .unwrap_or_else(|| "none".into()),
        nproc,
        max_restarts: a.max_restarts,
        master_port: d.master_port,
        join_timeout: join_timeout(a),
        heartbeat_timeout: a.heartbeat_timeout,
        host: crate::os::hostname(),
        local_addr: a.torchrun.local_addr.clone(),
        linger: d.grace + std::time::Duration::from_secs(3),
        auth,
    }
}

/// The run's settings: what the user typed, checked, with the plan made.
fn run_settings(
    a: RunCmd,
    d: Derived,
    plan: Plan,
    topology: Topology,
    auth: Auth,
    torchrun: crate::job::settings::TorchrunOutput,
) -> Result<RunSettings, Failure> {
    let report =
        match a.report_node {
            true => Some(Metric::new(a.report_metric.as_deref()).map_err(|e| {
                Failure::usage(e.to_string(), "give a regex with one capture group")
            })?),
            false => None,
        };
    // A multi-node job has its endpoint (`settings::check_run`); one node
    // given one joins a rendezvous of one.
    let cluster = d.endpoint.clone().map(|endpoint| ClusterSettings {
        agent: agent_config(&a, &d, endpoint, plan.nproc, auth),
        report,
    });
    Ok(RunSettings {
        command: d.command,
        program: d.program,
        plan,
        topology,
        master_addr: a.master_addr,
        master_port: d.master_port,
        grace: d.grace,
        prefix: !a.no_prefix,
        // The live view takes the terminal; the output still goes to the logs.
        show: if d.live {
            Some(vec![])
        } else {
            a.local_ranks_filter
        },
        move_workers: !a.no_move_workers,
        hold: a.hold.hold,
        log_dir: a.log_dir,
        allow_unbound: a.allow_unbound,
        max_restarts: a.max_restarts,
        quiet: a.quiet,
        role: a.role,
        cluster,
        torchrun,
    })
}

/// A torchrun command line put under threadwise (its form: no `--`)
/// without `--nproc-per-node` runs what torchrun would: 1 rank, said, so
/// replacing `torchrun` by `threadwise run` never changes the world size
/// silently; threadwise's own form (`-- CMD`) plans `auto`.
fn torchrun_nproc(a: &RunCmd, notes: &mut Vec<String>) -> Option<NProc> {
    if a.after_dashes || a.nproc_given || a.plan_request.is_some() || a.plan_file.is_some() {
        return None;
    }
    notes.push(
        "torchrun's form without --nproc-per-node: 1 rank, torchrun's default (-n auto plans one \
         per GPU, else per core; threadwise's own form, -- CMD, plans auto)"
            .into(),
    );
    Some(NProc::Count(1))
}

/// The plan request: the plan options (with torchrun's `--numa-binding` as
/// the policy, and torchrun's default rank count in its form), or the JSON
/// tune --nnodes hands over.
fn run_request(
    a: &RunCmd,
    policy: Option<Policy>,
    nproc: Option<NProc>,
) -> Result<PlanRequest, Failure> {
    let Some(json) = &a.plan_request else {
        let mut req = request(&a.plan);
        req.policy = policy.unwrap_or(req.policy);
        req.nproc = nproc.unwrap_or(req.nproc);
        return Ok(req);
    };
    let mut req: PlanRequest = serde_json::from_str(json).map_err(|e| {
        Failure::usage(
            format!("--plan-request is not a plan request: {e}"),
            "give the `request` object of plan --json",
        )
    })?;
    req.nnodes = a.plan.nnodes.max;
    Ok(req)
}

pub(super) fn run(a: RunCmd, from_env: &[FromEnv]) -> Result<Exit, Failure> {
    if let Some(shell) = a.torchrun.print_completion.clone() {
        return print_completion(&shell);
    }
    if a.command.is_empty() {
        return Err(LaunchError::NoCommand.into());
    }
    if a.standalone && a.plan.nnodes.max > 1 {
        return Err(Failure::usage(
            format!(
                "--standalone with --nnodes {}: a standalone job is one node",
                a.plan.nnodes
            ),
            "drop --standalone, and give every node the same --rdzv-endpoint",
        ));
    }
    let on_path = |p: &str| which::which(p).is_ok();
    let is_file = |p: &OsStr| std::path::Path::new(p).is_file();
    let (command, form) = rank_command(&a, &on_path, &is_file)?;
    let program = resolve(&command[0])?;
    // What came from torchrun's environment, said at start-up and in the dry run.
    let mut notes: Vec<String> = pet::said(from_env).into_iter().collect();
    notes.extend(form);
    let torchrun = super::torchrun::apply(&a, &mut notes)?;
    let (endpoint, master_port) = rendezvous_of(&a, &mut notes);
    settings::check_run(&a, endpoint.as_ref())?;
    let nproc = torchrun_nproc(&a, &mut notes);
    let req = run_request(&a, torchrun.policy, nproc)?;
    let t = load_for(&a.source, a.dry_run)?;
    let p = match &a.plan_file {
        Some(path) => prepare::saved_plan(path, &t)?,
        None => plan::plan(&t, &req, &crate::host::facts(&req))?,
    };
    settings::check_run_plan(&a, p.nproc)?;
    let (dry, doctor) = (a.dry_run, !a.no_doctor);
    let auth = rendezvous_auth(&a, endpoint.as_ref(), &mut notes)?;
    let stop_on_usr = torchrun.output.stop_on_usr.clone();
    // Without a terminal the view cannot draw: the ranks' output is shown
    // instead, so nothing of it is lost.
    let live = match (a.top, crate::top::ui::terminal()) {
        (true, Err(why)) => {
            notes.push(format!(
                "--top: {why}: the ranks' output is shown instead of the live view \
                 (watch them with threadwise top from a terminal)"
            ));
            false
        }
        (top, _) => top,
    };
    let d = Derived {
        command,
        program,
        endpoint,
        master_port,
        grace: torchrun.grace.unwrap_or(a.grace),
        live,
    };
    let s = run_settings(a, d, p, t, auth, torchrun.output)?;
    if dry {
        let lines: String = notes.iter().map(|n| format!("{n}\n")).collect();
        return super::emit(&format!("{lines}{}", job::dry_run(&s)?));
    }
    for n in &notes {
        crate::say!("threadwise: {n}");
    }
    if doctor {
        crate::doctor::say_preflight(&s.topology, s.plan.nproc);
    }
    crate::proc::signals::stop_on(&stop_on_usr);
    let top = TopWatcher::new(&s.plan, &s.topology, &s.command, live);
    Ok(Exit(job::run(
        &s,
        Arc::new(super::report::Stderr::new(top, s.quiet)),
    )?))
}

pub(super) fn bind_cmd(a: BindCmd) -> Result<Exit, Failure> {
    if a.command.is_empty() && !a.json {
        return Err(LaunchError::NoCommand.into());
    }
    let given = match (a.local_rank, a.local_world_size) {
        (Some(k), Some(n)) if n == 0 || k >= n => {
            return Err(Failure::usage(
                format!(
                    "--local-rank {k} with --local-world-size {n}: a local rank is 0 to size - 1"
                ),
                "give the process's index among the ranks of this node, and their number",
            ));
        }
        (Some(k), Some(n)) => Some((k, n)),
        _ => None,
    };
    let t = load_for(&a.source, a.dry_run || a.json)?;
    let (p, l, launcher) =
        crate::adopt::slice::bind_launch(t, request(&a.plan), &a.command, &current, given)?;
    if a.json {
        let doc = crate::adopt::slice::bind_json(&p, &l, &launcher).map_err(|e| {
            Failure::env(
                format!("cannot serialise the slice: {e}"),
                "report this as a bug",
            )
        })?;
        return super::emit(&doc);
    }
    // Said once per job (by task 0), not once per task.
    let derived: Vec<String> = ["MASTER_ADDR", "MASTER_PORT"]
        .iter()
        .filter(|k| current(k).is_none())
        .filter_map(|k| Some(format!("{k}={}", l.env.get(*k)?)))
        .collect();
    if !derived.is_empty() && !a.dry_run && current("SLURM_PROCID").as_deref() == Some("0") {
        crate::say!(
            "threadwise: {} (unset: from the step's first node and 15000 + the job id's last 4 digits, as Lightning does)",
            derived.join(" ")
        );
    }
    // Outside a launcher (--local-rank given, no RANK): said once, by rank 0.
    if given.is_some_and(|(k, _)| k == 0)
        && !a.dry_run
        && current("RANK").is_none()
        && l.env.contains_key("RANK")
    {
        let set: Vec<String> = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
            .iter()
            .filter_map(|k| Some(format!("{k}={}", l.env.get(*k)?)))
            .collect();
        crate::say!(
            "threadwise: {} and each rank's own RANK (unset: one node, as torchrun --standalone numbers it)",
            set.join(" ").replacen("RANK=0 ", "", 1)
        );
    }
    if a.dry_run {
        let one = Plan {
            nproc: 1,
            ..p.clone()
        };
        return super::emit(&prepare::dry_run(&one, &[l], false, &current));
    }
    Err(bind::exec_rank(&l, a.allow_unbound, a.hold.hold).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Command, parse};

    fn run_cmd(args: &[&str]) -> RunCmd {
        let argv: Vec<OsString> = ["threadwise", "run"]
            .iter()
            .chain(args)
            .map(OsString::from)
            .collect();
        match parse(&argv).unwrap().command {
            Command::Run(a) => a,
            _ => unreachable!(),
        }
    }

    fn command(args: &[&str], programs: &[&str]) -> Result<(Vec<String>, Option<String>), String> {
        let find = |p: &str| programs.contains(&p);
        let is_file = |p: &OsStr| p.to_string_lossy().ends_with(".py");
        rank_command(&run_cmd(args), &find, &is_file)
            .map(|(c, n)| {
                (
                    c.iter().map(|s| s.to_string_lossy().into_owned()).collect(),
                    n,
                )
            })
            .map_err(|f| format!("{} / {}", f.message, f.hint.unwrap_or_default()))
    }

    #[test]
    fn after_dashes_the_command_is_run_as_given() {
        let (c, note) =
            command(&["-n", "2", "--", "python", "t.py", "--", "x"], &["python"]).unwrap();
        assert_eq!(c, ["python", "t.py", "--", "x"]);
        assert_eq!(note, None);
        assert!(
            command(&["-m", "--", "python", "-m", "x"], &["python"])
                .unwrap_err()
                .contains("-m")
        );
    }

    #[test]
    fn torchruns_form_runs_python_unbuffered() {
        // TorchX's dist.ddp command line, with `threadwise run` for torchrun.
        let torchx = [
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "localhost:29500",
            "--rdzv_id",
            "app-1",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--tee",
            "3",
            "--role",
            "",
            "train.py",
            "--lr",
            "0.1",
        ];
        let (c, note) = command(&torchx, &["python3"]).unwrap();
        assert_eq!(c, ["python3", "-u", "train.py", "--lr", "0.1"]);
        // The whole command, not cut short.
        assert!(note.unwrap().contains("python3 -u train.py --lr 0.1"));
        let a = run_cmd(&torchx);
        assert_eq!((a.role.as_str(), a.tee.as_deref()), ("", Some("3")));
        assert_eq!(super::super::torchrun::inert_notes(&a).len(), 1);
        // python before python3, as a venv has both.
        let (c, _) = command(&["-m", "pkg.train", "-x"], &["python", "python3"]).unwrap();
        assert_eq!(c, ["python", "-u", "-m", "pkg.train", "-x"]);
        let (c, _) = command(&["--no-python", "./rank.sh", "a"], &[]).unwrap();
        assert_eq!(c, ["./rank.sh", "a"]);
    }

    #[test]
    fn a_program_without_dashes_or_no_python_is_refused_by_name() {
        let e = command(&["-n", "2", "python", "train.py"], &["python"]).unwrap_err();
        assert!(
            e.contains("python is a program, not a script") && e.contains("-- python"),
            "{e}"
        );
        let e = command(&["train.py"], &[]).unwrap_err();
        assert!(e.contains("neither python nor python3"), "{e}");
    }

    #[test]
    fn the_join_timeout_comes_from_the_flag_then_rdzv_conf_then_600() {
        assert_eq!(
            join_timeout(&run_cmd(&["--", "x"])),
            Duration::from_secs(600)
        );
        let conf = run_cmd(&["--rdzv-conf", "join_timeout=900,read_timeout=60", "--", "x"]);
        assert_eq!(join_timeout(&conf), Duration::from_secs(900));
        assert!(super::super::torchrun::inert_notes(&conf)[0].contains("read_timeout"));
        let both = run_cmd(&[
            "--rdzv-timeout",
            "30",
            "--rdzv_conf=join_timeout=900",
            "--",
            "x",
        ]);
        assert_eq!(join_timeout(&both), Duration::from_secs(30));
        for bad in ["join_timeout=soon", "etcd_prefix=/x", "join_timeout"] {
            let argv: Vec<OsString> = ["threadwise", "run", "--rdzv-conf", bad, "--", "x"]
                .iter()
                .map(OsString::from)
                .collect();
            let e = parse(&argv).expect_err(bad).to_string();
            assert!(e.contains("--rdzv-conf"), "{bad}: {e}");
        }
    }
}
