//! The rest of torchrun's command line as clap reads it: torchrun 2.15's
//! options that `run` shares by meaning rather than by name, in both
//! spellings (`torchrun.rs` decides what each does; `pet.rs` reads each from
//! its `PET_` variable).

use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub(crate) struct TorchrunArgs {
    /// torchrun's seconds between looks at its workers: no effect (threadwise
    /// waits on the ranks and hears each end at once)
    #[arg(hide_short_help = true, long, alias = "monitor_interval", value_name = "SECS", value_parser = positive_secs)]
    pub monitor_interval: Option<f64>,
    /// torchrun's multiprocessing start method: no effect (every rank is a
    /// fresh exec, as spawn)
    #[arg(hide_short_help = true, long, alias = "start_method", value_parser = ["spawn", "fork", "forkserver"])]
    pub start_method: Option<String>,
    /// torchrun's event log handler: no effect
    #[arg(
        hide_short_help = true,
        long,
        alias = "event_log_handler",
        value_name = "NAME"
    )]
    pub event_log_handler: Option<String>,
    /// torchrun's form: run the script as runpy.run_path would, as __main__
    /// in a Python of its own (python -u SCRIPT); wins over --no-python
    #[arg(hide_short_help = true, long, alias = "run_path")]
    pub run_path: bool,
    /// The prefix of each output line, with ${rank}, ${local_rank},
    /// ${role_name} and ${hostname} (default: [rank ${rank}] )
    #[arg(
        hide_short_help = true,
        long,
        alias = "log_line_prefix_template",
        value_name = "TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,
    /// Also copy the ranks' stdout lines holding any of these comma-separated
    /// strings (",," a comma) to DIR/filtered-stdout.log (DIR: --log-dir)
    #[arg(
        hide_short_help = true,
        long,
        alias = "duplicate_stdout_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stdout_filters: Option<String>,
    /// The same for stderr, to DIR/filtered-stderr.log
    #[arg(
        hide_short_help = true,
        long,
        alias = "duplicate_stderr_filters",
        value_name = "FILTERS"
    )]
    pub duplicate_stderr_filters: Option<String>,
    /// The address this node gives the others (MASTER_ADDR when it is node
    /// 0; default: the address the rendezvous host sees it connect from)
    #[arg(
        hide_short_help = true,
        long,
        alias = "local_addr",
        value_name = "ADDR"
    )]
    pub local_addr: Option<String>,
    /// torchrun's LogsSpecs entry point: only `default` (threadwise writes
    /// its own logs: --log-dir)
    #[arg(
        hide_short_help = true,
        long,
        alias = "logs_specs",
        value_name = "NAME"
    )]
    pub logs_specs: Option<String>,
    /// torchrun's NUMA binding, as threadwise's --policy: node, socket,
    /// exclusive, core-complex (= l3)
    #[arg(hide_short_help = true, long, alias = "numa_binding", value_parser = ["node", "socket", "exclusive", "core-complex"])]
    pub numa_binding: Option<String>,
    /// Signals that stop the job, forwarded to the ranks (default
    /// SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGUSR1/SIGUSR2 listed here stop it
    /// too, where otherwise they are passed on and the run goes on
    #[arg(
        hide_short_help = true,
        long,
        alias = "signals_to_handle",
        value_name = "LIST"
    )]
    pub signals_to_handle: Option<String>,
    /// torchrun's name for --grace: seconds between SIGTERM and SIGKILL
    #[arg(hide_short_help = true, long, alias = "shutdown_timeout", value_name = "SECS", value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub shutdown_timeout: Option<u32>,
    /// LOCAL_RANK=0 in every rank (each sees its own GPU as device 0)
    #[arg(hide_short_help = true, long, alias = "virtual_local_rank")]
    pub virtual_local_rank: bool,
    /// Print a completion script for threadwise and exit (bash, zsh)
    #[arg(hide_short_help = true, long, alias = "print_completion", value_parser = ["bash", "zsh", "tcsh"])]
    pub print_completion: Option<String>,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?}: expected seconds above 0")),
    }
}
