//! `threadwise run` and `bind` with real processes: ranks that exit with a code,
//! die by a signal, ignore SIGTERM, leave a grandchild behind, print partial
//! lines and more than a pipe buffer at once; for each, our exit code, how long
//! it took, what was printed, and that no process is left over.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{ranks_up, threadwise, wait_for};

pub fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("threadwise")
}

fn run(args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let out = Command::new(bin()).arg("run").args(args).output().unwrap();
    (out, t.elapsed())
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Processes (not zombies) whose command line holds `marker`.
pub fn survivors(marker: &str) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{name}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        let argv0 = text(cmd.split(|b| *b == 0).next().unwrap_or_default());
        if !zombie && !argv0.ends_with("threadwise") && text(&cmd).contains(marker) {
            out.push(format!("{name}: {}", text(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// `threadwise run ARGS -- bash -c SCRIPT` in the background, output discarded
/// unless asked for, with SIGINT and SIGQUIT at their defaults.
pub fn spawn_run(args: &[&str], script: &str, stderr: Stdio) -> std::process::Child {
    let mut c = Command::new(bin());
    super::default_signals(&mut c);
    c.arg("run")
        .args(args)
        .args(["--", "bash", "-c", script])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

fn plan_json(n: usize) -> Value {
    let out = threadwise()
        .args(["plan", "--json", "-n", &n.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_rank_exit_code_stops_the_others_and_is_ours() {
    let (out, took) = run(&[
        "-n",
        "2",
        "--grace",
        "5",
        "--",
        "sh",
        "-c",
        "if [ $RANK = 1 ]; then echo boom >&2; exit 3; fi; exec sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        took < Duration::from_secs(4),
        "{took:?}: rank 0 should end on SIGTERM at once"
    );
    let err = text(&out.stderr);
    assert!(err.contains("[rank 1] boom"), "{err}");
    assert!(err.contains("error: rank 1 (pid "), "{err}");
    assert!(err.contains(") exited with code 3"), "{err}");
    assert!(err.contains("  | boom"), "{err}");
    assert!(
        err.contains("killed by signal 15 (SIGTERM)"),
        "rank 0 in the summary: {err}"
    );
}

#[test]
fn a_rank_killed_by_a_signal() {
    let (out, _) = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "[ $RANK = 0 ] && kill -SEGV $$; exec sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(128 + 11));
    assert!(text(&out.stderr).contains("killed by signal 11 (SIGSEGV)"));
}

#[test]
fn a_rank_that_ignores_sigterm_gets_sigkill_after_the_grace() {
    let marker = "tw-ignore-term-4817";
    let script = format!(
        "trap '' TERM; [ $RANK = 1 ] && {{ sleep 0.3; exit 5; }}; while :; do sleep 0.05; done # {marker}"
    );
    let (out, took) = run(&["-n", "2", "--grace", "1", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(5));
    assert!(
        took >= Duration::from_millis(1250) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(text(&out.stderr).contains("killed by signal 9 (SIGKILL)"));
    assert!(survivors(marker).is_empty(), "{:?}", survivors(marker));
}

#[test]
fn grandchildren_are_not_left_behind() {
    let marker = "tw-grandchild-5521";
    let script = format!(
        "(exec -a {marker} sleep 60) & (setsid sh -c 'exec -a {marker}x sleep 60' &) ; echo started"
    );
    let (out, took) = run(&["-n", "2", "--", "bash", "-c", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(text(&out.stdout).matches("started").count(), 2);
    wait_for("no grandchild left", Duration::from_secs(3), || {
        survivors(marker).is_empty()
    });
}

#[test]
fn partial_lines_and_more_than_a_pipe_buffer() {
    // Each rank prints 20000 numbered lines at once (>1 MiB), then a partial line.
    let script = "i=0; while [ $i -lt 20000 ]; do echo \"r$RANK n$i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; i=$((i+1)); done; printf 'tail-of-%s' $RANK";
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = run(&[
        "-n",
        "2",
        "-q",
        "--log-dir",
        dir.path().to_str().unwrap(),
        "--",
        "bash",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut next = [0usize; 2];
    for line in stdout.lines() {
        let (prefix, rest) = line.split_at(9);
        let rank: usize = prefix
            .trim_start_matches("[rank ")
            .trim_end_matches("] ")
            .parse()
            .unwrap();
        if let Some(t) = rest.strip_prefix("tail-of-") {
            assert_eq!(t, rank.to_string());
            continue;
        }
        // Whole lines, in order, never mixed with the other rank's.
        let expect = format!("r{rank} n{} {}", next[rank], "x".repeat(50));
        assert_eq!(rest, expect);
        next[rank] += 1;
    }
    assert_eq!(next, [20000, 20000]);
    assert!(stdout.ends_with("tail-of-0\n") || stdout.ends_with("tail-of-1\n"));
    for r in 0..2 {
        let log = std::fs::read_to_string(dir.path().join(format!("rank-{r}.stdout"))).unwrap();
        assert_eq!(log.lines().count(), 20001);
        assert!(
            log.ends_with(&format!("tail-of-{r}")),
            "the log keeps the bytes as they were"
        );
    }
}

#[test]
fn prefix_filter_and_no_shell() {
    let (out, _) = run(&[
        "-n",
        "2",
        "-q",
        "--local-ranks-filter",
        "1",
        "--no-prefix",
        "--",
        "echo",
        "$(id)",
        "`x`",
        "$RANK",
    ]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout),
        "$(id) `x` $RANK\n",
        "one rank shown, arguments passed literally"
    );
    let (out, _) = run(&["-n", "2", "--local-ranks-filter", "2", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--local-ranks-filter names rank 2"));
}

#[test]
fn ranks_report_the_planned_placement() {
    let n = 2;
    let p = plan_json(n);
    let (out, _) = run(&[
        "-n",
        "2",
        "-q",
        "--mem",
        "bind",
        "--",
        "sh",
        "-c",
        "echo \"$RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2) $(grep Mems_allowed_list /proc/self/status | cut -f2) $(grep -m1 -o 'bind:[0-9,-]*' /proc/self/numa_maps)\"",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for r in 0..n {
        let rank = &p["ranks"][r];
        let nodes: Vec<String> = rank["mem_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.to_string())
            .collect();
        let want = format!(
            "[rank {r}] {r} {} {} bind:{}",
            rank["cpus"].as_str().unwrap(),
            nodes.join(","),
            nodes.join(",")
        );
        assert!(
            stdout.lines().any(|l| l == want),
            "want {want:?} in\n{stdout}"
        );
    }
}

#[test]
fn bind_applies_the_same_plan_under_a_launcher() {
    let p = plan_json(2);
    for r in 0..2 {
        let out = Command::new(bin())
            .args(["bind", "--mem", "interleave", "--", "sh", "-c", "echo $(grep Cpus_allowed_list /proc/self/status | cut -f2) $OMP_NUM_THREADS $(grep -m1 -o 'interleave:[0-9,-]*' /proc/self/numa_maps) $FOO"])
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", "2")
            .env("FOO", "kept")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let rank = &p["ranks"][r];
        let want = format!(
            "{} {} interleave:0 kept\n",
            rank["cpus"].as_str().unwrap(),
            rank["threads"]
        );
        assert_eq!(text(&out.stdout), want);
    }
    // bind execs: exit codes and signals are the command's own.
    let out = Command::new(bin())
        .args(["bind", "--", "sh", "-c", "exit 42"])
        .env("LOCAL_RANK", "0")
        .env("LOCAL_WORLD_SIZE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(42));
    let out = Command::new(bin())
        .args(["bind", "--", "true"])
        .env_remove("LOCAL_RANK")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no launcher environment found"));
}

#[test]
fn bind_json_gives_the_slice_the_python_helper_applies() {
    // Under a launcher (torchrun's variables) and with the caller's rank,
    // the same node plan as plan --json, with run's system-call arguments.
    let p = plan_json(2);
    let from = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(bin());
        c.args(["bind", "--json"])
            .args(args)
            .env_remove("LOCAL_RANK")
            .env_remove("LOCAL_WORLD_SIZE");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let a = from(&[], &[("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]);
    let b = from(&["--local-rank", "1", "--local-world-size", "2"], &[]);
    for (d, launcher) in [(&a, "torchrun"), (&b, "the caller")] {
        assert_eq!(d["schema"], "threadwise.bind/1");
        assert_eq!(d["launcher"], launcher);
        assert_eq!(d["local_rank"], 1);
        assert_eq!(d["local_world_size"], 2);
        assert_eq!(
            d["plan"]["ranks"], p["ranks"],
            "the node plan is plan --json's"
        );
        for r in 0..2 {
            let slot = &d["placements"][r];
            let cpus: Vec<u64> = slot["cpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect();
            let want: Vec<u64> = p["ranks"][r]["cpus"]
                .as_str()
                .unwrap()
                .split(',')
                .flat_map(|part| {
                    let (lo, hi) = part.split_once('-').unwrap_or((part, part));
                    lo.parse::<u64>().unwrap()..=hi.parse::<u64>().unwrap()
                })
                .collect();
            assert_eq!(cpus, want);
            assert_eq!(slot["mem_mode"], 4, "MPOL_LOCAL, as run passes it");
            assert_eq!(slot["env"], p["ranks"][r]["env"]);
        }
        assert_eq!(d["env"]["THREADWISE_CPUS"], p["ranks"][1]["cpus"]);
    }
    // The caller's LOCAL_RANK is added to the variables; torchrun's own is left.
    assert_eq!(b["env"]["LOCAL_RANK"], "1");
    assert!(a["env"].get("LOCAL_RANK").is_none());
    // --mem preferred names one node; --mem none makes no call.
    for (mem, mode, nodes) in [
        ("preferred", serde_json::json!(1), serde_json::json!([0])),
        ("none", serde_json::Value::Null, serde_json::json!([0])),
    ] {
        let args = ["--local-rank", "0", "--local-world-size", "1", "--mem", mem];
        let c = from(&args, &[]);
        assert_eq!(c["placements"][0]["mem_mode"], mode, "--mem {mem}");
        if !mode.is_null() {
            assert_eq!(c["placements"][0]["mem_nodes"], nodes, "--mem {mem}");
        }
    }
    // Wrong numbers are named.
    for (args, says) in [
        (
            &["--local-rank", "2", "--local-world-size", "2"][..],
            "--local-rank 2 with --local-world-size 2",
        ),
        (&["--local-rank", "0"][..], "--local-world-size"),
    ] {
        let out = Command::new(bin())
            .args(["bind", "--json"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn open_mpi_ranks_get_their_planned_cpus() {
    let p = plan_json(2);
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(bin())
        .args(["bind", "--", "sh", "-c", "echo $OMPI_COMM_WORLD_LOCAL_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"])
        .stdin(Stdio::null())
        .output()
        .expect("mpirun from Debian's openmpi-bin (the test command installs it)");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    lines.sort();
    let want: Vec<String> = (0..2)
        .map(|r| format!("{r} {}", p["ranks"][r]["cpus"].as_str().unwrap()))
        .collect();
    assert_eq!(lines, want);
}

/// Under mpirun (and MPICH's variables) on one node, bind sets what torch's
/// env:// needs and the launcher does not (MASTER_ADDR and MASTER_PORT, as a
/// one-node torchrun would); where the ranks span nodes and the launcher says
/// not which host runs rank 0, bind refuses before anything starts, naming
/// MASTER_ADDR (exit 2); a MASTER_ADDR given is kept, MASTER_PORT defaulted.
#[test]
fn bind_under_mpi_launchers_sets_or_asks_for_the_master() {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(bin())
        .args([
            "bind",
            "--",
            "sh",
            "-c",
            "echo $RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT",
        ])
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .stdin(Stdio::null())
        .output()
        .expect("mpirun from Debian's openmpi-bin (the test command installs it)");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, ["0 2 127.0.0.1 29500", "1 2 127.0.0.1 29500"]);
    let bind = |vars: &[(&str, &str)]| {
        let mut c = Command::new(bin());
        c.args(["bind", "--", "sh", "-c", "echo $MASTER_ADDR $MASTER_PORT"]);
        for k in [
            "MASTER_ADDR",
            "MASTER_PORT",
            "LOCAL_RANK",
            "SLURM_LOCALID",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ] {
            c.env_remove(k);
        }
        c.envs(vars.iter().copied()).output().unwrap()
    };
    let ompi = |world: &'static str| {
        [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", world),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]
    };
    let mpich = |world: &'static str| {
        [
            ("PMI_RANK", "1"),
            ("PMI_SIZE", world),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ]
    };
    for one_node in [ompi("2"), mpich("2")] {
        let out = bind(&one_node);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "127.0.0.1 29500\n");
    }
    for many in [ompi("4"), mpich("4")] {
        let out = bind(&many);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("error: MASTER_ADDR is not set")
                && err.contains("4 ranks, 2 of them on this node")
                && err.contains("hint: set MASTER_ADDR"),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "nothing ran");
        let mut with = many.to_vec();
        with.push(("MASTER_ADDR", "node0"));
        let out = bind(&with);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "node0 29500\n");
    }
}

#[test]
fn user_environment_passes_through_and_allocator_is_a_real_file() {
    let out = Command::new(bin())
        .args([
            "run",
            "-n",
            "1",
            "-q",
            "--allocator",
            "auto",
            "--",
            "sh",
            "-c",
            "echo \"$FOO|$LD_PRELOAD|$OMP_NUM_THREADS\"",
        ])
        .env("FOO", "a b;c")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let parts: Vec<&str> = line
        .trim_end()
        .trim_start_matches("[rank 0] ")
        .split('|')
        .collect();
    assert_eq!(parts[0], "a b;c");
    // The test command installs tcmalloc and jemalloc; auto prefers tcmalloc.
    assert!(
        parts[1].contains("libtcmalloc"),
        "LD_PRELOAD={} (scripts/test.sh installs libgoogle-perftools4 and libjemalloc2)",
        parts[1]
    );
    assert!(
        std::path::Path::new(parts[1]).is_file(),
        "LD_PRELOAD names {}",
        parts[1]
    );
    assert_eq!(parts[2], plan_json(1)["ranks"][0]["threads"].to_string());
    // --dry-run lists what the plan replaces.
    let out = Command::new(bin())
        .args(["run", "-n", "1", "--dry-run", "--", "true"])
        .env("OMP_NUM_THREADS", "8")
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("   (replaces 8)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn sigint_is_forwarded_and_a_second_one_kills() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().display();
    let marker = "tw-sigint-7734";
    // Ranks that exit 7 on SIGINT.
    let child = spawn_run(
        &["-n", "2", "-q"],
        &format!("trap 'exit 7' INT; touch {dir}/up$RANK; while :; do sleep 0.05; done # {marker}"),
        Stdio::piped(),
    );
    wait_for("ranks up", Duration::from_secs(5), || ranks_up(d.path(), 2));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("stopped by SIGINT"));
    assert!(survivors(marker).is_empty());

    // Ranks that note SIGINT and go on, and ignore SIGTERM: the second
    // SIGINT kills at once.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().display();
    let marker = "tw-stubborn-7735";
    let mut child = spawn_run(
        &["-n", "2", "-q", "--grace", "30"],
        &format!(
            "trap 'touch {dir}/int$RANK' INT; trap '' TERM; touch {dir}/up$RANK; \
             while :; do sleep 0.05; done # {marker}"
        ),
        Stdio::null(),
    );
    wait_for("ranks up", Duration::from_secs(5), || ranks_up(d.path(), 2));
    let t = Instant::now();
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_for("the first SIGINT forwarded", Duration::from_secs(5), || {
        (0..2).all(|r| d.path().join(format!("int{r}")).exists())
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(survivors(marker).is_empty());
}

/// The marked processes that are not a shell's fork on its way to exec (a
/// fork keeps its parent's command line until it execs: counting those, a
/// count can pass before every real process is up).
fn settled(marker: &str) -> usize {
    let cmdline = |pid: &str| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    survivors(marker)
        .iter()
        .filter(|s| {
            let pid = s.split(':').next().unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1));
            ppid.is_some_and(|pp| cmdline(pp) != cmdline(pid))
        })
        .count()
}

#[test]
fn ranks_die_with_a_sigkilled_threadwise() {
    ranks_die_with_threadwise_ended_by(libc::SIGKILL);
}

/// A crash (SIGABRT, SIGTRAP: signals that dump core) ends the job just as
/// well: the watchdog is a process of its own (with its own memory, which
/// the OOM killer would not take with threadwise's either).
#[test]
fn ranks_die_with_a_crashed_threadwise() {
    ranks_die_with_threadwise_ended_by(libc::SIGABRT);
    ranks_die_with_threadwise_ended_by(libc::SIGTRAP);
}

fn ranks_die_with_threadwise_ended_by(signal: i32) {
    // The ranks and, where a job cgroup can be made, their children too.
    let dry = threadwise()
        .args(["run", "-n", "2", "--dry-run", "--", "true"])
        .output()
        .unwrap();
    let cgroup = text(&dry.stdout).contains("containment: a cgroup v2 per job");
    let marker = &format!("tw-orphan-99{signal}");
    let script = if cgroup {
        // A background child and a setsid one, each a shell that keeps the marker.
        format!(
            "bash -c 'sleep 397; : {marker}' & setsid bash -c 'sleep 398; : {marker}' & \
             while :; do sleep 0.05; done # {marker}"
        )
    } else {
        format!("while :; do sleep 0.05; done # {marker}")
    };
    let mut child = spawn_run(&["-n", "2", "-q"], &script, Stdio::null());
    let want = if cgroup { 6 } else { 2 };
    wait_for(
        "ranks and their children up",
        Duration::from_secs(10),
        || settled(marker) >= want,
    );
    let before = settled(marker);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    child.wait().unwrap();
    assert!(before >= 2, "the ranks were running: {before}");
    if cgroup {
        assert!(
            before >= 6,
            "ranks and their children were running: {before}"
        );
    } else {
        eprintln!("no job cgroup here: {}", text(&dry.stdout));
    }
    wait_for("nothing left of the run", Duration::from_secs(3), || {
        survivors(marker).is_empty()
    });
}

#[test]
fn torchrun_spellings_are_accepted() {
    let out = Command::new(bin())
        .args([
            "run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29777",
            "--master_addr",
            "127.0.0.2",
            "--dry-run",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert_eq!(s.matches("  MASTER_PORT=29777").count(), 2, "{s}");
    assert_eq!(s.matches("  MASTER_ADDR=127.0.0.2").count(), 2, "{s}");
    assert!(s.contains("rank 1: cpus"), "{s}");
}

#[test]
fn clear_errors_and_nothing_started() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("started");
    let touch = format!("touch {}", marker.display());
    // Each bad launch: its exit code, what stderr must name, and no rank ran.
    let refused = |args: &[&str], code: i32, needle: &str| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--", "sh", "-c", &touch]);
        let (out, _) = run(&all);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!marker.exists(), "{args:?} started a rank");
    };
    let (out, _) = run(&["-n", "2", "--", "no-such-program-xyz"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("command not found: no-such-program-xyz"));
    let (out, _) = run(&["-n", "2"]);
    assert_eq!(out.status.code(), Some(2));
    refused(&["-n", "4096"], 2, "4096 ranks need 4096 physical cores");
    refused(&["-n", "0"], 2, "0 ranks");
    refused(&["-n", "18446744073709551615"], 2, "at most");
    refused(&["--grace", "1e300"], 2, "give seconds from");
    refused(&["--gpus", ""], 2, "an empty list");
    refused(
        &["-n", "1", "--log-dir", "/proc/forbidden"],
        3,
        "cannot create log directory /proc/forbidden",
    );
    refused(&["-n", "2", "--local-ranks-filter", "5"], 2, "names rank 5");
    refused(&["--nnodes", "2"], 2, "--nnodes 2 needs --rdzv-endpoint");
    refused(
        &["--nnodes", "2", "--rdzv-endpoint", "node0"],
        2,
        "expected HOST:PORT",
    );
    refused(
        &[
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "no-such-host.invalid:29400",
        ],
        3,
        "cannot resolve the rendezvous endpoint no-such-host.invalid:29400",
    );
    refused(
        &["--rdzv-backend", "etcd"],
        2,
        "[possible values: c10d, static]",
    );
}

#[test]
fn a_refused_binding_stops_the_launch_unless_allowed() {
    // A saved plan asking for memory on NUMA node 63, which this machine lacks:
    // the kernel refuses set_mempolicy (EINVAL) before any rank starts.
    let d = tempfile::tempdir().unwrap();
    let mut p = plan_json(1);
    p["request"]["mem"] = "bind".into();
    p["ranks"][0]["mem_policy"] = "bind".into();
    p["ranks"][0]["mem_nodes"] = serde_json::json!([63]);
    let f = d.path().join("p.json");
    std::fs::write(&f, p.to_string()).unwrap();
    let marker = d.path().join("started");
    let touch = format!("touch {}", marker.display());
    let out = Command::new(bin())
        .args(["run", "--plan"])
        .arg(&f)
        .args(["--", "sh", "-c", &touch])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot bind rank 0 (set_mempolicy refused for CPUs"),
        "{err}"
    );
    assert!(err.contains("memory bind 63"), "{err}");
    assert!(err.contains("--allow-unbound"), "{err}");
    assert!(!marker.exists(), "no rank started");
    let out = Command::new(bin())
        .args(["run", "-q", "--allow-unbound", "--plan"])
        .arg(&f)
        .args(["--", "sh", "-c", &touch])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("ranks run unbound"));
    assert!(marker.exists());
}

/// `run` moves a rank's workers (children running the rank's own program) to
/// the plan's worker CPUs; the rank keeps its own; `--no-move-workers` leaves
/// them. Shell builtins read /proc/self, so each line is that process's mask.
#[test]
fn dataloader_workers_are_moved_to_the_worker_cpus() {
    let plan = plan_json(2);
    let (rank_cpus, worker_cpus) = (
        plan["ranks"][0]["cpus"].as_str().unwrap().to_string(),
        plan["ranks"][0]["worker_cpus"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    let mask =
        r#"while read -r k v; do [ "$k" = Cpus_allowed_list: ] && m=$v; done < /proc/self/status"#;
    // The worker looks at its mask every 50 ms until it is on the worker CPUs
    // (at most $N looks), then writes what it has.
    let script = format!(
        "( i=0; while {mask}; [ \"$m\" != \"$THREADWISE_WORKER_CPUS\" ] && [ $i -lt $N ]; do \
         sleep 0.05; i=$((i+1)); done; echo \"$m\" > \"$D/worker-$LOCAL_RANK\" ) & \
         {mask}; echo \"$m\" > \"$D/rank-$LOCAL_RANK\"; wait"
    );
    // Moved: within 5 s. Not moved: not in 1 s, ten of the mover's ticks.
    for (flags, moved, looks) in [
        (&[][..], true, "100"),
        (&["--no-move-workers"][..], false, "20"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let mut args = vec!["-n", "2", "-q"];
        args.extend_from_slice(flags);
        args.extend(["--", "sh", "-c", &script]);
        let out = Command::new(bin())
            .arg("run")
            .args(&args)
            .env("D", d.path())
            .env("N", looks)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let read = |f: &str| {
            std::fs::read_to_string(d.path().join(f))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("rank-0"), rank_cpus);
        let want = if moved { &worker_cpus } else { &rank_cpus };
        assert_eq!(&read("worker-0"), want, "flags {flags:?}");
        if moved {
            assert_ne!(worker_cpus, rank_cpus, "this machine's plan moves workers");
        }
    }
}

/// A multi-node dry run starts nothing and joins nothing: it shows this
/// node's ranks as node `--node-rank` would run them, with the interface
/// that reaches the endpoint for the collectives.
#[test]
fn multi_node_dry_run_shows_the_nodes_ranks() {
    let out = super::threadwise()
        .args(["run", "--nnodes", "2", "-n", "1", "--node-rank", "1"])
        .args(["--rdzv-endpoint", "127.0.0.1:9", "--dry-run", "--", "true"])
        .env_remove("GLOO_SOCKET_IFNAME")
        .env_remove("NCCL_SOCKET_IFNAME")
        .output()
        .unwrap();
    let text = super::stdout_ok(out);
    assert!(
        text.contains("joins the rendezvous at 127.0.0.1:9"),
        "{text}"
    );
    for want in [
        "  RANK=1\n",
        "  GROUP_RANK=1\n",
        "  WORLD_SIZE=2\n",
        "  MASTER_ADDR=127.0.0.1\n",
        "  GLOO_SOCKET_IFNAME=lo\n",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
}

/// `bind --local-rank K --local-world-size N` outside any launcher makes a
/// one-node job as torchrun --standalone would: RANK = K, WORLD_SIZE = N,
/// MASTER_ADDR 127.0.0.1 and torchrun's port, said once by rank 0; a RANK the
/// caller set is left alone.
#[test]
fn bind_outside_a_launcher_numbers_the_ranks_as_one_node() {
    let show = "echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK \
                MASTER=$MASTER_ADDR:$MASTER_PORT";
    let clean = |c: &mut Command| {
        for k in [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SLURM_PROCID",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
        ] {
            c.env_remove(k);
        }
    };
    for k in 0..2 {
        let mut c = Command::new(bin());
        clean(&mut c);
        let out = c
            .args([
                "bind",
                "--local-rank",
                &k.to_string(),
                "--local-world-size",
                "2",
            ])
            .args(["--", "sh", "-c", show])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim(),
            format!("RANK={k} WORLD_SIZE=2 LOCAL_RANK={k} MASTER=127.0.0.1:29500")
        );
        let said = text(&out.stderr).contains("as torchrun --standalone numbers it");
        assert_eq!(said, k == 0, "said once, by rank 0: {}", text(&out.stderr));
    }
    let mut c = Command::new(bin());
    clean(&mut c);
    let out = c
        .env("RANK", "5")
        .env("WORLD_SIZE", "8")
        .env("MASTER_ADDR", "10.0.0.1")
        .env("MASTER_PORT", "1234")
        .args(["bind", "--local-rank", "1", "--local-world-size", "2"])
        .args(["--", "sh", "-c", show])
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        "RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 MASTER=10.0.0.1:1234"
    );
}

/// Before any rank's output, `run` says where each rank goes: its CPUs,
/// threads, workers, memory and GPU, in one line (not with -q).
#[test]
fn run_names_each_ranks_cpus_before_their_output() {
    let script = format!("{} run -n 2 -- echo hello 2>&1", bin().display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = text(&out.stdout);
    let line = all
        .lines()
        .find(|l| l.starts_with("threadwise: ranks 0-1: cpus "))
        .unwrap_or_else(|| panic!("no placement line in {all}"));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 {
        assert!(line.contains("cpus 0 | 1;"), "{line}");
    }
    for part in ["; threads ", "; workers ", "; memory ", "; GPU "] {
        assert!(line.contains(part), "{line}");
    }
    assert!(
        all.find(line).unwrap() < all.find("[rank ").unwrap(),
        "{all}"
    );
    let quiet = Command::new(bin())
        .args(["run", "-n", "2", "-q", "--", "true"])
        .output()
        .unwrap();
    assert!(
        !text(&quiet.stderr).contains("cpus "),
        "{}",
        text(&quiet.stderr)
    );
}

/// A one-node job restarts its ranks as `torchrun --standalone` does: with
/// `--max-restarts 1`, a script failing on attempt 0 and passing on attempt
/// 1 exits 0, its ranks see TORCHELASTIC_RESTART_COUNT 0 then 1 (and the
/// real TORCHELASTIC_MAX_RESTARTS), and both attempts' logs are kept; with
/// `--max-restarts 0` the run exits with the rank's own code. (Before, one
/// node never restarted: exit 5 and TORCHELASTIC_MAX_RESTARTS=0.)
#[test]
fn max_restarts_restarts_the_ranks_of_one_node() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("fail.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"rank $RANK count $TORCHELASTIC_RESTART_COUNT max $TORCHELASTIC_MAX_RESTARTS\"\n\
         [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 5\nexit 0\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let logs = d.path().join("logs");
    let s = script.to_str().unwrap();
    let (out, _) = run(&[
        "-n",
        "2",
        "--max-restarts",
        "1",
        "--log-dir",
        logs.to_str().unwrap(),
        "--duplicate-stdout-filters",
        "rank 1",
        "--",
        s,
    ]);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{so}{se}");
    for want in [
        "[rank 1] rank 1 count 0 max 1",
        "[rank 1] rank 1 count 1 max 1",
        "[rank 0] rank 0 count 1 max 1",
    ] {
        assert!(so.contains(want), "{want}: {so}");
    }
    assert!(
        se.contains("the ranks start again (round 1; restarts 1 of 1)"),
        "{se}"
    );
    let first = std::fs::read_to_string(logs.join("rank-1.stdout")).unwrap();
    let second = std::fs::read_to_string(logs.join("restart-1/rank-1.stdout")).unwrap();
    assert_eq!(first, "rank 1 count 0 max 1\n");
    assert_eq!(second, "rank 1 count 1 max 1\n");
    // torchrun's filtered copy is one file for the job: every attempt's lines.
    let filtered = std::fs::read_to_string(logs.join("filtered-stdout.log")).unwrap();
    assert!(
        filtered.contains("rank 1 count 0") && filtered.contains("rank 1 count 1"),
        "{filtered}"
    );
    // No restart allowed: the rank's own code, once.
    let (out, _) = run(&["-n", "2", "--max-restarts", "0", "--", s]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("count 1"));
    // The dry run exports what the ranks will get.
    let (out, _) = run(&["-n", "2", "--max-restarts", "3", "--dry-run", "--", s]);
    assert!(text(&out.stdout).contains("TORCHELASTIC_MAX_RESTARTS=3"));
}

/// Ctrl-C (SIGINT) or SIGTERM ends a one-node job at once, never a restart.
#[test]
fn a_signal_ends_a_one_node_job_without_a_restart() {
    let c = Command::new(bin())
        .args([
            "run",
            "-n",
            "2",
            "--max-restarts",
            "3",
            "-q",
            "--",
            "sleep",
            "30",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM));
    assert!(t.elapsed() < Duration::from_secs(8));
    let se = text(&out.stderr);
    assert!(
        !se.contains("start again") && se.contains("stopped by SIGTERM"),
        "{se}"
    );
}

/// SIGKILL of the supervisor (the OOM killer's choice, a node's loss) loses
/// no line a rank printed: every line is in the rank's log, as it came.
#[test]
fn a_killed_supervisor_loses_no_logged_line() {
    let d = tempfile::tempdir().unwrap();
    let logs = d.path().join("logs");
    let done = d.path().join("printed");
    let script = format!(
        "for i in $(seq 1 48); do echo line $i; done; touch {}; sleep 30",
        done.display()
    );
    let mut c = Command::new(bin())
        .args(["run", "-n", "1", "-q", "--log-dir"])
        .arg(&logs)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !done.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(done.exists(), "the rank printed its lines");
    // The pump reads as the bytes come; a moment for it to have read them.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
    let log = std::fs::read_to_string(logs.join("rank-0.stdout")).unwrap();
    let want: String = (1..=48).map(|i| format!("line {i}\n")).collect();
    assert_eq!(log, want, "every line the rank printed, line by line");
}

/// The log directory threadwise makes is its owner's alone (0700), and so
/// are the files in it (0600); in a directory the user opened to others, the
/// files are readable as the directory is.
#[test]
fn logs_are_private_unless_the_directory_says_otherwise() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let d = tempfile::tempdir().unwrap();
    let made = d.path().join("new/logs");
    let (out, _) = run(&[
        "-n",
        "1",
        "-q",
        "--log-dir",
        made.to_str().unwrap(),
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&made), 0o700);
    assert_eq!(mode(&d.path().join("new")), 0o700);
    assert_eq!(mode(&made.join("rank-0.stdout")), 0o600);
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (out, _) = run(&[
        "-n",
        "1",
        "-q",
        "--log-dir",
        open.to_str().unwrap(),
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&open), 0o755, "the user's directory keeps its mode");
    assert_eq!(mode(&open.join("rank-0.stdout")), 0o644);
}
