//! What a user asks the planner for, as plain data (the CLI builds it; JSON
//! carries it inside every plan so a plan says what question it answers).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How many local ranks: a number, one per GPU, or decided from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum NProc {
    Count(usize),
    Gpu,
    Auto,
    /// One per allowed CPU (torchrun's `cpu`, which counts every online CPU).
    Cpu,
}

/// A count the planner may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Amount {
    Auto,
    Fixed(usize),
}

/// CPUs kept out of the plan for the OS, IRQs and the launcher.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Reserve {
    #[default]
    None,
    /// The first N allowed physical cores of every NUMA node.
    PerNode(usize),
    /// These CPUs.
    Cpus(crate::cpuset::CpuSet),
}

/// Which GPUs ranks use: all visible, none, or a list of visible ordinals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum GpuSelect {
    Auto,
    None,
    List(Vec<usize>),
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Policy ("a policy,") {
        /// Own physical cores per rank, on the GPU's NUMA node.
        Exclusive => "exclusive",
        /// The whole NUMA node, shared by the ranks on it.
        Node => "node",
        /// The whole package, shared.
        Socket => "socket",
        /// Whole L3 groups per rank.
        L3 => "l3",
        /// One physical core per rank.
        Single => "single",
        /// No binding at all.
        None => "none",
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum MemPolicy ("a memory policy,") {
        /// Allocate on the node of the CPU that touches memory first (the rank's node).
        Local => "local",
        Preferred => "preferred",
        Bind => "bind",
        Interleave => "interleave",
        None => "none",
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum AllocatorChoice ("an allocator,") {
        None => "none",
        Jemalloc => "jemalloc",
        Tcmalloc => "tcmalloc",
        Auto => "auto",
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Profile ("a profile,") {
        /// threadwise's own rules.
        Auto => "auto",
        /// The formulas of the guides this project grew from, reproduced exactly.
        Seed => "seed",
    }
}

crate::named_enum! {
    /// How idle OpenMP threads wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME):
    /// spinning threads are what make oversubscription so costly.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum WaitPolicy ("a wait policy,") {
        /// The runtime's own (libgomp spins a while, then sleeps).
        #[default]
        Default => "default",
        /// Spin: lowest latency when every thread has its own core.
        Active => "active",
        /// Sleep at once: leaves the CPU to others (workers, other ranks).
        Passive => "passive",
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum AllocatorKind ("an allocator,") {
        Jemalloc => "jemalloc",
        Tcmalloc => "tcmalloc",
    }
}

/// An allocator library that exists on the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocator {
    pub kind: AllocatorKind,
    pub path: String,
}

/// Everything `plan` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    pub nproc: NProc,
    pub gpus: GpuSelect,
    pub policy: Policy,
    pub smt: bool,
    pub threads: Amount,
    pub workers: Amount,
    pub mem: MemPolicy,
    pub allocator: AllocatorChoice,
    pub profile: Profile,
    /// Mixed precision (the seed profile's 2-thread rule).
    pub amp: bool,
    /// Nodes in the job: the seed profile divides by the global world size.
    pub nnodes: usize,
    pub oversubscribe: bool,
    /// Set OMP_PROC_BIND/OMP_PLACES (off by default: the CPU-0 trap).
    pub omp_bind: bool,
    /// How idle OpenMP threads wait.
    #[serde(default)]
    pub omp_wait: WaitPolicy,
    /// Cores kept for the OS, IRQs and the launcher.
    #[serde(default)]
    pub reserve: Reserve,
    /// Place threads by role: the main thread and the service threads
    /// (pin-memory, communication) on a core of their own, the team on the
    /// rest (`roles`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub roles: bool,
    /// What the user has without threadwise (tune's `unset` baseline): no
    /// thread-count variable, no THREADWISE_* variable, nothing of the plan.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unset_threads: bool,
}

impl Default for PlanRequest {
    fn default() -> Self {
        PlanRequest {
            nproc: NProc::Auto,
            gpus: GpuSelect::Auto,
            policy: Policy::Exclusive,
            smt: false,
            threads: Amount::Auto,
            workers: Amount::Auto,
            mem: MemPolicy::Local,
            allocator: AllocatorChoice::None,
            profile: Profile::Auto,
            amp: false,
            nnodes: 1,
            oversubscribe: false,
            omp_bind: false,
            omp_wait: WaitPolicy::Default,
            reserve: Reserve::None,
            roles: false,
            unset_threads: false,
        }
    }
}

impl fmt::Display for NProc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NProc::Count(n) => write!(f, "{n}"),
            NProc::Gpu => f.write_str("gpu"),
            NProc::Auto => f.write_str("auto"),
            NProc::Cpu => f.write_str("cpu"),
        }
    }
}

impl FromStr for NProc {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gpu" => Ok(NProc::Gpu),
            "auto" => Ok(NProc::Auto),
            "cpu" => Ok(NProc::Cpu),
            "xpu" => Err("xpu: threadwise finds no Intel XPUs; give a number of ranks".into()),
            _ => s
                .parse()
                .map(NProc::Count)
                .map_err(|_| format!("{s:?}: expected a number, gpu, cpu or auto")),
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Auto => f.write_str("auto"),
            Amount::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for Amount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Amount::Auto),
            _ => s
                .parse()
                .map(Amount::Fixed)
                .map_err(|_| format!("{s:?}: expected a number or auto")),
        }
    }
}

impl fmt::Display for GpuSelect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelect::Auto => f.write_str("auto"),
            GpuSelect::None => f.write_str("none"),
            GpuSelect::List(v) => {
                let s: Vec<String> = v.iter().map(usize::to_string).collect();
                f.write_str(&s.join(","))
            }
        }
    }
}

impl FromStr for GpuSelect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GpuSelect::Auto),
            "none" => Ok(GpuSelect::None),
            _ => {
                let v: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse()).collect();
                let v =
                    v.map_err(|_| format!("{s:?}: expected auto, none or indices like 0,1,3"))?;
                let mut seen = v.clone();
                seen.sort_unstable();
                seen.dedup();
                if seen.len() != v.len() {
                    return Err(format!("{s:?}: a GPU is listed twice"));
                }
                Ok(GpuSelect::List(v))
            }
        }
    }
}

/// At most this many threads or workers per rank: one per CPU we can read.
pub(super) const MAX_AMOUNT: usize = crate::cpuset::MAX_CPU;

impl Amount {
    /// A worker count as users type it: a number up to MAX_AMOUNT, or auto.
    pub fn parse_workers(s: &str) -> Result<Amount, String> {
        match s.parse()? {
            Amount::Fixed(n) if n > MAX_AMOUNT => Err(format!("{n}: at most {MAX_AMOUNT}")),
            a => Ok(a),
        }
    }

    /// A thread count: as workers, and at least 1.
    pub fn parse_threads(s: &str) -> Result<Amount, String> {
        match Amount::parse_workers(s)? {
            Amount::Fixed(0) => Err("0 threads: give at least 1, or auto".into()),
            a => Ok(a),
        }
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reserve::None => f.write_str("none"),
            Reserve::PerNode(n) => write!(f, "{n}"),
            Reserve::Cpus(c) => write!(f, "cpus:{c}"),
        }
    }
}

impl FromStr for Reserve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{s:?}: expected none, a number of cores per NUMA node, or cpus:LIST like cpus:0,64"
            )
        };
        match s {
            "none" | "0" => Ok(Reserve::None),
            _ => match s.strip_prefix("cpus:") {
                Some(list) => crate::cpuset::CpuSet::parse_list(list)
                    .ok()
                    .filter(|c| !c.is_empty())
                    .map(Reserve::Cpus)
                    .ok_or_else(bad),
                None => s
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= MAX_AMOUNT)
                    .map(Reserve::PerNode)
                    .ok_or_else(bad),
            },
        }
    }
}

macro_rules! string_conversions {
    ($($t:ty),*) => {$(
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
    )*};
}
string_conversions!(NProc, Amount, GpuSelect, Reserve);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_forms_round_trip() {
        for s in ["4", "gpu", "auto"] {
            assert_eq!(s.parse::<NProc>().unwrap().to_string(), s);
        }
        assert!("four".parse::<NProc>().is_err());
        assert_eq!(
            "0,2".parse::<GpuSelect>().unwrap(),
            GpuSelect::List(vec![0, 2])
        );
        assert!("0,0".parse::<GpuSelect>().is_err());
        assert!("x".parse::<Amount>().is_err());
        for s in ["none", "2", "cpus:0,64-65"] {
            assert_eq!(s.parse::<Reserve>().unwrap().to_string(), s);
        }
        assert!("cpus:".parse::<Reserve>().is_err());
        assert!("lots".parse::<Reserve>().is_err());
        fn names<T: Copy + fmt::Display + FromStr + Serialize + PartialEq + fmt::Debug>(all: &[T])
        where
            T::Err: fmt::Debug,
        {
            for v in all {
                let name = v.to_string();
                assert_eq!(name.parse::<T>().unwrap(), *v);
                assert_eq!(
                    serde_json::to_value(v).unwrap(),
                    name.as_str(),
                    "serde name"
                );
            }
        }
        names(Policy::ALL);
        names(MemPolicy::ALL);
        names(AllocatorChoice::ALL);
        names(Profile::ALL);
        names(AllocatorKind::ALL);
        names(WaitPolicy::ALL);
        assert!(
            "fast"
                .parse::<Policy>()
                .unwrap_err()
                .contains("exclusive, node")
        );
        let json = serde_json::to_string(&PlanRequest::default()).unwrap();
        let back: PlanRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, PlanRequest::default());
    }
}
