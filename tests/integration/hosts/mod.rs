//! Multi-node on real test hosts (scripts/test-hosts.sh: network namespaces
//! with their own addresses, hostnames and CPU sets, a real Slurm across
//! them). One test at a time: the link-down test takes host1 off the network.
//! The faults across hosts are in `faults.rs`.

mod auth;
mod faults;
mod pet;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub(super) fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/test-hosts.sh")
}

pub(super) fn bin() -> String {
    assert_cmd::cargo::cargo_bin("threadwise")
        .to_str()
        .unwrap()
        .to_string()
}

static UP: OnceLock<String> = OnceLock::new();
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The hosts, up (once per test binary; `up` is idempotent), and the lock.
pub(super) fn hosts() -> MutexGuard<'static, ()> {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    UP.get_or_init(|| {
        let out = Command::new(script()).args(["up", "2"]).output().unwrap();
        assert!(
            out.status.success(),
            "test-hosts.sh up 2: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    });
    guard
}

pub(super) fn state_dir() -> PathBuf {
    PathBuf::from(std::env::var("TW_TEST_HOSTS_DIR").unwrap_or("/run/threadwise-test-hosts".into()))
}

pub(super) fn on(host: &str, args: &[&str]) -> Command {
    let mut c = Command::new(script());
    c.arg("exec").arg(host).args(args);
    c.stdin(Stdio::null());
    c
}

/// Start `args` on `host` with its output in `dir/NAME.out`; the child's pid
/// is the command's own (exec all the way down).
pub(super) fn start(host: &str, args: &[&str], dir: &Path, name: &str) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    on(host, args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Wait for children at most `limit` after `since`: each one's code and how
/// long after `since` it ended.
pub(super) fn finish_all<const N: usize>(
    mut children: [&mut Child; N],
    since: Instant,
    limit: Duration,
) -> [(i32, Duration); N] {
    let mut ends: [Option<(i32, Duration)>; N] = [None; N];
    while ends.iter().any(Option::is_none) {
        for (end, c) in ends.iter_mut().zip(children.iter_mut()) {
            if end.is_none()
                && let Some(s) = c.try_wait().unwrap()
            {
                *end = Some((s.code().unwrap_or(-1), since.elapsed()));
            }
        }
        if since.elapsed() > limit {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("still running after {limit:?}: {ends:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ends.map(Option::unwrap)
}

/// Wait for one child at most `limit`: its exit code and how long it took.
pub(super) fn finish(c: &mut Child, limit: Duration) -> (i32, Duration) {
    let [end] = finish_all([c], Instant::now(), limit);
    end
}

pub(super) fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap()
}

/// Processes on any host whose command line mentions `marker`.
pub(super) fn leftovers(marker: &str) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(marker) {
                out.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// Wait until `f` holds (up to 20 s).
pub(super) fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waited 20 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A rank program: say who it is, record its pid, then sleep (or run `tail`).
pub(super) fn rank_script(dir: &Path, tail: &str) -> String {
    let path = dir.join("rank.sh");
    std::fs::write(
        &path,
        format!(
            "echo \"$(hostname) RANK=$RANK LOCAL_RANK=$LOCAL_RANK GROUP_RANK=$GROUP_RANK \
             WORLD_SIZE=$WORLD_SIZE MASTER=$MASTER_ADDR:$MASTER_PORT IF=$GLOO_SOCKET_IFNAME \
             RESTART=$TORCHELASTIC_RESTART_COUNT CPUS=$(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\n\
             echo $$ > {d}/pid-$RANK\n{tail}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

pub(super) fn host_cpus(h: &str) -> String {
    std::fs::read_to_string(state_dir().join(h).join("cpus"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn hosts_have_their_own_names_addresses_and_cpus() {
    let _g = hosts();
    let out = on(
        "host1",
        &[
            "sh",
            "-c",
            "hostname; getent hosts host0; grep Cpus_allowed_list /proc/self/status | cut -f2; pwd",
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "host1");
    assert!(lines[1].starts_with("10.77.0.10"), "{text}");
    assert_eq!(lines[2], host_cpus("host1"));
    assert_eq!(lines[3], env!("CARGO_MANIFEST_DIR"));
    // Two interfaces: eth0 reaches the other hosts, mgmt0 nothing.
    let ifs = on("host1", &["ip", "-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    let ifs = String::from_utf8_lossy(&ifs.stdout).to_string();
    assert!(
        ifs.contains("eth0    inet 10.77.0.11/24") || ifs.contains("eth0 inet 10.77.0.11/24"),
        "{ifs}"
    );
    assert!(ifs.contains("mgmt0"), "{ifs}");
    // host0 is reached only from the hosts, not from this machine.
    assert!(
        !Command::new("sh")
            .args(["-c", "exec 3<>/dev/tcp/10.77.0.10/6817"])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn srun_bind_places_each_task_on_its_own_hosts_cpus() {
    let _g = hosts();
    let b = bin();
    let show = "echo $(hostname) $SLURM_PROCID $LOCAL_RANK $RANK/$WORLD_SIZE $(grep Cpus_allowed_list /proc/self/status | cut -f2) $OMP_NUM_THREADS $MASTER_ADDR $MASTER_PORT";
    let out = on(
        "host0",
        &[
            "srun",
            "-N2",
            "-n4",
            &b,
            "bind",
            "--oversubscribe",
            "--",
            "sh",
            "-c",
            show,
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    lines.sort_by_key(|w| w[1].parse::<u32>().unwrap());
    assert_eq!(lines.len(), 4, "{text}");
    let port = lines[0][7].clone();
    for (i, w) in lines.iter().enumerate() {
        let host = format!("host{}", i / 2);
        // Each host's own plan, computed there.
        let plan = on(&host, &[&b, "plan", "-n", "2", "--oversubscribe", "--json"])
            .output()
            .unwrap();
        let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
        let r = &plan["ranks"][i % 2];
        assert_eq!(w[0], host);
        assert_eq!(w[2], (i % 2).to_string());
        assert_eq!(w[3], format!("{i}/4"));
        assert_eq!(w[4], r["cpus"].as_str().unwrap());
        assert_eq!(w[4], host_cpus(&host), "each host's tasks on its own CPUs");
        assert_eq!(w[5], r["threads"].to_string());
        // MASTER_ADDR from the step's first node, one port for the job.
        assert_eq!(w[6], "host0");
        assert_eq!(w[7], port);
    }
    assert!((15000..25000).contains(&port.parse::<u32>().unwrap()));
}

#[test]
fn run_in_a_one_cpu_srun_task_names_cpus_per_task() {
    let _g = hosts();
    let out = on(
        "host0",
        &["srun", "-N1", "-n1", &bin(), "run", "-n", "2", "--", "true"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 ranks need 2 physical cores but only 1"),
        "{err}"
    );
    assert!(err.contains("srun --cpus-per-task=N"), "{err}");
}

pub(super) fn agent<'a>(endpoint: &'a str, script: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        bin(),
        "run".into(),
        "--nnodes".into(),
        "2".into(),
        "-n".into(),
        "2".into(),
        "--oversubscribe".into(),
        "--rdzv-endpoint".into(),
        endpoint.into(),
        "--grace".into(),
        "3".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["--".into(), "sh".into(), script.into()]);
    v
}

pub(super) fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn run_forms_one_job_across_hosts_and_stays_the_supervisor() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "exit 0");
    let logs = d.path().join("logs");
    let logs_s = logs.display().to_string();
    let a = agent("host0:29501", &s, &["--log-dir", &logs_s]);
    // host1 first: it waits for the endpoint's own node.
    let mut c1 = start("host1", &strs(&a), d.path(), "host1");
    std::thread::sleep(Duration::from_millis(300));
    let mut c0 = start("host0", &strs(&a), d.path(), "host0");
    assert_eq!(
        finish(&mut c0, Duration::from_secs(30)).0,
        0,
        "{}",
        read(d.path(), "host0")
    );
    assert_eq!(
        finish(&mut c1, Duration::from_secs(30)).0,
        0,
        "{}",
        read(d.path(), "host1")
    );
    for (h, ranks) in [("host0", [0, 1]), ("host1", [2, 3])] {
        let out = read(d.path(), h);
        // threadwise's own output: the node line (hosts as Slurm compacts
        // them), where each rank goes before any rank's output, prefixed global
        // ranks, the summary.
        assert!(
            out.contains(&format!(
                "{h}: node {} of 2 (host[0-1]), ranks {}-{} of 4, MASTER_ADDR=10.77.0.10",
                ranks[0] / 2,
                ranks[0],
                ranks[1]
            )),
            "{out}"
        );
        let placed = out
            .find(&format!(
                "threadwise: {h}: ranks {}-{}: cpus ",
                ranks[0], ranks[1]
            ))
            .unwrap_or_else(|| panic!("no placement line in {out}"));
        let first_rank = out.find("[rank ").unwrap();
        assert!(placed < first_rank, "the placement line comes first: {out}");
        assert!(out.contains("threadwise: 2 rank(s) in"), "{out}");
        for r in ranks {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("[rank {r}] {h} RANK={r} ")))
                .unwrap_or_else(|| panic!("no line of rank {r} in {out}"));
            assert!(
                line.contains(&format!(
                    "LOCAL_RANK={} GROUP_RANK={} WORLD_SIZE=4 MASTER=10.77.0.10:",
                    r % 2,
                    r / 2
                )),
                "{line}"
            );
            assert!(line.contains("IF=eth0"), "{line}");
            assert!(line.ends_with(&format!("CPUS={}", host_cpus(h))), "{line}");
        }
        // No torchrun banner: threadwise plans the threads.
        assert!(!out.contains("Setting OMP_NUM_THREADS"), "{out}");
        // Each node's logs in its own directory, with its own ranks' lines.
        let log = std::fs::read_to_string(logs.join(h).join("rank-1.stdout")).unwrap();
        assert!(log.starts_with(&format!("{h} RANK={} ", ranks[1])), "{log}");
    }
    // The agent is threadwise itself: its process is the one we started.
    let d2 = tempfile::tempdir().unwrap();
    let s2 = rank_script(d2.path(), "sleep 29502");
    let a2 = agent("host0:29502", &s2, &[]);
    let mut c0 = start("host0", &strs(&a2), d2.path(), "host0");
    let mut c1 = start("host1", &strs(&a2), d2.path(), "host1");
    until("the ranks", || d2.path().join("pid-3").exists());
    let pid = std::fs::read_to_string(d2.path().join("pid-3")).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    let ppid = status
        .lines()
        .find(|l| l.starts_with("PPid:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert_eq!(
        ppid,
        c1.id().to_string(),
        "rank 3's parent is host1's threadwise"
    );
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap();
    assert_eq!(comm.trim(), "threadwise");
    unsafe { libc::kill(c0.id() as i32, libc::SIGTERM) };
    let (code0, t0) = finish(&mut c0, Duration::from_secs(20));
    let (code1, _) = finish(&mut c1, Duration::from_secs(20));
    assert_eq!(
        (code0, code1),
        (143, 143),
        "{}{}",
        read(d2.path(), "host0"),
        read(d2.path(), "host1")
    );
    assert!(t0 < Duration::from_secs(5), "SIGTERM took {t0:?}");
    assert!(
        read(d2.path(), "host1")
            .contains("the job ended: host0: threadwise was stopped by SIGTERM")
    );
    until("no rank left", || leftovers("sleep 29502").is_empty());
}

#[test]
fn srun_starts_one_agent_per_host() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "exit 0");
    let mut a = vec![
        "srun".to_string(),
        "-N2".into(),
        "--ntasks-per-node=1".into(),
    ];
    a.extend(agent("host0:29503", &s, &[]));
    let out = on("host0", &strs(&a)).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for r in 0..4 {
        assert!(
            text.contains(&format!("[rank {r}] host{} RANK={r} ", r / 2)),
            "{text}"
        );
    }
    // Inside a Slurm job, with nothing configured, the agents knew each
    // other through MUNGE.
    assert!(
        text.contains("admits nodes that prove, through MUNGE") && !text.contains("is open"),
        "{text}"
    );
}

#[test]
fn tune_across_two_hosts_reads_rank_0_and_measures_each_node() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    // A client that measures itself: rank 0 (host0) is busy half of its
    // second, rank 1 (host1) all of it; each works out its own CPU % of its
    // wall time. Rank 0 prints its figure as the throughput, rank 1 appends
    // its figure to a file, one line per trial. Only global rank 0's figure
    // may be read; each node's CPU % must agree with its rank's own figure
    // (a rank per node, one CPU per host).
    let s = d.path().join("work.py");
    let own = d.path().join("rank1.txt");
    std::fs::write(
        &s,
        format!(
            "import os, time\n\
             t0, c0 = time.time(), time.process_time()\n\
             rank = int(os.environ['RANK'])\n\
             busy = 0.5 if rank == 0 else 1.0\n\
             while time.time() < t0 + busy: pass\n\
             time.sleep(1.0 - busy)\n\
             pct = 100 * (time.process_time() - c0) / (time.time() - t0)\n\
             if rank == 0: print(f'threadwise: throughput={{pct:.3f}} samples/s', flush=True)\n\
             else: open('{}', 'a').write(f'{{pct:.3f}}\\n')\n",
            own.display()
        ),
    )
    .unwrap();
    let json = d.path().join("tune.json");
    let out = on(
        "host0",
        &[
            "salloc",
            "-N2",
            "--exclusive",
            &bin(),
            "tune",
            "--nnodes",
            "2",
            "-n",
            "1",
            "--grid",
            "threads=1",
            "--runs",
            "2",
            "--max-runs",
            "2",
            "--export-json",
            json.to_str().unwrap(),
            "--",
            "python3",
            s.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2 node(s) (host0, host1), 1 rank(s) per node"),
        "{text}"
    );
    assert!(
        text.contains("per node:") && text.contains("CPU % host1"),
        "{text}"
    );
    assert!(text.contains("winner: "), "{text}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["hosts"], serde_json::json!(["host0", "host1"]));
    let mut trials: Vec<&serde_json::Value> = r["configs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["trials"].as_array().unwrap())
        .collect();
    trials.sort_by_key(|t| t["seq"].as_u64());
    let rank1: Vec<f64> = std::fs::read_to_string(&own)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(trials.len(), rank1.len(), "{rank1:?} {text}");
    for (t, r1) in trials.iter().zip(rank1) {
        assert_eq!(t["status"], "ok", "{t}");
        let r0 = t["throughput"].as_f64().unwrap();
        let cpu = |i: usize| t["nodes"][i]["cpu_util_pct"].as_f64().unwrap();
        // Rank 0's own figure (about 50), never rank 1's (about 100).
        assert!(r0 < 75.0, "{t}");
        // The node's figure includes the interpreter's start, which the
        // rank's own does not see: within 12 points.
        assert!(
            (cpu(0) - r0).abs() < 12.0,
            "host0 {} vs rank 0's own {r0}: {t}",
            cpu(0)
        );
        assert!(
            (cpu(1) - r1).abs() < 12.0,
            "host1 {} vs rank 1's own {r1}: {t}",
            cpu(1)
        );
        assert_eq!(t["nodes"][1]["host"], "host1");
    }
}

#[test]
fn tune_across_nodes_outside_an_allocation_says_how() {
    let out = super::threadwise()
        .env_remove("SLURM_JOB_ID")
        .args(["tune", "--nnodes", "2", "-n", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tune --nnodes 2 runs each trial through srun"),
        "{err}"
    );
    assert!(err.contains("salloc -N2"), "{err}");
}

#[test]
fn doctor_on_a_host_flags_an_interface_that_does_not_reach_master() {
    let _g = hosts();
    let run = |ifname: &str| {
        let out = on(
            "host1",
            &[
                "env",
                "MASTER_ADDR=host0",
                &format!("GLOO_SOCKET_IFNAME={ifname}"),
                &bin(),
                "doctor",
            ],
        )
        .output()
        .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // mgmt0 is the host's second interface, which reaches nothing.
    let bad = run("mgmt0");
    assert!(
        bad.contains("GLOO_SOCKET_IFNAME=mgmt0, but the rendezvous host is reached through eth0"),
        "{bad}"
    );
    assert!(bad.contains("export GLOO_SOCKET_IFNAME=eth0"), "{bad}");
    let good = run("eth0");
    assert!(
        !good.contains("but the rendezvous host is reached through"),
        "{good}"
    );
}

#[test]
fn test_hosts_refuses_clearly_without_root_or_a_count() {
    // nobody may not enter the clone (a mode-700 home or mktemp -d): it runs
    // a copy in a directory it can read.
    let copy = tempfile::tempdir().unwrap();
    let script_copy = copy.path().join("test-hosts.sh");
    std::fs::copy(script(), &script_copy).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(copy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&script_copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&script_copy)
        .args(["up", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("test-hosts: error: must run as root"), "{err}");
    for args in [&["up", "9"][..], &["exec", "host7", "true"], &["frob"]] {
        let out = Command::new(script()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("hint: "),
            "{args:?}"
        );
    }
}
