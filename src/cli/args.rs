//! clap definitions. Only what the user typed is checked here; objects are
//! built from these values afterwards.

use std::ffi::OsString;
use std::path::PathBuf;

use std::time::Duration;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::export::PlanFormat;
use crate::plan::{
    AllocatorChoice, Amount, GpuSelect, MemPolicy, NProc, Policy, Profile, Reserve, WaitPolicy,
};
use crate::tune::Strategy;
use crate::workload;

pub(super) use super::values::MAX_RANKS;
pub(crate) use super::values::{Nodes, RdzvConf};
use super::values::{
    parse_amount, parse_gpus, parse_grace, parse_interval, parse_margin, parse_nnodes, parse_nproc,
    parse_probe_timeout, parse_rdzv_conf, parse_reserve, parse_threads, parse_timeout, parse_wait,
    parse_work_seconds,
};

#[derive(Parser, Debug)]
#[command(
    name = "threadwise",
    version,
    about = "Thread, core and NUMA placement for multi-process (DDP) training",
    long_about = None
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once per process: the size of `run`'s options costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    /// Show what the machine is: packages, NUMA nodes, L3 groups, cores, GPUs, NICs, limits
    Topo(TopoArgs),
    /// Plan each local rank's cores, memory node, GPU, threads, workers and environment
    Plan(PlanCmd),
    /// Launch the ranks on this node with the plan (a drop-in for torchrun --standalone)
    Run(RunCmd),
    /// Apply one rank's slice under another launcher (torchrun, srun, mpirun) and exec CMD
    Bind(BindCmd),
    /// Measure configurations on your training command (or the built-in workload)
    Tune(TuneCmd),
    /// Check the machine and environment for what slows training down, with fixes
    Doctor(DoctorCmd),
    /// Watch running ranks live against their plan: CPUs, threads, switches, memory, alerts
    Top(TopCmd),
    /// Print a shell completion script: threadwise completions bash > /etc/bash_completion.d/threadwise
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff): threadwise man run | man -l -
    Man {
        /// The subcommand's page (topo, plan, run, bind, tune, doctor, top,
        /// completions); none: the tool's own page
        #[arg(value_name = "SUBCOMMAND")]
        sub: Option<String>,
        /// Write every page into DIR instead (threadwise.1, threadwise-run.1,
        /// ...), as a packager installs them
        #[arg(long, value_name = "DIR", conflicts_with = "sub")]
        dir: Option<PathBuf>,
    },
    /// Kill and remove a job cgroup when stdin closes (started by run itself)
    #[command(name = "__watchdog", hide = true)]
    Watchdog { dir: PathBuf },
    /// Hold a bound rank's threads in place (started by bind itself)
    #[command(name = "__hold", hide = true)]
    Hold(super::hold::HoldCmd),
}

/// Where the topology comes from (default: this machine).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct SourceArgs {
    /// Read /sys and /proc below DIR (a dump from hwloc-gather-topology)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["topology", "synthetic"])]
    pub root: Option<PathBuf>,
    /// Read an hwloc v2 XML export (lstopo --of xml)
    #[arg(long, value_name = "FILE.xml", conflicts_with = "synthetic")]
    pub topology: Option<PathBuf>,
    /// Describe a machine: "package:2 numa:2 l3:2 core:8 pu:2 gpu:4" (see docs/topo.md)
    #[arg(long, value_name = "DESC")]
    pub synthetic: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct TopoArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Print the threadwise.topology/1 JSON document
    #[arg(long, conflicts_with = "picture")]
    pub json: bool,
    /// Draw the machine: one cell per core, by package and NUMA node
    #[arg(long)]
    pub picture: bool,
    /// Also write the picture as an SVG file
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// The library's named enums as clap values: the names come from the enums
/// themselves (`named_enum!`), so the CLI and the library cannot disagree.
macro_rules! value_enum {
    ($($t:ty),*) => {$(
        impl ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                <$t>::ALL
            }
            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(self.name()))
            }
        }
    )*};
}
value_enum!(
    Policy,
    MemPolicy,
    AllocatorChoice,
    Profile,
    WaitPolicy,
    PlanFormat,
    Strategy,
    crate::proc::hold::Hold
);

/// The planner's defaults: the one source of every plan option's default.
fn d() -> crate::plan::PlanRequest {
    crate::plan::PlanRequest::default()
}

/// The options every command that plans shares (plan, run, bind, tune).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Placement")]
pub(crate) struct PlanArgs {
    /// Local ranks: a number, gpu (one per GPU), cpu (one per allowed CPU) or auto
    #[arg(short = 'n', long = "nproc-per-node", alias = "nproc_per_node", value_name = "N|gpu|cpu|auto", default_value_t = d().nproc,
          value_parser = parse_nproc)]
    pub nproc: NProc,
    /// GPUs to use, as indices in PCI bus order: 0,1,3 | auto | none
    #[arg(long, value_name = "LIST|auto|none", default_value_t = d().gpus, value_parser = parse_gpus)]
    pub gpus: GpuSelect,
    /// How ranks share the CPUs
    #[arg(long, value_enum, default_value_t = d().policy)]
    pub policy: Policy,
    /// Count SMT siblings as compute CPUs
    #[arg(hide_short_help = true, long)]
    pub smt: bool,
    /// Compute threads per rank
    #[arg(long, value_name = "N|auto", default_value_t = d().threads, value_parser = parse_threads)]
    pub threads: Amount,
    /// DataLoader workers per rank (THREADWISE_NUM_WORKERS)
    #[arg(long, value_name = "N|auto", default_value_t = d().workers, value_parser = parse_amount)]
    pub workers: Amount,
    /// NUMA memory policy per rank
    #[arg(long, value_enum, default_value_t = d().mem)]
    pub mem: MemPolicy,
    /// Preload an allocator (auto: tcmalloc, else jemalloc, when installed)
    #[arg(long, value_enum, default_value_t = d().allocator)]
    pub allocator: AllocatorChoice,
    /// auto: threadwise's rules; seed: the guides' formulas, with what they get wrong
    #[arg(hide_short_help = true, long, value_enum, default_value_t = d().profile)]
    pub profile: Profile,
    /// Mixed precision (the seed profile caps threads at 2)
    #[arg(hide_short_help = true, long)]
    pub amp: bool,
    /// Nodes in the job (the seed profile divides by the global world size); run also takes
    /// torchrun's elastic MIN:MAX
    #[arg(long, value_name = "N|MIN:MAX", default_value = "1", value_parser = parse_nnodes)]
    pub nnodes: Nodes,
    /// Allow more ranks than cores (or GPUs): share them round-robin
    #[arg(long)]
    pub oversubscribe: bool,
    /// Also set OMP_PROC_BIND=close OMP_PLACES=cores (pins the main thread: see docs/plan.md)
    #[arg(hide_short_help = true, long)]
    pub omp_bind: bool,
    /// How idle OpenMP threads wait: OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME
    #[arg(hide_short_help = true, long, value_enum, default_value_t = d().omp_wait)]
    pub omp_wait: WaitPolicy,
    /// Keep cores for the OS, IRQs and the launcher: N per NUMA node, or cpus:LIST
    #[arg(hide_short_help = true, long, value_name = "N|cpus:LIST", default_value_t = d().reserve, value_parser = parse_reserve)]
    pub reserve: Reserve,
    /// Place threads by role: main, pin-memory and communication threads on a core of their
    /// own, the compute team on the rest (docs/how-it-works.md)
    #[arg(long)]
    pub roles: bool,
}

#[derive(Args, Debug)]
pub(crate) struct PlanCmd {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Output form
    #[arg(long, value_enum, default_value_t = PlanFormat::Table)]
    pub format: PlanFormat,
    /// Same as --format json
    #[arg(long, conflicts_with_all = ["format", "picture"])]
    pub json: bool,
    /// Draw the plan: each core lettered by the rank that owns it
    #[arg(long, conflicts_with = "format")]
    pub picture: bool,
    /// Also write the picture as an SVG file
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Show every decision's reason
    #[arg(long)]
    pub explain: bool,
    /// The rank whose variables --format env prints
    #[arg(long, value_name = "K")]
    pub local_rank: Option<usize>,
    /// The training command, for formats that print command lines
    #[arg(last = true, value_name = "CMD", help_heading = "Arguments")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct RunCmd {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Print each rank's environment, CPU set, memory policy and argv; start nothing
    #[arg(long, help_heading = "Launch")]
    pub dry_run: bool,
    /// MASTER_ADDR for the ranks
    #[arg(
        hide_short_help = true,
        help_heading = "Launch",
        long,
        alias = "master_addr",
        default_value = "127.0.0.1"
    )]
    pub master_addr: String,
    /// MASTER_PORT for the ranks (default: a free port)
    #[arg(hide_short_help = true, help_heading = "Launch", long, alias = "master_port", value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks
    #[arg(hide_short_help = true, help_heading = "Launch", long, default_value = "10", value_name = "SECS", value_parser = parse_grace)]
    pub grace: Duration,
    /// Do not prefix output lines with [rank K]
    #[arg(hide_short_help = true, help_heading = "Output", long)]
    pub no_prefix: bool,
    /// Show only these ranks' output on the terminal: 0,3
    #[arg(
        help_heading = "Output",
        long,
        alias = "local_ranks_filter",
        value_delimiter = ',',
        value_name = "LIST"
    )]
    pub local_ranks_filter: Option<Vec<usize>>,
    /// Also write each rank's stdout and stderr to DIR/rank-K.stdout|stderr
    #[arg(help_heading = "Output", long, alias = "log_dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Start ranks unbound when the kernel refuses the binding
    #[arg(long, help_heading = "Launch")]
    pub allow_unbound: bool,
    /// Skip the quick doctor checks before starting
    #[arg(hide_short_help = true, long, help_heading = "Launch")]
    pub no_doctor: bool,
    /// Leave DataLoader workers (child processes running the rank's own
    /// program) on the rank's CPUs instead of moving them to its worker CPUs
    #[arg(hide_short_help = true, long, help_heading = "Launch")]
    pub no_move_workers: bool,
    #[command(flatten)]
    pub hold: super::hold::HoldArg,
    /// Show the live view (threadwise top) in place of the ranks' output
    /// (which still goes to --log-dir)
    #[arg(help_heading = "Output", long)]
    pub top: bool,
    /// No per-rank summary at the end
    #[arg(help_heading = "Output", long, short = 'q')]
    pub quiet: bool,
    /// This node's rank in a multi-node job (default: given at the rendezvous,
    /// the endpoint's own node first)
    #[arg(help_heading = "Multi-node", long, alias = "node_rank")]
    pub node_rank: Option<u32>,
    /// Rendezvous endpoint HOST:PORT, the same on every node; the node that
    /// owns the address hosts it (multi-node)
    #[arg(
        help_heading = "Multi-node",
        long,
        alias = "rdzv_endpoint",
        value_name = "HOST:PORT",
        value_parser = crate::netif::Endpoint::parse
    )]
    pub rdzv_endpoint: Option<crate::netif::Endpoint>,
    /// Rendezvous id shared by every node of the job (default: SLURM_JOB_ID, else "none")
    #[arg(help_heading = "Multi-node", long, alias = "rdzv_id")]
    pub rdzv_id: Option<String>,
    /// Rendezvous backend: c10d or static (torchrun's names; threadwise's
    /// agents serve both, and stay the supervisor on every node)
    #[arg(hide_short_help = true, help_heading = "Multi-node", long, alias = "rdzv_backend", default_value = "c10d", value_parser = ["c10d", "static"])]
    pub rdzv_backend: String,
    /// How long the rendezvous waits for every node to join [default: 600, or
    /// --rdzv-conf's join_timeout]
    #[arg(hide_short_help = true, help_heading = "Multi-node", long, value_name = "SECS", value_parser = parse_wait)]
    pub rdzv_timeout: Option<Duration>,
    /// torchrun's rendezvous settings, KEY=VALUE,...: join_timeout (seconds)
    /// is --rdzv-timeout; torchrun's other keys are accepted and have no effect
    #[arg(hide_short_help = true, help_heading = "Multi-node", long, alias = "rdzv_conf", value_name = "KEY=VALUE,...", value_parser = parse_rdzv_conf)]
    pub rdzv_conf: Option<RdzvConf>,
    /// A node (or the rendezvous host) silent this long is lost, and the job ends
    #[arg(hide_short_help = true, help_heading = "Multi-node", long, default_value = "10", value_name = "SECS", value_parser = parse_wait)]
    pub heartbeat_timeout: Duration,
    /// Report this node's CPU and GPU use, and global rank 0's throughput, to
    /// the rendezvous after each round (for tune --nnodes, which hosts it)
    #[arg(long, hide = true)]
    pub report_node: bool,
    /// With --report-node: read the throughput with this regex (tune's --metric)
    #[arg(long, hide = true, requires = "report_node")]
    pub report_metric: Option<String>,
    /// The plan request as JSON (threadwise.plan/1's `request`), in place of
    /// the plan options (for tune --nnodes)
    #[arg(long, hide = true)]
    pub plan_request: Option<String>,
    /// Restarts of the ranks after a rank fails, on one node or every node of a job (as
    /// torchrun; TORCHELASTIC_RESTART_COUNT counts them)
    #[arg(
        help_heading = "Launch",
        long,
        alias = "max_restarts",
        default_value_t = 0
    )]
    pub max_restarts: u32,
    /// Use a saved plan (threadwise tune --save-plan) instead of planning
    #[arg(help_heading = "Launch", long = "plan", value_name = "FILE")]
    pub plan_file: Option<PathBuf>,
    /// A file holding the rendezvous secret, the same on every node and
    /// readable by its owner only (else THREADWISE_RDZV_SECRET; under Slurm,
    /// MUNGE with nothing to give; else the rendezvous is open)
    #[arg(help_heading = "Multi-node", long, value_name = "FILE")]
    pub rdzv_secret_file: Option<PathBuf>,
    /// ROLE_NAME for every rank (torchrun's --role)
    #[arg(hide_short_help = true, help_heading = "Launch", long, default_value = crate::launch::env::DEFAULT_ROLE, value_name = "NAME")]
    pub role: String,
    /// torchrun's form: the script is a program to run as it is, not Python
    #[arg(
        hide_short_help = true,
        help_heading = "torchrun's command line",
        long,
        alias = "no_python",
        conflicts_with = "module"
    )]
    pub no_python: bool,
    /// torchrun's form: run the script as a Python module (python -u -m SCRIPT)
    #[arg(
        hide_short_help = true,
        help_heading = "torchrun's command line",
        short = 'm',
        long
    )]
    pub module: bool,
    /// Accepted for torchrun's command lines: one node is standalone already
    #[arg(hide_short_help = true, help_heading = "torchrun's command line", long)]
    pub standalone: bool,
    /// Accepted for torchrun's command lines: the ranks' output always
    /// reaches the terminal, and --log-dir writes it to files
    #[arg(
        short = 't',
        long,
        value_name = "STD",
        hide_short_help = true,
        help_heading = "torchrun's command line"
    )]
    pub tee: Option<String>,
    /// Accepted for torchrun's command lines, as --tee
    #[arg(
        short = 'r',
        long,
        value_name = "STD",
        hide_short_help = true,
        help_heading = "torchrun's command line"
    )]
    pub redirects: Option<String>,
    /// The rest of torchrun's options
    #[command(flatten, next_help_heading = "torchrun's command line")]
    pub torchrun: super::torchrun_args::TorchrunArgs,
    /// With --dry-run: plan on another machine (a dump, an hwloc export or a
    /// description) to see what this command would do there
    #[command(
        flatten,
        next_help_heading = "Preview on another machine (with --dry-run)"
    )]
    pub source: SourceArgs,
    /// The command each rank runs after `--`, as it is (no shell in between);
    /// or torchrun's form, without `--`: SCRIPT [ARGS] runs `python -u SCRIPT
    /// ARGS` (with -m a module, with --no-python the program itself)
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD",
        help_heading = "Arguments",
        required_unless_present = "print_completion"
    )]
    pub command: Vec<OsString>,
    /// Whether `--` came right before the command (set after parsing).
    #[arg(skip)]
    pub after_dashes: bool,
    /// Whether `-n` was given (or PET_NPROC_PER_NODE), not defaulted (set
    /// after parsing).
    #[arg(skip)]
    pub nproc_given: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TopCmd {
    /// Watch these processes as ranks, or the ranks of these threadwise runs (default: the
    /// newest threadwise run)
    #[arg(long, value_name = "PID", num_args = 1.., conflicts_with = "all")]
    pub pid: Vec<i32>,
    /// Every rank torchrun, srun or mpirun started that you may read
    #[arg(long)]
    pub all: bool,
    /// Seconds between samples
    #[arg(long, default_value = "1", value_name = "SECS", value_parser = parse_interval)]
    pub interval: Duration,
    /// One sample (over one interval), then exit
    #[arg(long)]
    pub once: bool,
    /// JSON (threadwise.top/1): one object, or one per line with --interval
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct DoctorCmd {
    /// Check the sysfs/procfs of a dump instead of this machine (environment,
    /// limits and PATH stay this process's)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print the threadwise.doctor/1 JSON document
    #[arg(long)]
    pub json: bool,
    /// Also list the checks that passed
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Print a shell script of the fixes
    #[arg(long)]
    pub fix: bool,
    /// With --fix: write the sysctl settings to FILE (a sysctl.d file)
    #[arg(long, value_name = "FILE", requires = "fix")]
    pub write: Option<PathBuf>,
    /// Local ranks you mean to start (default: as run -n auto: one per GPU,
    /// else one per NUMA node with allowed CPUs)
    #[arg(short = 'n', long = "nproc-per-node", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_RANKS as u64).map(|v| v as usize))]
    pub nproc: Option<usize>,
    /// DataLoader workers per rank, for the /dev/shm check
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=MAX_RANKS as u64).map(|v| v as usize))]
    pub workers: Option<usize>,
    /// A multi-node job's HOST:PORT: check that it resolves
    #[arg(long, value_name = "HOST:PORT")]
    pub rdzv_endpoint: Option<String>,
    /// The Python to probe (default: python3 on PATH)
    #[arg(long, value_name = "PATH", conflicts_with = "no_python")]
    pub python: Option<PathBuf>,
    /// Skip the Python probe (torch versions, OpenMP runtimes)
    #[arg(long)]
    pub no_python: bool,
    /// Seconds the Python probe may take
    #[arg(long, default_value = "20", value_name = "SECS", value_parser = parse_probe_timeout)]
    pub python_timeout: Duration,
}

#[derive(Args, Debug)]
pub(crate) struct BindCmd {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Print what this rank would get; exec nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Run unbound when the kernel refuses the binding
    #[arg(long)]
    pub allow_unbound: bool,
    #[command(flatten)]
    pub hold: super::hold::HoldArg,
    /// Print this rank's slice as JSON (threadwise.bind/1, what the Python
    /// helper's apply and spawn read); exec nothing
    #[arg(long, conflicts_with = "dry_run")]
    pub json: bool,
    /// This process's local rank, in place of a launcher's variables (with --local-world-size)
    #[arg(long, value_name = "K", requires = "local_world_size")]
    pub local_rank: Option<usize>,
    /// Ranks on this node, in place of a launcher's variables (with --local-rank)
    #[arg(long, value_name = "N", requires = "local_rank")]
    pub local_world_size: Option<usize>,
    /// With --dry-run: plan on another machine (a dump, an hwloc export or a
    /// description) to see what this command would do there
    #[command(
        flatten,
        next_help_heading = "Preview on another machine (with --dry-run)"
    )]
    pub source: SourceArgs,
    /// The command to become
    #[arg(
        last = true,
        value_name = "CMD",
        help_heading = "Arguments",
        required_unless_present = "json"
    )]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub(crate) struct TuneCmd {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Measured rounds: each runs every configuration once, in a shuffled order
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000).map(|v| v as usize))]
    pub runs: usize,
    /// Undecided rows get more rounds: while the race has not decided a row
    /// against the winner, it runs again beside the winner, one round at a
    /// time, up to this many trials each [default: 4 x --runs]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000).map(|v| v as usize))]
    pub max_runs: Option<usize>,
    /// The seed of the rounds' shuffled orders [default: from the clock;
    /// the report prints it]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Unmeasured runs per configuration first
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000).map(|v| v as usize))]
    pub warmup: usize,
    /// Print the configurations and the trials they take; run nothing
    #[arg(long)]
    pub dry_run: bool,
    /// How rows leave the race. Each stops a row the model calls slower than
    /// the leader or the same within --margin (after the base rounds, also
    /// one that more trials could neither call nor make the winner): auto and
    /// halving from round 2, all from the last base round. halving also drops,
    /// after round 1, a row below half of the round's best (never unset, never
    /// on a disturbed trial); auto does that with more than 8 configurations
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    pub strategy: Strategy,
    /// Two configurations whose interval against each other lies within
    /// ±PCT% are the same: the row stops, and the table says so (0: never)
    #[arg(long, value_name = "PCT", default_value = crate::tune::DEFAULT_MARGIN_PCT, value_parser = parse_margin)]
    pub margin: f64,
    /// A grid instead of the default rows: threads=1,2,4 policy=none,exclusive workers=2,4 allocator=none,jemalloc
    #[arg(long, value_name = "KEY=V1,V2 ...", num_args = 1..)]
    pub grid: Vec<String>,
    /// Add a configuration: NAME=key=value ... (e.g. 'lean=threads=2 policy=l3')
    #[arg(long, value_name = "NAME=OPTIONS")]
    pub config: Vec<String>,
    /// Throughput regex with one capture group (default: "<n> img/s", samples/s, tokens/s, it/s ...)
    #[arg(long, value_name = "REGEX")]
    pub metric: Option<String>,
    /// Seconds one trial may take before it is stopped
    #[arg(long, default_value = "600", value_name = "SECS", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Write the report as JSON (threadwise.tune/1), rewritten after every trial
    #[arg(long, value_name = "FILE")]
    pub export_json: Option<PathBuf>,
    /// Write one CSV row per trial, rewritten after every trial
    #[arg(long, value_name = "FILE")]
    pub export_csv: Option<PathBuf>,
    /// Write the table as Markdown, rewritten after every trial
    #[arg(long, value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Bar chart of throughput with min-max whiskers
    #[arg(long, value_name = "FILE")]
    pub export_svg: Option<PathBuf>,
    /// Save the winner's plan for threadwise run --plan FILE
    #[arg(long, value_name = "FILE")]
    pub save_plan: Option<PathBuf>,
    /// Built-in workload: seconds measured per trial
    #[arg(long, default_value = "1.5", value_name = "SECS", value_parser = parse_work_seconds)]
    pub work_seconds: Duration,
    /// Built-in workload: image side in pixels (the CNN halves it per stage)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=workload::MAX_SIZE).map(|v| v as usize))]
    pub work_size: usize,
    /// Built-in workload: samples per step per rank
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=workload::MAX_BATCH).map(|v| v as usize))]
    pub work_batch: usize,
    /// Built-in workload: convolution layers (each several parallel regions)
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=workload::MAX_LAYERS).map(|v| v as usize))]
    pub work_layers: usize,
    /// Built-in workload: decode-like passes per value of each sample in the data-loader workers
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(0..=workload::MAX_LOADER_WORK).map(|v| v as usize))]
    pub work_loader: usize,
    /// With --dry-run: plan on another machine (a dump, an hwloc export or a
    /// description) to see what this command would do there
    #[command(
        flatten,
        next_help_heading = "Preview on another machine (with --dry-run)"
    )]
    pub source: SourceArgs,
    /// Your training command (default: the built-in workload)
    #[arg(last = true, value_name = "CMD", help_heading = "Arguments")]
    pub command: Vec<OsString>,
}
