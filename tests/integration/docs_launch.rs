//! The docs' launching examples, run: every `threadwise run|bind|tune|top`
//! line in README.md and docs/, alone or under torchrun, srun or mpirun.
//!
//! - `run`, `bind` and `tune` run as written with `--dry-run` added (the
//!   whole command line parsed, the plan made, every setting checked), on a
//!   synthetic machine where the example needs more cores than this one (a
//!   GPU server for `-n gpu`). A `run` of `python train.py` that fits here
//!   also runs for real, with a stand-in train.py that prints its rank.
//! - A launcher in front (`torchrun ... threadwise bind`, `srun`, `mpirun`) is
//!   stood in for by the variables it gives each task (its first task's); the
//!   real launchers run in tests/integration/run.rs, slurm.rs and hosts/.
//! - `top` lines run with `--once` against a live `threadwise run`.
//!
//! Every line is either run or in `NOT_HERE` with the reason, so a new
//! example cannot slip past.

use std::path::Path;
use std::process::{Command, Output};

use super::docs::{all_command_lines, without_comment};
use super::scratch;

const BIGGER: &str = "package:2 numa:2 l3:2 core:8 pu:2";
const GPU_SERVER: &str = "package:2 numa:2 l3:2 core:8 pu:2 gpu:8";

/// Lines not run here (by prefix), and why: none today.
const NOT_HERE: &[(&str, &str)] = &[];

/// The training script the examples name: prints its rank, as torchrun's
/// contract gives it.
const TRAIN_PY: &str = "import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], sys.argv[1:])\n";

/// The variables a launcher gives its first task, and the threadwise part of
/// the line.
fn under_launcher(line: &str) -> (Vec<(String, String)>, String) {
    let Some((launcher, rest)) = line.split_once(" threadwise ") else {
        return (vec![], line.to_string());
    };
    let tw = format!("threadwise {rest}");
    let n = |flag: &str| {
        launcher
            .split_whitespace()
            .skip_while(|w| !w.starts_with(flag))
            .find_map(|w| w.rsplit('=').next().and_then(|v| v.parse::<usize>().ok()))
            .or_else(|| {
                let words: Vec<&str> = launcher.split_whitespace().collect();
                let at = words.iter().position(|w| *w == flag)?;
                words.get(at + 1)?.parse().ok()
            })
            .unwrap_or(1)
            .to_string()
    };
    let env: Vec<(&str, String)> = if launcher.starts_with("torchrun") {
        let k = n("--nproc-per-node");
        vec![
            ("LOCAL_RANK", "0".into()),
            ("LOCAL_WORLD_SIZE", k.clone()),
            ("RANK", "0".into()),
            ("WORLD_SIZE", k),
        ]
    } else if launcher.starts_with("srun") {
        let k = n("--ntasks-per-node");
        vec![
            ("SLURM_JOB_ID", "4242".into()),
            ("SLURM_PROCID", "0".into()),
            ("SLURM_LOCALID", "0".into()),
            ("SLURM_NODEID", "0".into()),
            ("SLURM_NNODES", "2".into()),
            ("SLURM_TASKS_PER_NODE", format!("{k}(x2)")),
            ("SLURM_JOB_NODELIST", "localhost".into()),
            ("head", "localhost".into()),
        ]
    } else if launcher.starts_with("mpirun") {
        let k = n("-np");
        vec![
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", k.clone()),
            ("OMPI_COMM_WORLD_RANK", "0".into()),
            ("OMPI_COMM_WORLD_SIZE", k),
        ]
    } else {
        panic!("a launcher the harness does not know: {line}");
    };
    (
        env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        tw,
    )
}

/// `--dry-run` right after the subcommand, and `extra` after that.
fn with_flags(tw: &str, extra: &str) -> String {
    let mut words = tw.splitn(3, ' ');
    let (bin, sub, rest) = (
        words.next().unwrap(),
        words.next().unwrap(),
        words.next().unwrap_or_default(),
    );
    let dry = if tw.contains(" --dry-run") || tw.contains(" --json") {
        ""
    } else {
        " --dry-run"
    };
    format!("{bin} {sub}{dry}{extra} {rest}")
}

#[test]
fn every_launch_example_in_the_docs_runs() {
    let dir = scratch();
    std::fs::write(dir.path().join("train.py"), TRAIN_PY).unwrap();
    std::fs::create_dir_all(dir.path().join("examples")).unwrap();
    std::fs::write(dir.path().join("examples/ddp_train.py"), TRAIN_PY).unwrap();
    // `--topology node.xml`: an hwloc export of a 4-socket, 8-core machine.
    std::fs::copy(
        super::topologies("xml/16em64t-4s2c2t.xml"),
        dir.path().join("node.xml"),
    )
    .unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_threadwise"))
        .parent()
        .unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    // The plan `run --plan best.json` reads (tune --save-plan writes it).
    let go = |cmd: &str, env: &[(String, String)]| -> Output {
        let mut c = Command::new("sh");
        c.args(["-c", cmd])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .env_remove("LOCAL_RANK");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let saved = go("threadwise plan -n 2 --json > best.json", &[]);
    assert!(saved.status.success());
    // A live run for the `top` lines.
    let mut live = Command::new(env!("CARGO_BIN_EXE_threadwise"))
        .args(["run", "-n", "2", "-q", "--", "sleep", "60"])
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (mut dry, mut real, mut tops, mut skipped) = (0, 0, 0, vec![]);
    let lines: Vec<(String, String)> = all_command_lines()
        .into_iter()
        .filter(|(_, l)| {
            let tw = l.split_once("threadwise ").map_or("", |(_, r)| r);
            let help = without_comment(l).ends_with(" --help");
            !help
                && (tw == "top"
                    || ["run ", "bind ", "tune ", "top "]
                        .iter()
                        .any(|w| tw.starts_with(w)))
        })
        .collect();
    let show = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    for (file, line) in &lines {
        let cmd = without_comment(line).to_string();
        if let Some((_, why)) = NOT_HERE.iter().find(|(p, _)| cmd.starts_with(p)) {
            skipped.push(format!("{cmd}: {why}"));
            continue;
        }
        let (env, tw) = under_launcher(&cmd);
        if tw.starts_with("threadwise top") {
            // Our live run's ranks (its `sleep` children; the suite's other
            // tests start runs of their own, so not "the newest run"), for `--pid`.
            let id = live.id();
            let pids: Vec<String> =
                std::fs::read_to_string(format!("/proc/{id}/task/{id}/children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter(|p| {
                        std::fs::read_to_string(format!("/proc/{p}/comm"))
                            .is_ok_and(|c| c.trim() == "sleep")
                    })
                    .map(str::to_string)
                    .collect();
            assert_eq!(pids.len(), 2, "the live run's ranks");
            let once = tw.replace("--pid 4121 4122", &format!("--pid {}", pids.join(" ")));
            let once = if once.contains("--once") {
                once
            } else {
                format!("{once} --once")
            };
            let out = go(&once, &env);
            assert!(
                out.status.success(),
                "{file}: `{line}` as `{once}`:\n{}",
                show(&out)
            );
            assert!(
                show(&out).contains("rank"),
                "{file}: `{line}`:\n{}",
                show(&out)
            );
            tops += 1;
            continue;
        }
        let has_source = ["--synthetic", "--root", "--topology"]
            .iter()
            .any(|s| tw.contains(s));
        let here = with_flags(&tw, "");
        let mut out = go(&here, &env);
        let fits_here = out.status.success();
        if !fits_here && !has_source {
            let machine = if tw.contains("-n gpu") {
                GPU_SERVER
            } else {
                BIGGER
            };
            out = go(
                &with_flags(&tw, &format!(" --synthetic \"{machine}\"")),
                &env,
            );
        }
        assert!(
            out.status.success(),
            "{file}: `{line}` (as `{here}`) exited {:?}:\n{}",
            out.status.code(),
            show(&out)
        );
        let said = show(&out);
        let expect = if tw.starts_with("threadwise tune") {
            "configuration(s)"
        } else {
            "rank 0"
        };
        assert!(said.contains(expect), "{file}: `{line}`:\n{said}");
        dry += 1;
        // Fits here and starts python train.py: run it for real.
        if fits_here
            && env.is_empty()
            && tw.starts_with("threadwise run")
            && tw.contains("train.py")
            && !tw.contains("--top")
            && !tw.contains("--dry-run")
        {
            let out = go(&tw, &env);
            let said = show(&out);
            assert!(out.status.success(), "{file}: `{line}`:\n{said}");
            assert!(said.contains("rank 0 of"), "{file}: `{line}`:\n{said}");
            real += 1;
        }
    }
    let _ = live.kill();
    let _ = live.wait();
    eprintln!(
        "{} launch examples: {dry} dry runs, {real} of them also for real, {tops} top, not here: {skipped:#?}",
        lines.len()
    );
    assert!(dry >= 20 && real >= 3 && tops >= 4, "{dry} {real} {tops}");
    assert_eq!(dry + tops + skipped.len(), lines.len());
}
