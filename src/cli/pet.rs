//! torchrun's options from the environment, for `run`: torchrun reads every
//! option from `PET_<OPTION>` when the command line does not give it
//! (`torch/distributed/argparse_util.py`), and Kubeflow's PyTorchJob and
//! TorchX hand torchrun its options that way. For every option `run` shares
//! with torchrun, a set `PET_` variable becomes that flag before clap parses,
//! so it is checked exactly as the flag is; a flag on the command line wins.

use std::ffi::OsString;

/// The options `run` shares with torchrun, by their clap ids: the one list.
/// Everything else about each comes from its clap definition (`args.rs`):
/// its spellings (long, aliases, short), its help, whether it is a switch;
/// its variable is `PET_<LONG>` as torchrun's `env` action names it
/// (`--nproc-per-node` -> `PET_NPROC_PER_NODE`), and `run --help` shows it as
/// clap shows an `env`.
pub(super) const TORCHRUN: &[&str] = &[
    "nnodes",
    "nproc",
    "node_rank",
    "rdzv_endpoint",
    "rdzv_backend",
    "rdzv_id",
    "max_restarts",
    "master_addr",
    "master_port",
    "log_dir",
    "local_ranks_filter",
    "rdzv_conf",
    "role",
    "tee",
    "redirects",
    "monitor_interval",
    "start_method",
    "event_log_handler",
    "log_line_prefix_template",
    "duplicate_stdout_filters",
    "duplicate_stderr_filters",
    "local_addr",
    "signals_to_handle",
    "shutdown_timeout",
    // torchrun's switches (`check_env`): set when the variable is a
    // non-zero integer, as torchrun reads them.
    "standalone",
    "no_python",
    "module",
    "run_path",
    "virtual_local_rank",
];

/// The `PET_` variable of a long option.
pub(super) fn var_of(long: &str) -> String {
    format!("PET_{}", long.replace('-', "_").to_uppercase())
}

/// `run`'s command with each torchrun option's variable shown (and read) as
/// clap does an `env`. A variable set but empty stays unset, as torchrun's
/// `env` action leaves an empty one (clap would take the empty value).
pub(super) fn with_env(run: clap::Command) -> clap::Command {
    run.mut_args(|a| {
        if !TORCHRUN.contains(&a.get_id().as_str()) {
            return a;
        }
        let var = var_of(a.get_long().unwrap_or_default());
        match std::env::var_os(&var).is_some_and(|v| v.is_empty()) {
            true => a,
            false => a.env(Box::leak(var.into_boxed_str()) as &'static str),
        }
    })
}

/// One torchrun option as `run_args` needs it: its variable, our flag, every
/// spelling that gives it on the command line, and whether it is a switch.
struct Shared {
    var: &'static str,
    flag: &'static str,
    spellings: Vec<&'static str>,
    switch: bool,
}

/// The table, read from the clap definition once.
fn shared() -> &'static [Shared] {
    static TABLE: std::sync::OnceLock<Vec<Shared>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let run = super::run_tree();
        let run = run.find_subcommand("run").expect("run is a subcommand");
        TORCHRUN
            .iter()
            .map(|id| {
                let a = run
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .unwrap_or_else(|| panic!("{id} is not one of run's options"));
                let long = a.get_long().expect("torchrun's options are long");
                let mut spellings = vec![leak(format!("--{long}"))];
                spellings.extend(
                    a.get_all_aliases()
                        .into_iter()
                        .flatten()
                        .map(|x| leak(format!("--{x}"))),
                );
                spellings.extend(a.get_short().map(|c| leak(format!("-{c}"))));
                Shared {
                    var: leak(var_of(long)),
                    flag: spellings[0],
                    spellings,
                    switch: matches!(a.get_action(), clap::ArgAction::SetTrue),
                }
            })
            .collect()
    })
}

/// One option taken from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FromEnv {
    pub var: &'static str,
    pub flag: &'static str,
    pub value: String,
}

impl std::fmt::Display for FromEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} ({})", self.var, self.value, self.flag)
    }
}

/// A `PET_` value `run` cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused {
    pub var: &'static str,
    pub value: String,
    pub why: String,
}

/// Does the command line (before `--`) give one of `spellings`?
fn given(options: &[OsString], spellings: &[&str]) -> bool {
    options.iter().any(|o| {
        let o = o.to_string_lossy();
        spellings.iter().any(|s| {
            *o == **s
                || o.strip_prefix(s).is_some_and(|rest| rest.starts_with('='))
                // `-n4`: a short flag with its value attached.
                || (s.len() == 2 && o.starts_with(s) && o.len() > 2 && !o.starts_with("--"))
        })
    })
}

/// `threadwise run ...` with the `PET_` options the command line does not
/// give put in as flags, and which ones were; argv unchanged for any other
/// subcommand. torchrun's `--nnodes MIN:MAX` passes as it is (an elastic
/// job when MIN < MAX).
///
/// `command_at` is where the command starts in `argv` when the caller
/// knows (clap's reading of it); otherwise the first `--` ends our options.
/// What follows is the user's, never read as ours.
pub(super) fn run_args(
    argv: Vec<OsString>,
    command_at: Option<usize>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<OsString>, Vec<FromEnv>), Refused> {
    if argv.get(1).map(|a| a.as_os_str()) != Some("run".as_ref()) {
        return Ok((argv, vec![]));
    }
    let end = command_at
        .or_else(|| argv.iter().position(|a| a == "--"))
        .unwrap_or(argv.len())
        .min(argv.len());
    let options = &argv[2..end.max(2)];
    let mut taken = vec![];
    for o in shared().iter().filter(|o| !o.switch) {
        let (var, flag) = (o.var, o.flag);
        let Some(value) = env(var).map(|v| v.trim().to_string()) else {
            continue;
        };
        if value.is_empty() || given(options, &o.spellings) {
            continue;
        }
        taken.push(FromEnv { var, flag, value });
    }
    let mut switches = vec![];
    for o in shared().iter().filter(|o| o.switch) {
        let (var, flag) = (o.var, o.flag);
        let Some(value) = env(var).map(|v| v.trim().to_string()) else {
            continue;
        };
        if value.is_empty() || given(options, &o.spellings) {
            continue;
        }
        let on = value.parse::<i64>().map_err(|_| Refused {
            var,
            value: value.clone(),
            why: "torchrun reads this switch as an integer: 1 sets it, 0 leaves it unset".into(),
        })?;
        if on != 0 {
            switches.push(FromEnv { var, flag, value });
        }
    }
    let mut out: Vec<OsString> = argv[..2].to_vec();
    out.extend(
        taken
            .iter()
            .map(|t| OsString::from(format!("{}={}", t.flag, t.value))),
    );
    out.extend(switches.iter().map(|t| OsString::from(t.flag)));
    taken.extend(switches);
    out.extend(argv[2..].iter().cloned());
    Ok((out, taken))
}

/// The note that says which options came from the environment.
pub(super) fn said(taken: &[FromEnv]) -> Option<String> {
    (!taken.is_empty()).then(|| {
        let list: Vec<String> = taken.iter().map(FromEnv::to_string).collect();
        format!(
            "options from torchrun's environment variables: {}",
            list.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn kubeflow_v1_options_become_flags_and_the_command_line_wins() {
        let env = env_of(&[
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_NODE_RANK", "1"),
            ("PET_RDZV_ENDPOINT", "job-master-0:23456"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_MASTER_PORT", ""),
        ]);
        let (argv, taken) = run_args(
            args(&[
                "tw",
                "run",
                "--node_rank=0",
                "--",
                "python",
                "--nnodes",
                "9",
            ]),
            None,
            &env,
        )
        .unwrap();
        assert_eq!(
            argv,
            args(&[
                "tw",
                "run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-endpoint=job-master-0:23456",
                "--rdzv-backend=c10d",
                "--node_rank=0",
                "--",
                "python",
                "--nnodes",
                "9"
            ])
        );
        // The user's command after `--` is never read as ours; an empty value is unset.
        assert_eq!(taken.len(), 4);
        assert_eq!(taken[0].to_string(), "PET_NNODES=2 (--nnodes)");
        assert!(
            said(&taken)
                .unwrap()
                .contains("PET_RDZV_ENDPOINT=job-master-0:23456")
        );
    }

    #[test]
    fn short_and_attached_spellings_count_as_given() {
        let env = env_of(&[("PET_NPROC_PER_NODE", "8")]);
        for given in [
            &["-n", "2"][..],
            &["-n2"],
            &["--nproc_per_node=2"],
            &["--nproc-per-node", "2"],
        ] {
            let mut v = vec!["tw", "run"];
            v.extend(given);
            v.extend(["--", "true"]);
            let (_, taken) = run_args(args(&v), None, &env).unwrap();
            assert!(taken.is_empty(), "{given:?}");
        }
    }

    #[test]
    fn other_subcommands_are_untouched_and_an_elastic_range_passes_as_it_is() {
        let env = env_of(&[("PET_NNODES", "1:4"), ("PET_NPROC_PER_NODE", "2")]);
        let plan = args(&["tw", "plan", "-n", "2"]);
        assert_eq!(run_args(plan.clone(), None, &env).unwrap(), (plan, vec![]));
        let (argv, _) = run_args(args(&["tw", "run", "--", "true"]), None, &env).unwrap();
        assert_eq!(argv[2], "--nnodes=1:4");
        let env = env_of(&[("PET_NO_PYTHON", "yes")]);
        let e = run_args(args(&["tw", "run", "x"]), None, &env).unwrap_err();
        assert_eq!(e.var, "PET_NO_PYTHON");
    }

    #[test]
    fn switches_and_rendezvous_settings_come_from_the_environment_as_torchrun_reads_them() {
        let vars: &[(&str, &str)] = &[
            ("PET_NO_PYTHON", "1"),
            ("PET_STANDALONE", "0"),
            ("PET_MODULE", ""),
            ("PET_RDZV_CONF", "join_timeout=900"),
            ("PET_ROLE", "trainer"),
        ];
        let env = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let argv: Vec<OsString> = ["tw", "run", "--role", "x", "sh", "a.sh"]
            .iter()
            .map(OsString::from)
            .collect();
        let (out, taken) = run_args(argv, Some(4), &env).unwrap();
        let out: Vec<String> = out
            .iter()
            .map(|o| o.to_string_lossy().into_owned())
            .collect();
        // 0 and empty leave a switch unset; the command line's --role wins.
        assert_eq!(
            out,
            [
                "tw",
                "run",
                "--rdzv-conf=join_timeout=900",
                "--no-python",
                "--role",
                "x",
                "sh",
                "a.sh"
            ]
        );
        let names: Vec<&str> = taken.iter().map(|t| t.var).collect();
        assert_eq!(names, ["PET_RDZV_CONF", "PET_NO_PYTHON"]);
    }
}
