//! torchrun 2.15's whole command line under `threadwise run`: every option
//! of its `--help`, in both spellings and through its `PET_*` variable,
//! accepted and none taken for the script; what each does here, run for
//! real where it changes something. (scripts/pytorch-e2e.sh reads the
//! installed torchrun's own parser, so a new torchrun option fails there.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::threadwise;

/// torchrun 2.15's options (`torch/distributed/run.py`), a value for each
/// (None: a switch), and whether torchrun reads it from PET_<NAME>.
const OPTIONS: &[(&[&str], Option<&str>, bool)] = &[
    (&["--nnodes"], Some("1"), true),
    (&["--nproc-per-node", "--nproc_per_node"], Some("cpu"), true),
    (&["--rdzv-backend", "--rdzv_backend"], Some("c10d"), true),
    (
        &["--rdzv-endpoint", "--rdzv_endpoint"],
        Some("localhost:29400"),
        true,
    ),
    (&["--rdzv-id", "--rdzv_id"], Some("job"), true),
    (
        &["--rdzv-conf", "--rdzv_conf"],
        Some("join_timeout=60,last_call_timeout=5"),
        true,
    ),
    (&["--standalone"], None, true),
    (&["--max-restarts", "--max_restarts"], Some("2"), true),
    (
        &["--monitor-interval", "--monitor_interval"],
        Some("0.1"),
        true,
    ),
    (
        &["--start-method", "--start_method"],
        Some("forkserver"),
        true,
    ),
    (
        &["--event-log-handler", "--event_log_handler"],
        Some("console"),
        true,
    ),
    (&["--role"], Some("trainer"), true),
    (&["-m", "--module"], None, true),
    (&["--no-python", "--no_python"], None, true),
    (&["--run-path", "--run_path"], None, true),
    (&["--log-dir", "--log_dir"], Some("logs"), true),
    (&["-r", "--redirects"], Some("3"), true),
    (&["-t", "--tee"], Some("3"), true),
    (
        &["--log-line-prefix-template", "--log_line_prefix_template"],
        Some("${rank}: "),
        true,
    ),
    (
        &["--local-ranks-filter", "--local_ranks_filter"],
        Some("0"),
        true,
    ),
    (
        &["--duplicate-stdout-filters", "--duplicate_stdout_filters"],
        Some("loss"),
        true,
    ),
    (
        &["--duplicate-stderr-filters", "--duplicate_stderr_filters"],
        Some("warn"),
        true,
    ),
    (&["--node-rank", "--node_rank"], Some("0"), true),
    (&["--master-addr", "--master_addr"], Some("127.0.0.1"), true),
    (&["--master-port", "--master_port"], Some("29511"), true),
    (&["--local-addr", "--local_addr"], Some("127.0.0.1"), true),
    (&["--logs-specs", "--logs_specs"], Some("default"), false),
    (
        &["--numa-binding", "--numa_binding"],
        Some("core-complex"),
        false,
    ),
    (
        &["--signals-to-handle", "--signals_to_handle"],
        Some("SIGTERM,SIGUSR1"),
        true,
    ),
    (
        &["--shutdown-timeout", "--shutdown_timeout"],
        Some("5"),
        true,
    ),
    (
        &["--virtual-local-rank", "--virtual_local_rank"],
        None,
        true,
    ),
    (
        &["--print-completion", "--print_completion"],
        Some("bash"),
        false,
    ),
];

/// The script every rank runs, as the dry run shows it.
fn argv_line(out: &std::process::Output) -> Option<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("argv: ").map(str::to_string))
}

#[test]
fn every_torchrun_option_is_accepted_and_none_is_taken_for_the_script() {
    let dir = super::scratch();
    std::fs::write(dir.path().join("train.py"), "#!/bin/sh\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("train.py"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(
        OPTIONS.len(),
        32,
        "torchrun 2.15 lists 32 options besides -h"
    );
    for (spellings, value, pet) in OPTIONS {
        for flag in *spellings {
            let mut args = vec!["run", "--dry-run", flag];
            args.extend(value.iter());
            // The module and no-python forms take what follows as theirs.
            let script = match spellings[0] {
                "-m" => "pkg.train",
                "--no-python" => "./train.py",
                _ => "train.py",
            };
            args.extend([script, "--lr", "0.1"]);
            let out = threadwise()
                .current_dir(dir.path())
                .args(&args)
                .env_remove("SLURM_JOB_ID")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{args:?}: {err}");
            if spellings[0] == "--print-completion" {
                assert!(String::from_utf8_lossy(&out.stdout).contains("_threadwise"));
                continue;
            }
            let argv = argv_line(&out).unwrap_or_else(|| panic!("{args:?}: no argv"));
            let want = match spellings[0] {
                "-m" => "python -u -m pkg.train --lr 0.1",
                "--no-python" => "./train.py --lr 0.1",
                _ => "python -u train.py --lr 0.1",
            };
            assert_eq!(argv, want, "{args:?}");
        }
        if !pet {
            continue;
        }
        let var = format!(
            "PET_{}",
            spellings
                .last()
                .unwrap()
                .trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        );
        let out = threadwise()
            .current_dir(dir.path())
            .args(["run", "--dry-run"])
            .arg(match spellings[0] {
                "--no-python" => "./train.py",
                _ => "train.py",
            })
            .env(&var, value.unwrap_or("1"))
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains(&format!("{var}=")),
            "{var}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = match spellings[0] {
            "-m" => "python -u -m train.py",
            "--no-python" => "./train.py",
            _ => "python -u train.py",
        };
        assert_eq!(argv_line(&out).as_deref(), Some(want), "{var}");
    }
}

#[test]
fn an_elastic_node_range_is_accepted() {
    for env in [false, true] {
        let mut c = threadwise();
        c.args(["run", "--dry-run", "--rdzv-endpoint", "localhost:29400"]);
        match env {
            true => c.env("PET_NNODES", "1:2"),
            false => c.args(["--nnodes", "1:2"]),
        };
        let out = c
            .arg("train.py")
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap();
        let text = super::stdout_ok(out);
        assert!(text.contains("as one of 1 to 2 node(s) (elastic"), "{text}");
    }
}

#[test]
fn an_option_nobody_knows_before_the_script_is_an_error_naming_it() {
    let out = threadwise()
        .args(["run", "--monitor-intervall", "1", "train.py"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unrecognized option --monitor-intervall"),
        "{err}"
    );
    // After --, it is the command's.
    let out = threadwise()
        .args([
            "run",
            "-n",
            "1",
            "-q",
            "--",
            "sh",
            "-c",
            "echo $0",
            "--monitor-intervall",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--monitor-intervall"));
    let out = threadwise()
        .args(["run", "--logs-specs", "mine", "train.py"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn torchruns_options_do_what_torchruns_do() {
    let dir = super::scratch();
    let d = dir.path();
    let script = "import os, sys\nprint('loss', os.environ['RANK'], os.environ['LOCAL_RANK'], flush=True)\nprint('warn me', file=sys.stderr)\n";
    std::fs::write(d.join("t.py"), script).unwrap();
    let out = threadwise()
        .current_dir(d)
        .args(["run", "-q", "--nproc_per_node", "2", "--log_dir", "logs"])
        .args([
            "--log-line-prefix-template",
            "${role_name}/${rank}|${local_rank}: ",
        ])
        .args([
            "--duplicate-stdout-filters",
            "loss",
            "--duplicate_stderr_filters",
            "warn,,x,warn",
        ])
        .args(["--virtual-local-rank", "--run-path", "t.py"])
        .output()
        .unwrap();
    let text = super::stdout_ok(out);
    // The template is the prefix; LOCAL_RANK is 0 in both ranks.
    assert!(text.contains("default/1|1: loss 1 0"), "{text}");
    assert!(text.contains("default/0|0: loss 0 0"), "{text}");
    let mut filtered: Vec<String> = std::fs::read_to_string(d.join("logs/filtered-stdout.log"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    filtered.sort();
    assert_eq!(filtered, ["loss 0 0", "loss 1 0"]);
    let err_lines = std::fs::read_to_string(d.join("logs/filtered-stderr.log")).unwrap();
    assert_eq!(err_lines.lines().count(), 2, "{err_lines}");
    // Without --log-dir: a private directory of its own, named on stderr.
    let out = threadwise()
        .current_dir(d)
        .args([
            "run",
            "-q",
            "-n",
            "1",
            "--duplicate-stdout-filters",
            "loss",
            "t.py",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let dir = err
        .split("the filtered lines go to ")
        .nth(1)
        .and_then(|r| r.lines().next())
        .unwrap_or_else(|| panic!("{err}"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    let kept = std::fs::read_to_string(Path::new(dir).join("filtered-stdout.log")).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    assert_eq!((mode, kept.as_str()), (0o700, "loss 0 0\n"), "{err}");
    // One rank per allowed CPU.
    let out = threadwise()
        .args(["run", "--dry-run", "--nproc-per-node", "cpu", "t.py"])
        .output()
        .unwrap();
    let n = std::thread::available_parallelism().unwrap().get();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{n} rank(s)")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn signals_to_handle_naming_sigusr1_makes_it_stop_the_job() {
    // SIGUSR1 is passed to the ranks and the run goes on, unless named.
    for (named, stops) in [(false, false), (true, true)] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_threadwise"));
        cmd.args(["run", "-n", "1", "-q", "--shutdown-timeout", "1"]);
        if named {
            cmd.args(["--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1"]);
        }
        let child = cmd
            .args([
                "--",
                "sh",
                "-c",
                "trap 'echo got-usr1' USR1; sleep 3 & wait; sleep 0.5",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        // SAFETY: signalling our child.
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        let t0 = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        let took = t0.elapsed();
        if stops {
            assert_eq!(
                out.status.code(),
                Some(128 + libc::SIGUSR1),
                "named: {took:?}"
            );
        } else {
            assert!(out.status.success(), "{:?}", out.status);
            assert!(String::from_utf8_lossy(&out.stdout).contains("got-usr1"));
        }
    }
}

/// A torchrun line with `torchrun` replaced by `threadwise run` keeps
/// torchrun's world size: without --nproc-per-node, 1 rank (torchrun's
/// default), said; threadwise's own form (`-- CMD`) plans auto. The start
/// line shows the whole command each rank runs.
#[test]
fn a_replaced_torchrun_line_keeps_its_world_size() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.py"), "").unwrap();
    let syn = ["--synthetic", "package:2 numa:2 core:4"];
    let ranks = |args: &[&str]| {
        let out = threadwise()
            .current_dir(dir.path())
            .args(["run", "--dry-run"])
            .args(syn)
            .args(args)
            .env_remove("SLURM_JOB_ID")
            .env_remove("PET_NPROC_PER_NODE")
            .output()
            .unwrap();
        let text = super::stdout_ok(out);
        let n = text
            .lines()
            .find(|l| l.contains(" rank(s); each inherits"))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{args:?}: {text}"));
        (n, text)
    };
    let (n, text) = ranks(&["train.py", "--lr", "0.1", "--name", "a b", "--x", "y"]);
    assert_eq!(n, 1, "{text}");
    assert!(text.contains("1 rank, torchrun's default"), "{text}");
    assert!(
        text.contains("each rank runs python -u train.py --lr 0.1 --name 'a b' --x y\n"),
        "{text}"
    );
    assert_eq!(ranks(&["--nproc-per-node", "2", "train.py"]).0, 2);
    assert_eq!(ranks(&["--", "python", "train.py"]).0, 4);
}

/// torchrun (argparse) takes a prefix that one option string alone starts
/// with, and refuses one that several share; so does `run` (the whole list is
/// checked against the installed torchrun by scripts/torchrun_options.py).
#[test]
fn torchruns_abbreviations_are_taken_and_an_ambiguous_one_refused() {
    let out = threadwise()
        .args([
            "run",
            "--dry-run",
            "--nproc_per",
            "2",
            "--master_p",
            "29560",
            "--max-restart",
            "1",
            "--no-python",
            "/bin/true",
            "--lr",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("2 rank(s)"), "{text}");
    assert_eq!(argv_line(&out).as_deref(), Some("/bin/true --lr"), "{text}");
    // A prefix both spellings of one option share: torchrun refuses it too.
    let out = threadwise()
        .args(["run", "--dry-run", "--nproc", "2", "train.py"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "error: ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
        ),
        "{err}"
    );
    // Written out before torchrun's variables are read: the command line's
    // abbreviation wins over PET_NPROC_PER_NODE, as its full spelling does.
    let out = threadwise()
        .args([
            "run",
            "--dry-run",
            "--nproc_per",
            "2",
            "--no-python",
            "/bin/true",
        ])
        .env("PET_NPROC_PER_NODE", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("2 rank(s)"), "{text}");
    // Past the script, nothing is expanded: the script's own options are its.
    let out = threadwise()
        .args([
            "run",
            "--dry-run",
            "--no-python",
            "/bin/true",
            "--nproc",
            "x",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(argv_line(&out).as_deref(), Some("/bin/true --nproc x"));
}
