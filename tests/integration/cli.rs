//! The command line's contracts: formats, errors that name the input and say
//! what to do, exit codes.

use super::threadwise;

fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let out = threadwise().args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn impossible_requests_name_what_is_short() {
    let s = ["plan", "--synthetic", "package:1 core:4 pu:2"];
    fn with<'a>(s: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [s, extra].concat()
    }
    fails(
        &with(&s, &["-n", "5"]),
        2,
        &[
            "error: 5 ranks need 5 physical cores but only 4 are allowed (0-7)",
            "hint: ",
        ],
    );
    fails(&with(&s, &["-n", "0"]), 2, &["at least 1"]);
    fails(
        &with(&s, &["--gpus", "3"]),
        2,
        &["GPU 3 does not exist: 0 GPUs are visible"],
    );
    fails(&with(&s, &["-n", "gpu"]), 2, &["no GPU is visible"]);
    fails(&with(&s, &["-n", "1000000000"]), 2, &["at most 8192"]);
    fails(
        &with(&s, &["-n", "18446744073709551615"]),
        2,
        &["at most 8192"],
    );
    fails(
        &with(&s, &["--threads", "18446744073709551615"]),
        2,
        &["at most 8192"],
    );
    fails(&with(&s, &["--gpus", ""]), 2, &["an empty list"]);
    fails(
        &with(&s, &["--reserve", "lots"]),
        2,
        &["expected none, a number"],
    );
    fails(
        &with(&s, &["--reserve", "4"]),
        2,
        &["keeps every allowed CPU (0-7)", "hint: reserve fewer"],
    );
    // Files that are not topologies: refused at once, never read forever.
    fails(
        &["topo", "--topology", "/dev/zero"],
        3,
        &["not a regular file"],
    );
    fails(
        &["topo", "--topology", "/dev/urandom"],
        3,
        &["not a regular file"],
    );
    fails(
        &["plan", "--synthetic", "core:4 gpu:2", "-n", "3"],
        2,
        &["3 ranks but only 2 GPUs"],
    );
    fails(
        &["plan", "--synthetic", "core:4 allowed:9"],
        2,
        &["allowed set is empty"],
    );
    fails(
        &with(&s, &["-n", "x"]),
        2,
        &["\"x\": expected a number, gpu, cpu or auto"],
    );
    fails(
        &with(&s, &["--policy", "bogus"]),
        2,
        &["invalid value 'bogus'"],
    );
    fails(
        &with(&s, &["--threads", "0"]),
        2,
        &["0 threads: give at least 1, or auto"],
    );
    fails(
        &["run", "--master-port", "0", "--", "true"],
        2,
        &["--master-port"],
    );
    fails(&["tune", "--work-size", "0"], 2, &["--work-size"]);
    fails(&["tune", "--margin", "80"], 2, &["--margin", "0-50"]);
    fails(
        &["tune", "--margin", "five"],
        2,
        &["--margin", "percentage"],
    );
    // Two ranks: which one's? (One rank needs no --local-rank: issue 53.)
    fails(
        &with(&s, &["-n", "2", "--format", "env"]),
        2,
        &["--format env needs --local-rank K (0-1)"],
    );
    fails(
        &with(&s, &["--format", "env", "--local-rank", "9"]),
        2,
        &["--local-rank 9 is out of range"],
    );
    fails(
        &["topo", "--root", "/nonexistent"],
        3,
        &["/nonexistent is not a topology root", "hint: "],
    );
    // A description typed on the command line is a usage error (2); a dump
    // or export stands for a machine (3): docs/reference/exit-codes.md's rule.
    fails(
        &["topo", "--synthetic", "core:0"],
        2,
        &["invalid synthetic topology"],
    );
    fails(
        &["plan", "--synthetic", "garbage"],
        2,
        &["is not key:value"],
    );
    fails(
        &["run", "--plan", "/nonexistent", "--", "true"],
        2,
        &["cannot read --plan /nonexistent"],
    );
    fails(
        &["topo", "--topology", "/nonexistent.xml"],
        3,
        &["cannot read /nonexistent.xml"],
    );
}

#[test]
fn oversubscribe_lets_a_user_insist() {
    let out = threadwise()
        .args([
            "plan",
            "--synthetic",
            "core:2",
            "-n",
            "4",
            "--oversubscribe",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpus: Vec<&str> = p["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cpus"].as_str().unwrap())
        .collect();
    assert_eq!(cpus, ["0", "1", "0", "1"]);
}

#[test]
fn cuda_visible_devices_uuid_on_a_machine_without_gpus_plans_cpu_ranks() {
    // UUIDs are resolved now (tests/integration/gpus.rs); with no GPU on the
    // bus there is nothing to resolve and the plan is a CPU plan.
    let out = threadwise()
        .env("CUDA_VISIBLE_DEVICES", "GPU-8f6c1a2b")
        .args(["plan", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["ranks"][0]["gpu"].is_null(), "{v}");
}

#[test]
fn env_format_is_shell_source() {
    let out = threadwise()
        .args([
            "plan",
            "--synthetic",
            "core:4",
            "-n",
            "2",
            "--format",
            "env",
            "--local-rank",
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("export OMP_NUM_THREADS=2\n"), "{text}");
    assert!(text.contains("export THREADWISE_CPUS=2-3\n"), "{text}");
    // A shell evaluating it gets the values back.
    let sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{text}\necho \"$THREADWISE_CPUS/$MKL_NUM_THREADS/$CUDA_DEVICE_ORDER\""
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sh.stdout).trim(),
        "2-3/2/PCI_BUS_ID"
    );
}

#[test]
fn taskset_lines_run_for_real() {
    let out = threadwise()
        .args([
            "plan",
            "-n",
            "1",
            "--format",
            "taskset",
            "--",
            "sh",
            "-c",
            "grep Cpus_allowed_list /proc/self/status; echo $OMP_NUM_THREADS",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let run = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&run.stdout);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let n = threadwise::CpuSet::parse_list(&online).unwrap().len();
    assert!(
        got.contains(&format!("Cpus_allowed_list:\t0-{}", n - 1)) || n == 1,
        "{line}\n{got}"
    );
    assert!(got.trim_end().ends_with(&n.to_string()), "{got}");
}

#[test]
fn topo_human_view_of_this_machine() {
    let out = threadwise().arg("topo").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("machine: "), "{text}");
    assert!(text.contains("numa node 0: cpus "), "{text}");
    assert!(text.contains("allowed: "), "{text}");
    // Every allowed core of this machine is drawn, as [cpus].
    let t: serde_json::Value = serde_json::from_slice(
        &threadwise()
            .args(["topo", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for c in t["cores"].as_array().unwrap() {
        let cell = format!("[{}]", c["cpus"].as_str().unwrap());
        assert!(text.contains(&cell), "{cell} missing:\n{text}");
    }
}

/// The whole tree, on machines that do not change: a DGX-like server with a
/// cpuset and quota, and a hybrid CPU with an idle core outside the cpuset.
#[test]
fn topo_human_view_snapshots() {
    let view = |desc: &str| {
        super::stdout_ok(
            threadwise()
                .args(["topo", "--synthetic", desc])
                .output()
                .unwrap(),
        )
    };
    insta::assert_snapshot!(
        "topo_dgx",
        view("package:2 numa:4 l3:4 core:4 pu:2 gpu-nodes:3,3,1,1,7,7,5,5 nic:4 mem:64G")
    );
    insta::assert_snapshot!(
        "topo_small_limited",
        view("package:1 numa:2 core:4 pu:2 allowed:0-5 quota:2.5")
    );
}

#[test]
fn completions_and_man_page_come_from_the_cli() {
    for shell in ["bash", "zsh", "fish"] {
        let out = threadwise().args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let s = String::from_utf8(out.stdout).unwrap();
        for word in ["tune", "nproc-per-node", "export-json", "policy"] {
            assert!(s.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = threadwise().arg("man").output().unwrap();
    assert!(out.status.success());
    let man = String::from_utf8(out.stdout).unwrap();
    assert!(
        man.starts_with(".ie") || man.contains(".TH threadwise"),
        "{}",
        &man[..200]
    );
    assert!(man.contains("topo") && man.contains("bind"));
    let out = threadwise().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Every subcommand has its own page, and the page names every flag its
/// --help has; `--dir` writes them all as a packager installs them; an
/// unknown page is a usage error naming the pages there are.
#[test]
fn a_man_page_per_subcommand_names_every_flag_of_its_help() {
    let subs = [
        "topo",
        "plan",
        "run",
        "bind",
        "tune",
        "doctor",
        "top",
        "completions",
    ];
    let flag = |s: &str| -> std::collections::BTreeSet<String> {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2 && w.as_bytes()[2].is_ascii_lowercase())
            .map(|w| w.trim_end_matches('-').to_string())
            .collect()
    };
    for sub in subs {
        let help = threadwise().args([sub, "--help"]).output().unwrap();
        let out = threadwise().args(["man", sub]).output().unwrap();
        assert!(out.status.success(), "man {sub}");
        let man = String::from_utf8(out.stdout).unwrap().replace("\\-", "-");
        assert!(
            man.contains(&format!(".TH threadwise-{sub} 1")),
            "{sub}: {}",
            &man[..200]
        );
        // Flags the help text names in its own prose may be another command's
        // (`--no-python` in run's help of torchrun): only the options list.
        let help = String::from_utf8(help.stdout).unwrap();
        let options = help.split("Options:").nth(1).unwrap_or("");
        let want: Vec<String> = options
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .flat_map(|l| {
                flag(
                    l.split("  ")
                        .find(|p| p.trim_start().starts_with('-'))
                        .unwrap_or(""),
                )
            })
            .collect();
        assert!(
            !want.is_empty() || sub == "completions",
            "{sub}: no flags in\n{help}"
        );
        for f in want {
            assert!(man.contains(&f), "threadwise man {sub} lacks {f}");
        }
    }
    let d = tempfile::tempdir().unwrap();
    let out = threadwise()
        .arg("man")
        .arg("--dir")
        .arg(d.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut files: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.contains(&"threadwise.1".to_string()));
    for sub in subs {
        assert!(files.contains(&format!("threadwise-{sub}.1")), "{files:?}");
    }
    assert!(!files.iter().any(|f| f.contains("watchdog")), "{files:?}");
    let bad = threadwise().args(["man", "nope"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let e = String::from_utf8(bad.stderr).unwrap();
    assert!(e.contains("no page for") && e.contains("run, bind"), "{e}");
}

#[test]
fn plan_json_has_the_contract_fields() {
    let out = threadwise()
        .args(["plan", "--synthetic", "package:2 core:4 gpu:2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["schema"], "threadwise.plan/1");
    assert_eq!(p["request"]["policy"], "exclusive");
    for r in p["ranks"].as_array().unwrap() {
        for f in [
            "local_rank",
            "cpus",
            "mem_nodes",
            "gpu",
            "threads",
            "workers",
            "env",
            "reasons",
        ] {
            assert!(r.get(f).is_some(), "rank lacks {f}: {r}");
        }
    }
    assert_eq!(p["ranks"][1]["gpu"], "0000:02:00.0");
    assert_eq!(p["ranks"][1]["mem_nodes"], serde_json::json!([1]));
}

/// A library planted in a directory others can write (or at a path with a
/// space) is never preloaded; the plan says which one it chose and why.
#[test]
fn planted_allocators_are_not_preloaded() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let env = d.path().join("my env");
    std::fs::create_dir_all(env.join("lib")).unwrap();
    std::fs::write(env.join("lib/libjemalloc.so.2"), b"not a library").unwrap();
    let open = d.path().join("open");
    std::fs::create_dir_all(open.join("lib")).unwrap();
    std::fs::set_permissions(open.join("lib"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(open.join("lib/libjemalloc.so.2"), b"not a library").unwrap();
    for (var, dir) in [
        ("VIRTUAL_ENV", &env),
        ("CONDA_PREFIX", &open),
        ("VIRTUAL_ENV", &d.path().join("rel")),
    ] {
        let value = if var == "VIRTUAL_ENV" && dir.ends_with("rel") {
            "relative/env".into()
        } else {
            dir.display().to_string()
        };
        let out = threadwise()
            .args(["plan", "-n", "1", "--allocator", "jemalloc", "--json"])
            .env(var, &value)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "needs the system's libjemalloc2 (scripts/test.sh installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p: serde_json::Value = serde_json::from_str(&super::stdout_ok(out)).unwrap();
        let pre = p["ranks"][0]["env"]["LD_PRELOAD"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            pre.starts_with("/usr/lib") || pre.starts_with("/lib"),
            "{var}={value}: {pre}"
        );
        let reasons = p["ranks"][0]["reasons"].to_string() + &p["reasons"].to_string();
        assert!(reasons.contains(&format!("LD_PRELOAD={pre}")), "{reasons}");
        if !value.starts_with("relative") {
            assert!(reasons.contains("not preloaded"), "{var}: {reasons}");
        }
    }
}

#[test]
fn reserve_narrows_what_ranks_get() {
    let out = super::stdout_ok(
        threadwise()
            .args([
                "plan",
                "-n",
                "2",
                "--reserve",
                "cpus:0",
                "--synthetic",
                "core:5",
                "--json",
            ])
            .output()
            .unwrap(),
    );
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["ranks"][0]["cpus"], "1-2");
    assert_eq!(p["ranks"][1]["cpus"], "3-4");
    assert_eq!(p["request"]["reserve"], "cpus:0");
    // bind under torchrun re-plans from the same options.
    let line = super::stdout_ok(
        threadwise()
            .args([
                "plan",
                "-n",
                "2",
                "--reserve",
                "1",
                "--synthetic",
                "core:5",
                "--format",
                "torchrun",
                "--",
                "python",
                "t.py",
            ])
            .output()
            .unwrap(),
    );
    assert!(line.contains("--reserve 1"), "{line}");
}

/// Every variable `plan`, `run --dry-run` (one node and two) and `bind
/// --dry-run` export is in docs/reference/environment.md, and every name
/// there is in the source: the list cannot drift either way.
#[test]
fn every_exported_variable_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("docs/reference/environment.md")).unwrap();
    let mut names = std::collections::BTreeSet::new();
    let jemalloc = [
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    for (machine, extra) in [
        (
            "package:1 core:8 gpu:2",
            vec!["--gpus", "0,1", "--omp-bind", "--omp-wait", "passive"],
        ),
        (
            "package:2 numa:2 core:4 pu:2",
            vec!["--omp-wait", "active", "--roles"],
        ),
        (
            "package:1 core:4",
            if jemalloc {
                vec!["--allocator", "jemalloc"]
            } else {
                vec![]
            },
        ),
    ] {
        let out = threadwise()
            .args(["plan", "--synthetic", machine, "-n", "2", "--json"])
            .args(&extra)
            .output()
            .unwrap();
        let p: serde_json::Value = serde_json::from_str(&super::stdout_ok(out)).unwrap();
        for r in p["ranks"].as_array().unwrap() {
            names.extend(r["env"].as_object().unwrap().keys().cloned());
        }
    }
    let dry_runs: [&[&str]; 3] = [
        &["run", "-n", "2", "--dry-run", "--", "true"],
        &[
            "run",
            "-n",
            "1",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "localhost:29400",
            "--dry-run",
            "--",
            "true",
        ],
        &[
            "bind",
            "--local-rank",
            "0",
            "--local-world-size",
            "2",
            "--dry-run",
            "--",
            "true",
        ],
    ];
    for args in dry_runs {
        let dry = threadwise()
            .args(args)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .output()
            .unwrap();
        for l in String::from_utf8_lossy(&dry.stdout).lines() {
            if let Some((k, _)) = l.strip_prefix("  ").and_then(|l| l.split_once('=')) {
                if k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    names.insert(k.to_string());
                }
            }
        }
    }
    for must in [
        "OMP_NUM_THREADS",
        "RANK",
        "TORCHELASTIC_ERROR_FILE",
        "GLOO_SOCKET_IFNAME",
        "OMP_PLACES",
        "KMP_BLOCKTIME",
    ] {
        assert!(names.contains(must), "{must} not exported: {names:?}");
    }
    if jemalloc {
        assert!(
            names.contains("MALLOC_CONF") && names.contains("LD_PRELOAD"),
            "{names:?}"
        );
    }
    let word = |text: &str, n: &str| {
        text.match_indices(n).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + n.len()..].chars().next();
            let edge = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            edge(before) && edge(after)
        })
    };
    let missing: Vec<&String> = names.iter().filter(|n| !word(&docs, n)).collect();
    assert!(
        missing.is_empty(),
        "exported but not in docs/reference/environment.md: {missing:?}"
    );
    // The other way: every `NAME` in the reference is a string in the source.
    let mut source = String::new();
    fn walk(dir: &std::path::Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    walk(&root.join("src"), &mut source);
    // torchrun's PET_ variables are named from each option's clap definition
    // (cli/pet.rs): the binary's own `run --help` says them.
    let help = threadwise().args(["run", "--help"]).output().unwrap();
    for var in String::from_utf8_lossy(&help.stdout)
        .split("[env: ")
        .skip(1)
    {
        let name = var.split('=').next().unwrap_or("");
        source.push_str(&format!("\"{name}\""));
    }
    let documented: Vec<&str> = docs
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.len() > 3
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert!(documented.len() > 60, "{documented:?}");
    let stale: Vec<&&str> = documented
        .iter()
        .filter(|n| !source.contains(&format!("\"{n}\"")) && !source.contains(&format!("\"{n}=")))
        .collect();
    assert!(
        stale.is_empty(),
        "in docs/reference/environment.md but not in src/: {stale:?}"
    );
}

/// The README's placement picture is the binary's: its lines are the first
/// lines `threadwise plan` draws for the command the README names under it.
#[test]
fn the_readme_picture_is_what_the_binary_draws() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let start = readme.find("```\n8 rank(s)").expect("the picture block") + 4;
    let block: Vec<&str> = readme[start..]
        .split("\n```")
        .next()
        .unwrap()
        .lines()
        .filter(|l| *l != "...")
        .collect();
    let cmd = readme[start..]
        .split("(`threadwise ")
        .nth(1)
        .and_then(|r| r.split("`)").next())
        .expect("the command under the picture");
    let desc = cmd
        .split("--synthetic \"")
        .nth(1)
        .unwrap()
        .trim_end_matches('"');
    let n = cmd.split("-n ").nth(1).unwrap().split(' ').next().unwrap();
    let out = threadwise()
        .args(["plan", "-n", n, "--picture", "--synthetic", desc])
        .output()
        .unwrap();
    assert!(out.status.success());
    let drawn = String::from_utf8(out.stdout).unwrap();
    let drawn: Vec<&str> = drawn.lines().collect();
    assert_eq!(block, drawn[..block.len()], "README.md's picture");
}

/// `run --help` is grouped under headings, and `-h` is the short form: fewer
/// lines, the everyday flags, and a pointer to `--help`.
#[test]
fn run_help_is_grouped_and_h_is_short() {
    let long = String::from_utf8(
        threadwise()
            .args(["run", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for heading in [
        "Placement:",
        "Launch:",
        "Output:",
        "Multi-node:",
        "torchrun's command line:",
    ] {
        assert!(
            long.lines().any(|l| l == heading),
            "no {heading} in\n{long}"
        );
    }
    let short =
        String::from_utf8(threadwise().args(["run", "-h"]).output().unwrap().stdout).unwrap();
    assert!(short.lines().count() * 2 < long.lines().count(), "{short}");
    assert!(short.contains("see more with '--help'"), "{short}");
    for everyday in [
        "--nproc-per-node",
        "--dry-run",
        "--log-dir",
        "--nnodes",
        "--rdzv-endpoint",
    ] {
        assert!(short.contains(everyday), "-h lacks {everyday}");
    }
    assert!(!short.contains("--rdzv-conf") && long.contains("--rdzv-conf"));
}

/// `--synthetic`, `--root` and `--topology` preview run, bind and tune on
/// another machine with `--dry-run`; without it they are refused by name
/// (ranks can only start here), exit 2, and nothing starts.
#[test]
fn run_bind_and_tune_preview_another_machine_only_with_dry_run() {
    let machine = "package:2 numa:2 l3:2 core:8 pu:2";
    let dir = super::scratch();
    let marker = dir.path().join("started");
    let touch = format!("touch {}", marker.display());
    for args in [
        vec![
            "run",
            "-n",
            "8",
            "--synthetic",
            machine,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "bind",
            "--synthetic",
            machine,
            "--local-rank",
            "0",
            "--local-world-size",
            "8",
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "tune",
            "-n",
            "2",
            "--synthetic",
            machine,
            "--runs",
            "1",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ] {
        let out = threadwise().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--synthetic without --dry-run"), "{err}");
        assert!(!marker.exists(), "{args:?} started its command");
    }
    // With --dry-run: each rank's CPUs on that machine (16 CPUs each).
    let out = threadwise()
        .args([
            "run",
            "-n",
            "8",
            "--dry-run",
            "--synthetic",
            machine,
            "--",
            "python",
            "train.py",
        ])
        .output()
        .unwrap();
    let text = super::stdout_ok(out);
    assert!(text.contains("56-63,120-127"), "rank 7's CPUs: {text}");
    let out = threadwise()
        .args([
            "bind",
            "--dry-run",
            "--synthetic",
            machine,
            "--local-rank",
            "7",
            "--local-world-size",
            "8",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("56-63,120-127"), "{text}");
}

/// `tune --dry-run` lists every configuration with its placement and the
/// trials they take, writes no report file and runs nothing.
#[test]
fn tune_dry_run_lists_the_configurations_and_runs_nothing() {
    let dir = super::scratch();
    let json = dir.path().join("r.json");
    let marker = dir.path().join("started");
    let out = threadwise()
        .current_dir(dir.path())
        .args([
            "tune",
            "-n",
            "4",
            "--dry-run",
            "--synthetic",
            "package:1 core:8",
            "--runs",
            "3",
        ])
        .args([
            "--grid",
            "threads=1,2",
            "policy=none,exclusive",
            "--export-json",
        ])
        .arg(&json)
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .output()
        .unwrap();
    let text = super::stdout_ok(out);
    // unset, then the four grid points: 5 x 3 = 15 trials.
    assert!(
        text.contains("5 configuration(s) x 3 round(s) = 15 trials"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("threads=2 policy=exclusive"))
        .unwrap_or_else(|| panic!("{text}"));
    // 8 cores, 4 ranks: two cores each.
    assert!(row.contains("0-1 | 2-3 | 4-5 | 6-7"), "{row}");
    assert!(!json.exists() && !marker.exists());
}

/// Every option of every man page says what it does (options `-h` leaves
/// out included: a page is the long form), and `.TH` names the version.
#[test]
fn every_man_page_option_has_a_body_and_the_page_its_version() {
    for sub in ["topo", "plan", "run", "bind", "tune", "doctor", "top"] {
        let out = threadwise().args(["man", sub]).output().unwrap();
        let page = String::from_utf8(out.stdout).unwrap();
        let th = page.lines().find(|l| l.starts_with(".TH ")).unwrap();
        assert!(
            th.contains(&format!("threadwise {}", env!("CARGO_PKG_VERSION"))),
            "{sub}: {th}"
        );
        let lines: Vec<&str> = page.lines().collect();
        let mut options = 0;
        for (i, l) in lines.iter().enumerate() {
            if *l != ".TP" || !lines.get(i + 1).is_some_and(|o| o.starts_with("\\fB\\-")) {
                continue;
            }
            options += 1;
            let body = lines.get(i + 2).copied().unwrap_or("");
            assert!(
                !body.is_empty() && !body.starts_with('.'),
                "{sub}: {} has no body",
                lines[i + 1]
            );
        }
        assert!(options > 3, "{sub}: {options} options");
    }
}

/// The argument parser's errors have the one shape of every error
/// (docs/reference/exit-codes.md): `error: ...` then `hint: ...`, exit 2.
#[test]
fn the_parsers_errors_are_error_then_hint() {
    for args in [
        &["plan", "-n", "0"][..],
        &["plan", "-n", "1", "--bogus"],
        &["completions"],
        &["plan", "--policy", "x"],
        &["nosuch"],
        &[
            "run",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "node0",
            "--",
            "true",
        ],
    ] {
        let out = threadwise().args(args).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            lines.len() == 2 && lines[0].starts_with("error: ") && lines[1].starts_with("hint: "),
            "{args:?}: {err}"
        );
    }
}

/// The newcomer's smaller stumbles (issue 53, item 7), each as it now reads.
#[test]
fn the_command_line_reads_as_a_newcomer_expects() {
    let out = |args: &[&str]| {
        threadwise()
            .args(args)
            .env_remove("LOCAL_RANK")
            .env_remove("SLURM_LOCALID")
            .output()
            .unwrap()
    };
    // The command is listed under Arguments, not under the last options' heading.
    for sub in ["run", "bind", "tune", "plan"] {
        let help = String::from_utf8(out(&[sub, "-h"]).stdout).unwrap();
        let before = help.split("\n  [CMD]...").next().unwrap();
        let heading = before
            .lines()
            .rev()
            .find(|l| l.ends_with(':') && !l.starts_with(' '));
        assert_eq!(heading, Some("Arguments:"), "{sub} -h:\n{help}");
    }
    // The shells complete no internal subcommand.
    for sh in ["bash", "zsh"] {
        let c = String::from_utf8(out(&["completions", sh]).stdout).unwrap();
        assert!(
            c.contains("nproc-per-node") && !c.contains("watchdog"),
            "{sh}"
        );
    }
    // One rank: --format env needs no --local-rank.
    let env = out(&["plan", "-n", "1", "--format", "env"]);
    assert!(
        env.status.success()
            && String::from_utf8(env.stdout)
                .unwrap()
                .contains("export THREADWISE_CPUS=")
    );
    // bind outside a launcher names the way to give the rank's place.
    let bind = out(&["bind", "--", "true"]);
    let err = String::from_utf8(bind.stderr).unwrap();
    assert!(err.contains("--local-rank K --local-world-size N"), "{err}");
}

/// `--root` that cannot be read as a machine (a device, a FIFO, a symlink
/// loop, a file) is an error naming it, for every command that takes it:
/// never a silent fall-back to this machine.
#[test]
fn a_root_that_is_no_machine_is_refused_by_every_command() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a path of our own temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (l1, l2) = (d.path().join("loop1"), d.path().join("loop2"));
    std::os::unix::fs::symlink(&l2, &l1).unwrap();
    std::os::unix::fs::symlink(&l1, &l2).unwrap();
    let file = d.path().join("file");
    std::fs::write(&file, "x").unwrap();
    for root in [std::path::Path::new("/dev/zero"), &fifo, &l1, &file] {
        let r = root.to_str().unwrap();
        for args in [
            vec!["topo", "--root", r],
            vec!["plan", "-n", "1", "--root", r],
            vec!["doctor", "--root", r],
            vec!["run", "--dry-run", "-n", "1", "--root", r, "--", "true"],
        ] {
            let out = threadwise().args(&args).output().unwrap();
            let err = String::from_utf8(out.stderr).unwrap();
            assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
            assert!(
                err.contains(&format!("{r} is not a topology root")),
                "{args:?}: {err}"
            );
        }
    }
}
