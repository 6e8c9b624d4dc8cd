//! `threadwise tune` end to end: the built-in workload, fake commands that print
//! throughput lines, failures, Ctrl-C, and the winner handed to `run --plan`.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("threadwise")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The configurations' names, in report order.
fn names(r: &Value) -> Vec<&str> {
    r["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

/// Every configuration present, medians within min-max; the winner the best
/// paired speed-up, or, in a tie, one of the tied that the rule prefers.
fn assert_consistent(r: &Value) {
    let configs = r["configs"].as_array().unwrap();
    // The rounds the reference was scored in: every other trial of those
    // rounds has its ratio (the extra rounds of undecided rows run without it).
    let reference_rounds: Vec<u64> = configs
        .iter()
        .find(|c| c["name"] == r["baseline"])
        .map(|c| {
            c["trials"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["status"] == "ok")
                .map(|t| t["round"].as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default();
    let a = &r["analysis"];
    assert!(
        a["model"]
            .as_str()
            .unwrap()
            .starts_with("log throughput = round + configuration"),
        "{a}"
    );
    assert!(
        a["df"].as_u64().is_some() && a["trials"].as_u64().unwrap() > 0,
        "{a}"
    );
    let mut best: Option<(f64, String)> = None;
    for c in configs {
        let t = &c["throughput"];
        if t.is_null() {
            continue;
        }
        let (med, lo, hi) = (
            t["median"].as_f64().unwrap(),
            t["min"].as_f64().unwrap(),
            t["max"].as_f64().unwrap(),
        );
        assert!(lo <= med && med <= hi, "{c}");
        assert_eq!(
            t["n"].as_u64().unwrap() as usize,
            c["trials"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["status"] == "ok")
                .count()
        );
        // Every scored trial of a round the reference ran carries its ratio
        // to the reference's trial, and its weight in the model.
        for t in c["trials"].as_array().unwrap() {
            if t["status"] == "ok" && reference_rounds.contains(&t["round"].as_u64().unwrap()) {
                assert!(t["ratio"].as_f64().is_some_and(|x| x > 0.0), "{t}");
            }
            if t["status"] == "ok" {
                assert!(
                    t["weight"].as_f64().is_some_and(|w| w > 0.0 && w <= 1.0),
                    "{t}"
                );
            }
        }
        let s = c["speedup"].as_f64().unwrap();
        if c["dropped_after_round"].is_null() && best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, c["name"].as_str().unwrap().to_string()));
        }
    }
    let best = best.map(|b| b.1);
    let winner = r["winner"].as_str();
    match r["tie"].as_object() {
        None => assert_eq!(winner, best.as_deref(), "no tie: the best speed-up wins"),
        Some(tie) => {
            let tied: Vec<&str> = tie["configs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect();
            assert_eq!(winner, Some(tied[0]), "{tie:?}");
            assert!(tied.contains(&best.as_deref().unwrap()), "{tie:?}");
        }
    }
}

#[test]
fn builtin_workload_report_is_complete_and_consistent() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("r.json");
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "2",
            "--runs",
            "2",
            "--work-seconds",
            "0.3",
            "--work-size",
            "8",
            "--export-json",
        ])
        .arg(&j)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = json(&j);
    assert_eq!(r["schema"], "threadwise.tune/1");
    assert_eq!(r["complete"], true);
    assert_eq!(r["unit"], "samples/s");
    assert_eq!(r["baseline"], "unset");
    let names = names(&r);
    for want in [
        "unset",
        "threads=4",
        "threads=2",
        "threads=1",
        "plan",
        "seed",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    for c in r["configs"].as_array().unwrap() {
        // Two each, or one for a row dropped after the first round (below
        // half of the best); a late combination of the plan's best axis
        // values gets its two beside the winner of the moment, which so gets
        // more.
        let n = c["trials"].as_array().unwrap().len();
        let cut = c["dropped_after_round"] == 0;
        assert!(n >= 2 || (cut && n == 1), "{}: {n}", c["name"]);
        assert!(
            c["trials"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["status"] == "ok"),
            "{c}"
        );
        assert!(c["cpu_util_pct"].as_f64().unwrap() > 0.0);
    }
    assert_consistent(&r);
    let table = text(&out.stdout);
    assert!(table.contains("winner"), "{table}");
}

/// A command whose throughput follows OMP_NUM_THREADS: 100 per thread, 50 unset.
const FAKE: &str = "case \"$OMP_NUM_THREADS\" in '') echo '50 img/s';; 3) echo 'bad thread count' >&2; exit 4;; *) echo \"$((OMP_NUM_THREADS * 100)) img/s\";; esac";

#[test]
fn metric_from_output_grid_configs_and_failures() {
    let d = tempfile::tempdir().unwrap();
    let (j, c, m, s) = (
        d.path().join("r.json"),
        d.path().join("r.csv"),
        d.path().join("r.md"),
        d.path().join("r.svg"),
    );
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "2",
            "--grid",
            "threads=1,2",
            "--config",
            "three=threads=3",
            "--export-json",
        ])
        .arg(&j)
        .arg("--export-csv")
        .arg(&c)
        .arg("--export-markdown")
        .arg(&m)
        .arg("--export-svg")
        .arg(&s)
        .args(["--", "sh", "-c", FAKE])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = json(&j);
    let by = |n: &str| {
        r["configs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(by("unset")["throughput"]["median"], 50.0);
    assert_eq!(by("threads=1")["throughput"]["median"], 100.0);
    assert_eq!(by("threads=2")["throughput"]["median"], 200.0);
    let speedup = by("threads=2")["speedup"].as_f64().unwrap();
    assert!((speedup - 4.0).abs() < 1e-9, "{speedup}");
    let three = by("three");
    assert!(three["throughput"].is_null());
    assert_eq!(three["trials"][0]["status"], "failed");
    assert!(
        three["trials"][0]["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 4")
    );
    assert_eq!(three["trials"][0]["stderr_tail"][0], "bad thread count");
    assert_eq!(r["winner"], "threads=2");
    assert_consistent(&r);
    let csv = std::fs::read_to_string(&c).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4 * 2);
    assert!(
        std::fs::read_to_string(&m)
            .unwrap()
            .contains("| threads=2 | 200.0 |")
    );
    assert!(std::fs::read_to_string(&s).unwrap().starts_with("<svg"));
    let table = text(&out.stdout);
    assert!(table.contains("three (2 failed)"), "{table}");
    assert!(table.contains("  | bad thread count"), "{table}");
}

#[test]
fn winner_plan_goes_to_run() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("plan.json");
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "1",
            "--grid",
            "threads=1,2",
            "--save-plan",
        ])
        .arg(&p)
        .args(["--", "sh", "-c", FAKE])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = Command::new(bin())
        .args(["run", "-q", "--no-prefix", "--plan"])
        .arg(&p)
        .args(["--", "sh", "-c", "echo $OMP_NUM_THREADS"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "2\n");
    std::fs::write(&p, "{\"schema\": \"nope\"}").unwrap();
    let out = Command::new(bin())
        .args(["run", "--plan"])
        .arg(&p)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is not a threadwise.plan/1 document"));
}

#[test]
fn interrupted_tune_leaves_valid_partial_files() {
    let d = tempfile::tempdir().unwrap();
    let (j, c) = (d.path().join("r.json"), d.path().join("r.csv"));
    let mut cmd = Command::new(bin());
    super::default_signals(&mut cmd);
    let child = cmd
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "50",
            "--grid",
            "threads=1,2",
            "--export-json",
        ])
        .arg(&j)
        .arg("--export-csv")
        .arg(&c)
        .args(["--", "sh", "-c", "sleep 0.2; echo '10 img/s'"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The CSV is rewritten after every trial: interrupt once two are in.
    super::wait_for("two trials exported", Duration::from_secs(30), || {
        std::fs::read_to_string(&c).is_ok_and(|s| s.lines().count() > 2)
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    let r = json(&j);
    assert_eq!(r["complete"], false);
    let trials: usize = r["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["trials"].as_array().unwrap().len())
        .sum();
    assert!(trials >= 2, "{trials} trials kept");
    let csv = std::fs::read_to_string(&c).unwrap();
    assert_eq!(csv.lines().count(), 1 + trials, "{csv}");
    assert_eq!(r["warnings"][0]["kind"], "interrupted", "{}", r["warnings"]);
}

#[test]
fn tune_errors_name_the_input() {
    let fails = |args: &[&str], needle: &str| {
        let out = Command::new(bin()).arg("tune").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    fails(&["--runs", "0"], "--runs <RUNS>");
    fails(&["--timeout", "1e300"], "give seconds from");
    fails(&["--timeout", "nan"], "give seconds from");
    fails(&["--work-layers", "0"], "--work-layers");
    // Each size fits, together they do not: refused before any trial.
    fails(
        &["--work-size", "1024", "--work-batch", "4096"],
        "would hold 4194304 MiB of activations per rank",
    );
    fails(&["--metric", "(a)(b)"], "exactly one capture group");
    fails(&["--grid", "colour=red"], "unknown key \"colour\"");
    fails(&["--grid", "threads=0"], "0 threads");
    fails(&["--config", "big=workers=99999999"], "at most 8192");
    fails(&["--config", "x"], "expected NAME=key=value");
    fails(&["-n", "4096"], "4096 ranks need 4096 physical cores");
    fails(&["--", "no-such-command-xyz"], "command not found");
}

#[test]
fn a_trial_that_times_out_is_reported_and_the_others_go_on() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("r.json");
    // threads=2 hangs; the others answer at once.
    let script =
        "[ \"$OMP_NUM_THREADS\" = 2 ] && { echo stuck >&2; exec sleep 30; }; echo '10 img/s'";
    let t = std::time::Instant::now();
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "1",
            "--timeout",
            "0.5",
            "--grid",
            "threads=1,2",
            "--export-json",
        ])
        .arg(&j)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let r = json(&j);
    let by = |n: &str| {
        r["configs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .unwrap()
            .clone()
    };
    let stuck = by("threads=2");
    assert_eq!(stuck["trials"][0]["status"], "timeout");
    assert_eq!(stuck["trials"][0]["stderr_tail"][0], "stuck");
    assert_eq!(by("threads=1")["trials"][0]["status"], "ok");
    assert_eq!(r["winner"], "threads=1");
    assert!(
        text(&out.stdout).contains("threads=2 round 0: timeout (timed out)"),
        "{}",
        text(&out.stdout)
    );
}

/// A script that prints its speed as the torchvision reference scripts do
/// (`lr: 0.1  img/s: N`) next to numbers that belong to other keys, and says
/// whether it saw threadwise's variables. The default rules and an explicit
/// --metric must agree on every value and the winner; the unset baseline must
/// see no THREADWISE_* variable, as under torchrun.
const TORCHVISION: &str = r#"
t=${OMP_NUM_THREADS:-8}
w=${THREADWISE_NUM_WORKERS:-none}
echo "workers=$w threads=$t"
echo "Epoch: [0]  [ 40/391]  eta: 0:01:02  lr: 0.1  img/s: $((100 + t * 10)).5  loss: 6.91 (6.93)"
echo "THREADWISE vars: $(env | grep -c '^THREADWISE_')"
"#;

fn tune_json(dir: &std::path::Path, extra: &[&str], script: &str) -> serde_json::Value {
    let j = dir.join(format!("r{}.json", extra.len()));
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "1",
            "--grid",
            "threads=unset,1,2",
            "--export-json",
        ])
        // threads=unset is the baseline itself: measured once, as "unset".
        .arg(&j)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    json(&j)
}

#[test]
fn default_rules_read_the_same_values_as_an_explicit_metric() {
    let d = tempfile::tempdir().unwrap();
    let by_default = tune_json(d.path(), &[], TORCHVISION);
    let explicit = tune_json(d.path(), &["--metric", r"img/s: ([0-9.]+)"], TORCHVISION);
    let values = |r: &serde_json::Value| -> Vec<(String, f64)> {
        r["configs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["throughput"]["median"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(values(&by_default), values(&explicit));
    assert_eq!(by_default["winner"], explicit["winner"]);
    assert_eq!(by_default["unit"], "img/s");
    // unset: 8 threads by the script's own default -> 180.5; threads=2 -> 120.5.
    let v = values(&by_default);
    assert_eq!(v[0], ("unset".to_string(), 180.5), "{v:?}");
    assert_eq!(v.len(), 3, "{v:?}");
    assert_eq!(v[2], ("threads=2".to_string(), 120.5), "{v:?}");
    // Every report says where the value came from.
    let unset = &by_default["configs"][0];
    assert_eq!(unset["read_from"]["unit"], "img/s");
    assert!(
        unset["read_from"]["line"]
            .as_str()
            .unwrap()
            .contains("lr: 0.1  img/s: 180.5")
    );
    assert_eq!(unset["trials"][0]["hit"]["rank"], 0);
}

#[test]
fn the_unset_baseline_has_nothing_of_the_plan() {
    let d = tempfile::tempdir().unwrap();
    let script = "echo \"$(env | grep -c '^THREADWISE_') vars, ${OMP_NUM_THREADS:-no} omp, $(grep Cpus_allowed_list /proc/self/status | cut -f2) cpus: 1 img/s\"";
    let r = tune_json(d.path(), &[], script);
    let line = |i: usize| {
        r["configs"][i]["read_from"]["line"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let all = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    assert!(
        line(0).starts_with(&format!("0 vars, no omp, {} cpus", all.trim())),
        "unset: {}",
        line(0)
    );
    assert!(
        !line(1).starts_with("0 vars"),
        "threads=1 carries the plan: {}",
        line(1)
    );
}

#[test]
fn trials_without_a_metric_are_counted_not_scored() {
    let d = tempfile::tempdir().unwrap();
    // threads=2 prints no rate at all: its trial is "no-metric", unscored.
    let script = "[ \"$OMP_NUM_THREADS\" = 2 ] && echo 'done, loss 0.3' || echo '50 samples/s'";
    let r = tune_json(d.path(), &[], script);
    let two = r["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "threads=2")
        .unwrap();
    assert_eq!(two["trials"][0]["status"], "no-metric", "{two}");
    assert!(two["throughput"].is_null());
    assert_eq!(r["metric"], "output");
    assert_eq!(r["unit"], "samples/s");
}

#[test]
fn configurations_that_launch_alike_run_once() {
    // `threads=auto` and the count it resolves to here are two requests and
    // one launch: measured once, under the first name.
    let plan = Command::new(bin())
        .args(["plan", "-n", "1", "--format", "json"])
        .output()
        .unwrap();
    let p: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let auto = p["ranks"][0]["threads"].as_u64().unwrap();
    let d = tempfile::tempdir().unwrap();
    let (calls, j) = (d.path().join("calls"), d.path().join("r.json"));
    let out = Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "2",
            "--max-runs",
            "2",
            "--grid",
        ])
        .arg(format!("threads=auto,{auto},{}", auto + 1))
        .arg("--export-json")
        .arg(&j)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo \"$OMP_NUM_THREADS\" >> {}; echo '5 img/s'",
            calls.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = json(&j);
    let names = names(&r);
    let (first, again) = ("threads=auto".to_string(), format!("threads={auto}"));
    assert_eq!(
        names,
        ["unset", first.as_str(), &format!("threads={}", auto + 1)]
    );
    assert_eq!(r["configs"][1]["same_launch"], serde_json::json!([again]));
    // unset, auto and auto+1, two runs each: six launches, not eight.
    let launched = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(launched.lines().count(), 6, "{launched}");
    assert!(
        text(&out.stdout).contains(&format!("threads=auto: launches exactly as {again}")),
        "{}",
        text(&out.stdout)
    );
}

/// The simulation's model as a real client: a true speed per configuration
/// (unset 50, threads=1 100, threads=2 110 img/s), the machine 1.5x faster
/// from the 10th trial on, and +-2% of noise. Rounds as the model's blocks
/// keep the speed-ups true, the step is reported, the order comes from the seed.
#[test]
fn a_client_on_a_drifting_machine_gets_paired_speedups_and_a_drift_warning() {
    let d = tempfile::tempdir().unwrap();
    let (count, j) = (d.path().join("count"), d.path().join("r.json"));
    let client = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); echo $((n + 1)) > {c}; \
         awk -v n=\"$n\" -v t=\"${{OMP_NUM_THREADS:-unset}}\" 'BEGIN {{ \
           v = (t == \"unset\") ? 50 : (t == 1 ? 100 : 110); \
           if (n >= 9) v *= 1.5; \
           v *= 1 + 0.02 * ((n * 7) % 5 - 2) / 2; \
           printf \"threadwise: throughput=%.3f img/s\\n\", v }}'",
        c = count.display()
    );
    let out = Command::new(bin())
        .args(["tune", "-n", "1", "--runs", "5", "--seed", "42"])
        .args(["--grid", "threads=1,2", "--export-json"])
        .arg(&j)
        .args(["--", "sh", "-c", &client])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = json(&j);
    let table = text(&out.stdout);
    assert_eq!(r["order_seed"], 42);
    assert!(table.contains("shuffled from seed 42"), "{table}");
    // The step: found, and said once.
    let drift = r["drift"]["ratio"].as_f64().expect("drift reported");
    assert!((1.35..1.65).contains(&drift), "{drift}");
    assert!(
        table.contains("the machine's speed moved")
            && table.contains("each round is a block of the model"),
        "{table}"
    );
    // The speed-ups stay true across the step: 2.0 and 2.2.
    let speedup = |name: &str| {
        r["configs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()["speedup"]
            .as_f64()
            .unwrap()
    };
    assert!(
        (speedup("threads=1") - 2.0).abs() < 0.1,
        "{}",
        speedup("threads=1")
    );
    assert!(
        (speedup("threads=2") - 2.2).abs() < 0.11,
        "{}",
        speedup("threads=2")
    );
    assert_eq!(r["winner"], "threads=2");
    assert_consistent(&r);
}
