//! The parsers of option values (clap's value_parser functions): numbers and
//! seconds within bounds, rank counts, GPU lists, torchrun's --rdzv-conf.
//! Each says what it expected, in the words the error line shows.

use std::time::Duration;

use crate::plan::{Amount, GpuSelect, NProc, Reserve};

pub(super) fn parse_nproc(s: &str) -> Result<NProc, String> {
    match s.parse()? {
        NProc::Count(0) => Err("0 ranks: give at least 1, gpu, cpu or auto".into()),
        NProc::Count(n) if n > MAX_RANKS => Err(format!(
            "{n} ranks: at most {MAX_RANKS} local ranks (one node's CPUs)"
        )),
        n => Ok(n),
    }
}

/// `--nnodes`: a number of nodes, or torchrun's elastic range `MIN:MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nodes {
    pub min: usize,
    pub max: usize,
}

impl Nodes {
    /// A range whose ends differ: nodes may come and go.
    pub(crate) fn elastic(self) -> bool {
        self.min != self.max
    }
}

impl std::fmt::Display for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.elastic() {
            true => write!(f, "{}:{}", self.min, self.max),
            false => write!(f, "{}", self.max),
        }
    }
}

/// More nodes than this is no job threadwise's rendezvous serves.
pub(super) const MAX_NODES: usize = 65536;

pub(super) fn parse_nnodes(s: &str) -> Result<Nodes, String> {
    let count = |v: &str| -> Result<usize, String> {
        match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_NODES).contains(&n) => Ok(n),
            _ => Err(format!(
                "{s:?}: expected a number of nodes from 1 to {MAX_NODES}, or MIN:MAX"
            )),
        }
    };
    let (min, max) = match s.split_once(':') {
        None => (count(s)?, count(s)?),
        Some((lo, hi)) => (count(lo)?, count(hi)?),
    };
    if min > max {
        return Err(format!("{s}: MIN is above MAX"));
    }
    Ok(Nodes { min, max })
}

/// More local ranks than this is no node: one per CPU threadwise can read.
pub(super) const MAX_RANKS: usize = crate::cpuset::MAX_CPU;

/// Seconds as a `Duration`, from 0 (or `min`) to `max` seconds.
pub(super) fn secs(s: &str, min: f64, max: f64) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: expected a number of seconds"))?;
    if !(v >= min && v <= max) {
        return Err(format!("{s}: give seconds from {min} to {max}"));
    }
    Ok(Duration::from_secs_f64(v))
}
pub(super) fn parse_grace(s: &str) -> Result<Duration, String> {
    secs(s, 0.0, 3600.0)
}
pub(super) fn parse_wait(s: &str) -> Result<Duration, String> {
    secs(s, 1.0, 86400.0)
}
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    secs(s, 0.001, 7.0 * 86400.0)
}
pub(super) fn parse_work_seconds(s: &str) -> Result<Duration, String> {
    secs(s, 0.01, 3600.0)
}
pub(super) fn parse_reserve(s: &str) -> Result<Reserve, String> {
    s.parse()
}
pub(super) fn parse_gpus(s: &str) -> Result<GpuSelect, String> {
    if s.trim().is_empty() {
        return Err("an empty list: give GPU indices like 0,1, or none, or auto".into());
    }
    s.parse()
}
pub(super) fn parse_amount(s: &str) -> Result<Amount, String> {
    Amount::parse_workers(s)
}
pub(super) fn parse_threads(s: &str) -> Result<Amount, String> {
    Amount::parse_threads(s)
}

/// torchrun's `--rdzv-conf`: the keys threadwise uses, and the rest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RdzvConf {
    pub join_timeout: Option<Duration>,
    /// How long an elastic job waits for more nodes once MIN have joined.
    pub last_call_timeout: Option<Duration>,
    /// torchrun's keys that change nothing here.
    pub inert: Vec<String>,
}

/// torchrun's rendezvous keys (`torch/distributed/elastic/rendezvous`) that
/// threadwise's rendezvous has no use for: its timeouts are its own
/// (--heartbeat-timeout), and its store is the ranks' own.
const INERT_RDZV_KEYS: &[&str] = &[
    "close_timeout",
    "timeout",
    "read_timeout",
    "is_host",
    "use_agent_store",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "heartbeat",
];

pub(super) fn parse_rdzv_conf(s: &str) -> Result<RdzvConf, String> {
    let mut conf = RdzvConf {
        join_timeout: None,
        last_call_timeout: None,
        inert: vec![],
    };
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!("{part:?}: expected KEY=VALUE"));
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "join_timeout" => conf.join_timeout = Some(parse_wait(v)?),
            "last_call_timeout" => conf.last_call_timeout = Some(secs(v, 0.0, 3600.0)?),
            k if INERT_RDZV_KEYS.contains(&k) => conf.inert.push(k.to_string()),
            k => {
                return Err(format!(
                    "{k:?} is no rendezvous setting torchrun knows (join_timeout, last_call_timeout, {})",
                    INERT_RDZV_KEYS.join(", ")
                ));
            }
        }
    }
    Ok(conf)
}

pub(super) fn parse_cpus(s: &str) -> Result<crate::cpuset::CpuSet, String> {
    crate::cpuset::CpuSet::parse_list(s).map_err(|e| e.to_string())
}

pub(super) fn parse_interval(s: &str) -> Result<Duration, String> {
    secs(s, 0.05, 3600.0)
}

pub(super) fn parse_probe_timeout(s: &str) -> Result<Duration, String> {
    secs(s, 0.1, 600.0)
}
/// `tune --margin PCT`: a percentage from 0 to 50, as a fraction.
pub(super) fn parse_margin(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage: give e.g. 5 for ±5%"))?;
    if !(0.0..=50.0).contains(&v) {
        return Err(format!("{v}% is outside 0-50: give e.g. 5 for ±5%"));
    }
    Ok(v / 100.0)
}
