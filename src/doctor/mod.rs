//! `threadwise doctor`: what on this machine and in this environment will slow
//! multi-process training down or break it, each finding with a stable id, a
//! severity, the evidence read and the exact fix. The checks are pure
//! functions of what `Sys` reads (files below a root, the environment, PATH,
//! limits), so every one is tested with fixtures; the OS is only in `sys.rs`
//! and the optional Python probe in `python.rs`. threadwise never changes the
//! machine: fixes are printed (`--fix`) or written to a file the user installs.

mod checks;
mod gpu;
mod machine;
pub(crate) mod python;
mod render;
pub(crate) mod sys;

use serde::{Deserialize, Serialize};

pub(crate) use render::{fix_script, human, sysctl_file};
pub(crate) use sys::{RealSys, Sys};

use crate::topology::Topology;

pub(crate) const DOCTOR_SCHEMA: &str = "threadwise.doctor/1";

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum Severity ("a severity,") {
        Ok => "ok",
        Info => "info",
        Warn => "warn",
        Fail => "fail",
    }
}

crate::named_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum Area ("an area,") {
        Threads => "threads",
        Container => "container",
        Memory => "memory",
        Cpu => "cpu",
        Network => "network",
        Allocator => "allocator",
        Tools => "tools",
        Gpu => "gpu",
        Python => "python",
    }
}

/// One thing doctor found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Finding {
    /// Stable, for scripts: `area.what`.
    pub id: String,
    pub area: Area,
    pub severity: Severity,
    /// One line: what it means for training.
    pub title: String,
    /// What was read, and where.
    pub evidence: String,
    /// Commands that fix it, copy-pasteable.
    pub fix: Option<String>,
    /// A sysctl setting that fixes it (`--fix --write FILE`).
    pub sysctl: Option<(String, String)>,
}

impl Finding {
    fn new(id: &str, area: Area, severity: Severity, title: impl Into<String>) -> Finding {
        Finding {
            id: id.to_string(),
            area,
            severity,
            title: title.into(),
            evidence: String::new(),
            fix: None,
            sysctl: None,
        }
    }
    fn evidence(mut self, e: impl Into<String>) -> Finding {
        self.evidence = e.into();
        self
    }
    fn fix(mut self, f: impl Into<String>) -> Finding {
        self.fix = Some(f.into());
        self
    }
    fn sysctl(mut self, key: &str, value: &str) -> Finding {
        self.sysctl = Some((key.into(), value.into()));
        self.fix
            .get_or_insert_with(|| format!("sysctl -w {key}={value}"));
        self
    }
}

/// What the checks are asked about.
#[derive(Debug, Clone, Default)]
pub(crate) struct Request {
    /// Local ranks the user means to start (default: one per GPU, else 1).
    pub nproc: Option<usize>,
    /// DataLoader workers per rank, for /dev/shm sizing (default 4).
    pub workers: Option<usize>,
    /// `--rdzv-endpoint HOST:PORT` of a multi-node job.
    pub rdzv_endpoint: Option<String>,
    /// `run`'s quick checks: no NVML (its start-up can take 100 ms and more
    /// on a GPU node), no tool lookups.
    pub quick: bool,
}

/// The whole report (`--json`, schema threadwise.doctor/1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    pub schema: String,
    pub source: String,
    pub findings: Vec<Finding>,
    /// The Python probe's state: "ran", "skipped: ..." or "not asked".
    pub python: String,
}

impl Report {
    /// The worst severity found.
    pub(crate) fn worst(&self) -> Severity {
        self.findings
            .iter()
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }
}

/// Run every check but the Python probe's (whose result, if any, is `py`).
pub(crate) fn diagnose(
    sys: &dyn Sys,
    topo: &Topology,
    req: &Request,
    py: Option<&python::Probe>,
) -> Vec<Finding> {
    let mut out = vec![];
    checks::threads(sys, topo, req, &mut out);
    checks::container(sys, topo, req, &mut out);
    machine::memory(sys, topo, &mut out);
    machine::cpu(sys, topo, &mut out);
    checks::network(sys, topo, req, &mut out);
    checks::allocator(sys, &mut out);
    if !req.quick {
        checks::tools(sys, &mut out);
        gpu::gpu(sys, topo, req, &mut out);
    }
    if let Some(p) = py {
        python::findings(p, topo, req, &mut out);
    }
    out.sort_by_key(|f| f.area);
    out
}

/// The checks `run` makes before it starts: fast ones only (no Python, no
/// name resolution), and only what is worth a line (warn, fail).
pub(crate) fn preflight(sys: &dyn Sys, topo: &Topology, nproc: usize) -> Vec<Finding> {
    let req = Request {
        nproc: Some(nproc),
        quick: true,
        ..Default::default()
    };
    diagnose(sys, topo, &req, None)
        .into_iter()
        .filter(|f| f.severity >= Severity::Warn)
        // run sets the thread variables itself: those findings are moot there.
        .filter(|f| f.area != Area::Threads || f.id == "threads.cpu0-trap")
        .collect()
}

/// `preflight` on this machine, said as warn and fail lines on stderr
/// (what `run` shows before it starts its ranks).
pub(crate) fn say_preflight(topo: &Topology, nproc: usize) {
    let sys = RealSys {
        root: std::path::Path::new("/").to_path_buf(),
    };
    for f in preflight(&sys, topo, nproc) {
        let fix = f
            .fix
            .as_deref()
            .map_or(String::new(), |x| format!(" (fix: {x})"));
        crate::say!(
            "threadwise: doctor: {} {}: {}{fix}",
            f.severity,
            f.id,
            f.title
        );
    }
}

#[cfg(test)]
mod tests;
