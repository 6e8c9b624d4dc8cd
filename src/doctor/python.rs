//! The Python side, probed by running the interpreter once (bounded in time):
//! torch's version and build (CUDA, cuDNN), the OpenMP runtimes loaded into
//! one process after `import torch, numpy`, the threads a rank would start
//! with (compute, inter-op, torch.compile's compile workers), and what
//! `os.cpu_count()` tells DataLoader formulas.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{Area, Finding, Request, Severity};
use crate::topology::Topology;

const SCRIPT: &str = r#"
import json, os, sys
out = {"python": sys.version.split()[0], "cpu_count": os.cpu_count(),
       "affinity": len(os.sched_getaffinity(0))}
try:
    import torch
    out["torch"] = torch.__version__.split("+")[0]
    out["cuda"] = torch.version.cuda
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["threads"] = torch.get_num_threads()
    out["interop"] = torch.get_num_interop_threads()
    try:
        # Inductor sizes its compile-worker pool at import, from
        # TORCHINDUCTOR_COMPILE_THREADS or min(32, CPUs in the mask).
        from torch._inductor import config as inductor_config
        out["compile_threads"] = int(inductor_config.compile_threads)
        out["compile_threads_var"] = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    except Exception:
        pass
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import numpy
except Exception:
    pass
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split()
        if len(parts) >= 6:
            b = os.path.basename(parts[-1])
            if b.startswith(("libgomp", "libiomp5", "libomp.so", "libomp-", "libiomp")):
                libs.add(parts[-1])
out["openmp"] = sorted(libs)
print(json.dumps(out))
"#;

/// What the interpreter said.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct Probe {
    pub python: String,
    pub cpu_count: Option<usize>,
    pub affinity: Option<usize>,
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub cudnn: Option<u64>,
    pub threads: Option<usize>,
    /// torch's inter-op pool (`torch.get_num_interop_threads()`).
    #[serde(default)]
    pub interop: Option<usize>,
    /// The compile workers torch.compile would start (Inductor's `compile_threads`).
    #[serde(default)]
    pub compile_threads: Option<usize>,
    /// TORCHINDUCTOR_COMPILE_THREADS as the interpreter saw it.
    #[serde(default)]
    pub compile_threads_var: Option<String>,
    pub torch_error: Option<String>,
    #[serde(default)]
    pub openmp: Vec<String>,
}

/// Run `python` with the probe, at most `limit`; Err says why it was skipped.
pub(crate) fn probe(python: &Path, limit: Duration) -> Result<Probe, String> {
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {} s",
                    python.display(),
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|_| {
        format!(
            "{} printed no probe result (is it Python 3?)",
            python.display()
        )
    })
}

fn version_below(v: &str, major: u64, minor: u64) -> bool {
    let mut it = v.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u64>()
            .unwrap_or(0)
    });
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) < (major, minor)
}

pub(crate) fn findings(p: &Probe, topo: &Topology, req: &Request, out: &mut Vec<Finding>) {
    out.push(torch(p));
    out.extend(openmp(p));
    let n = super::checks::ranks(topo, req);
    threads_and_cpus(p, topo, n, out);
    out.extend(pools(p, topo, n));
}

/// Which torch imports, and whether it is as new as the guides ask.
fn torch(p: &Probe) -> Finding {
    match (&p.torch, &p.torch_error) {
        (Some(v), _) => {
            let build = format!(
                "torch {v}, CUDA {}, cuDNN {}, Python {}",
                p.cuda.as_deref().unwrap_or("none (CPU build)"),
                p.cudnn.map_or("none".into(), |c| c.to_string()),
                p.python
            );
            let old = version_below(v, 2, 1);
            let mut f = Finding::new(
                "python.torch",
                Area::Python,
                if old { Severity::Warn } else { Severity::Ok },
                if old {
                    format!("torch {v} is older than 2.1, which the guides ask for")
                } else {
                    format!("torch {v}")
                },
            )
            .evidence(build);
            if old {
                f = f.fix("pip install -U 'torch>=2.1'");
            }
            f
        }
        (None, e) => Finding::new(
            "python.torch",
            Area::Python,
            Severity::Info,
            format!("torch does not import in Python {}", p.python),
        )
        .evidence(e.clone().unwrap_or_default()),
    }
}

/// The OpenMP runtimes a rank loads: one, or several fighting.
fn openmp(p: &Probe) -> Option<Finding> {
    let kinds: Vec<&str> = p
        .openmp
        .iter()
        .map(|l| {
            let b = Path::new(l)
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("");
            if b.starts_with("libgomp") {
                "libgomp (GNU)"
            } else if b.starts_with("libiomp") {
                "libiomp5 (Intel)"
            } else {
                "libomp (LLVM)"
            }
        })
        .collect();
    let mut distinct = kinds.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > 1 {
        Some(
            Finding::new(
                "python.openmp",
                Area::Python,
                Severity::Fail,
                format!(
                    "{} OpenMP runtimes load into one process ({}): each keeps its own thread pool \
                     (oversubscription), and mixing them can crash",
                    distinct.len(),
                    distinct.join(", ")
                ),
            )
            .evidence(p.openmp.join(", "))
            .fix("install torch and numpy from one source (all pip, or all conda with the same OpenMP); \
                  conda: conda install nomkl, or pin intel-openmp/llvm-openmp to what torch uses"),
        )
    } else {
        distinct.first().map(|k| {
            Finding::new(
                "python.openmp",
                Area::Python,
                Severity::Ok,
                format!("one OpenMP runtime: {k}"),
            )
            .evidence(p.openmp.join(", "))
        })
    }
}

/// A rank's compute threads and os.cpu_count() against the CPU budget of `n` ranks.
fn threads_and_cpus(p: &Probe, topo: &Topology, n: usize, out: &mut Vec<Finding>) {
    if let Some(t) = p.threads {
        let per = (topo.cpu_budget / n as f64).max(1.0);
        if t as f64 > per * 1.01 {
            out.push(
                Finding::new(
                    "python.threads",
                    Area::Python,
                    Severity::Warn,
                    format!(
                        "a rank started here would run {t} compute threads; {n} rank(s) share {:.2} CPUs",
                        topo.cpu_budget
                    ),
                )
                .evidence(format!("torch.get_num_threads() = {t}"))
                .fix(format!("threadwise run -n {n} -- CMD   # or export OMP_NUM_THREADS={}", per.floor())),
            );
        }
    }
    if let (Some(c), Some(a)) = (p.cpu_count, p.affinity)
        && (c != a || topo.cpu_budget + 0.01 < c as f64)
    {
        out.push(
            Finding::new(
                "python.cpu-count",
                Area::Python,
                Severity::Warn,
                format!(
                    "os.cpu_count() says {c} but this process may use {a} CPUs (budget {:.2}): \
                     num_workers formulas built on it over-commit",
                    topo.cpu_budget
                ),
            )
            .evidence(format!("os.cpu_count() = {c}, len(os.sched_getaffinity(0)) = {a}"))
            .fix("use len(os.sched_getaffinity(0)) or THREADWISE_NUM_WORKERS (set by threadwise run)"),
        );
    }
}

/// The pools besides the compute threads that a rank started here would
/// start: torch's inter-op pool and torch.compile's compile workers, each
/// against one rank's share of the CPU budget.
fn pools(p: &Probe, topo: &Topology, n: usize) -> Option<Finding> {
    if p.interop.is_none() && p.compile_threads.is_none() {
        return None;
    }
    let per = (topo.cpu_budget / n as f64).max(1.0);
    let said = |v: Option<usize>| v.map_or("unknown".to_string(), |v| v.to_string());
    let evidence = format!(
        "torch.get_num_interop_threads() = {}, torch._inductor.config.compile_threads = {}{}",
        said(p.interop),
        said(p.compile_threads),
        p.compile_threads_var
            .as_ref()
            .map(|v| format!(" (TORCHINDUCTOR_COMPILE_THREADS={v})"))
            .unwrap_or_default()
    );
    let over: Vec<String> = [
        ("compile workers (torch.compile)", p.compile_threads),
        ("inter-op threads", p.interop),
    ]
    .iter()
    .filter_map(|(what, v)| {
        v.filter(|&v| v as f64 > per * 1.01)
            .map(|v| format!("{v} {what}"))
    })
    .collect();
    let f = if over.is_empty() {
        Finding::new(
            "python.pools",
            Area::Python,
            Severity::Ok,
            format!(
                "a rank started here would start {} compile worker(s) and {} inter-op thread(s): \
                 within its share of {per:.2} CPUs",
                said(p.compile_threads),
                said(p.interop)
            ),
        )
    } else {
        Finding::new(
            "python.pools",
            Area::Python,
            Severity::Warn,
            format!(
                "a rank started here would start {}; {n} rank(s) share {:.2} CPUs ({per:.2} each)",
                over.join(" and "),
                topo.cpu_budget
            ),
        )
        .fix(format!(
            "threadwise run -n {n} -- CMD   # sets TORCHINDUCTOR_COMPILE_THREADS; \
             threadwise.apply() or torch.set_num_interop_threads({}) sizes the inter-op pool; \
             or export TORCHINDUCTOR_COMPILE_THREADS={}",
            per.floor(),
            per.floor()
        ))
    };
    Some(f.evidence(evidence))
}
