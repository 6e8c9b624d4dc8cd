//! `threadwise doctor`: probe, check, print (human, JSON, fix script), and
//! exit 1 when anything fails, for cluster prologs and CI.

use std::io::IsTerminal;
use std::path::PathBuf;

use super::args::DoctorCmd;
use super::settings::load;
use super::{Exit, Failure, SourceArgs, emit};
use crate::doctor::{self, DOCTOR_SCHEMA, RealSys, Report, Severity};
use crate::files::write_output;

fn python_probe(a: &DoctorCmd) -> (Option<doctor::python::Probe>, String) {
    if a.no_python {
        return (None, "skipped (--no-python)".into());
    }
    let python: Option<PathBuf> = a.python.clone().or_else(|| which::which("python3").ok());
    let Some(python) = python else {
        return (None, "skipped (no python3 on PATH; --python PATH)".into());
    };
    match doctor::python::probe(&python, a.python_timeout) {
        Ok(p) => (Some(p), format!("ran {}", python.display())),
        Err(e) => (None, format!("skipped ({e})")),
    }
}

pub(super) fn doctor(a: DoctorCmd) -> Result<Exit, Failure> {
    let source = SourceArgs {
        root: a.root.clone(),
        ..Default::default()
    };
    let topo = load(&source)?;
    let sys = RealSys {
        root: a.root.clone().unwrap_or_else(|| PathBuf::from("/")),
    };
    let req = doctor::Request {
        nproc: a.nproc,
        workers: a.workers,
        rdzv_endpoint: a.rdzv_endpoint.clone(),
        quick: false,
    };
    let (py, py_state) = python_probe(&a);
    let report = Report {
        schema: DOCTOR_SCHEMA.to_string(),
        source: topo.source.clone(),
        findings: doctor::diagnose(&sys, &topo, &req, py.as_ref()),
        python: py_state,
    };
    if a.fix {
        if let Some(path) = &a.write {
            match doctor::sysctl_file(&report) {
                Some(text) => {
                    write_output(path, text.as_bytes())?;
                    crate::say!(
                        "threadwise: wrote the sysctl settings to {} (install in /etc/sysctl.d/, then sysctl --system)",
                        path.display()
                    );
                }
                None => crate::say!("threadwise: no sysctl setting to write"),
            }
        }
        emit(&doctor::fix_script(&report))?;
    } else if a.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
        emit(&(text + "\n"))?;
    } else {
        let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        emit(&doctor::human(&report, colour, a.verbose))?;
    }
    Ok(if report.worst() == Severity::Fail {
        Exit(1)
    } else {
        Exit::OK
    })
}
