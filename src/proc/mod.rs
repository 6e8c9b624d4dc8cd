//! The process edge: births (`clone3` into the job cgroup, raw syscalls in
//! the child), containment and its watchdog, signals, moving DataLoader
//! workers. Every `unsafe` of launching lives here; a function whose caller
//! must keep a contract the compiler cannot check is an `unsafe fn` with a
//! `# Safety` section. Nothing here knows plans or rendezvous: it starts
//! what a `launch::RankLaunch` describes.

pub(crate) mod born;
pub(crate) mod contain;
pub(crate) mod hold;
pub(crate) mod signals;
pub(crate) mod vm;
pub(crate) mod workers;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::os::Placement;

/// One rank, ready to start (compared whole: tune measures two
/// configurations that launch alike once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankLaunch {
    pub local_rank: usize,
    pub argv: Vec<OsString>,
    /// argv[0] resolved through PATH, when it was.
    pub program: Option<PathBuf>,
    /// Variables set or replaced for this rank; the rest is inherited.
    pub env: BTreeMap<String, String>,
    /// Variables removed from the inherited environment.
    pub env_remove: Vec<String>,
    pub placement: Placement,
    pub cpus: String,
    pub mem: String,
    /// Where `run` moves the rank's DataLoader workers (when not its own CPUs).
    pub worker_mask: Option<Vec<u64>>,
    /// Where its threads are held (a bound rank).
    pub hold: Option<hold::HoldSpec>,
}
