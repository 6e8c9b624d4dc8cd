//! Doctor's outputs: the human report grouped by area (coloured on a
//! terminal), the fix script (`--fix`) and the sysctl.d file (`--fix --write`).

use super::{Finding, Report, Severity};

fn tag(s: Severity, colour: bool) -> String {
    let (code, word) = match s {
        Severity::Ok => ("32", "ok  "),
        Severity::Info => ("36", "info"),
        Severity::Warn => ("33", "warn"),
        Severity::Fail => ("1;31", "FAIL"),
    };
    if colour {
        format!("\x1b[{code}m{word}\x1b[0m")
    } else {
        word.to_string()
    }
}

/// The report for a person: by area, each finding with its evidence and fix.
pub(crate) fn human(r: &Report, colour: bool, verbose: bool) -> String {
    let mut out = format!("threadwise doctor on {}\n", r.source);
    let mut area = None;
    for f in &r.findings {
        if f.severity == Severity::Ok && !verbose {
            continue;
        }
        if area != Some(f.area) {
            out.push_str(&format!("\n{}\n", f.area));
            area = Some(f.area);
        }
        out.push_str(&format!(
            "  {} {}: {}\n",
            tag(f.severity, colour),
            f.id,
            f.title
        ));
        if !f.evidence.is_empty() {
            out.push_str(&format!("       evidence: {}\n", f.evidence));
        }
        if let Some(fix) = &f.fix {
            out.push_str(&format!("       fix: {fix}\n"));
        }
    }
    let count = |s: Severity| r.findings.iter().filter(|f| f.severity == s).count();
    out.push_str(&format!(
        "\n{} fail, {} warn, {} info, {} ok; python: {}{}\n",
        count(Severity::Fail),
        count(Severity::Warn),
        count(Severity::Info),
        count(Severity::Ok),
        r.python,
        if verbose {
            ""
        } else {
            " (--verbose shows the ok checks)"
        }
    ));
    out
}

/// A shell script of every fix, worst first (`--fix`).
pub(crate) fn fix_script(r: &Report) -> String {
    let mut fs: Vec<&Finding> = r.findings.iter().filter(|f| f.fix.is_some()).collect();
    fs.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let mut out = String::from(
        "#!/bin/sh\n# Fixes suggested by threadwise doctor; read before running. threadwise changes nothing itself.\n",
    );
    for f in fs {
        out.push_str(&format!(
            "\n# {} {}: {}\n{}\n",
            f.severity,
            f.id,
            f.title,
            f.fix.as_deref().unwrap_or("")
        ));
    }
    out
}

/// The sysctl settings as a sysctl.d file (`--fix --write FILE`), or None
/// when nothing needs one.
pub(crate) fn sysctl_file(r: &Report) -> Option<String> {
    let settings: Vec<&Finding> = r.findings.iter().filter(|f| f.sysctl.is_some()).collect();
    if settings.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# Written by threadwise doctor --fix --write: kernel settings for multi-process training.\n\
         # Install as /etc/sysctl.d/90-threadwise.conf, then: sysctl --system\n",
    );
    for f in settings {
        let (k, v) = f.sysctl.as_ref().expect("filtered");
        out.push_str(&format!("\n# {}: {}\n{k} = {v}\n", f.id, f.title));
    }
    Some(out)
}
