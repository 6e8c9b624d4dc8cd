//! The cross-field checks of what the user typed, in one place and before
//! anything starts (ripgrep's low/high args split): clap checks each value on
//! its own; what depends on several options, on the plan or on the files
//! named is checked here, so a mistake never shows up after minutes of tuning
//! or half a launch.

use std::path::PathBuf;

use super::Failure;
use super::args::{RunCmd, TuneCmd};
use crate::files::check_output;

/// `run` before planning: a multi-node job needs its rendezvous endpoint.
pub fn check_run(a: &RunCmd) -> Result<(), Failure> {
    if a.plan.nnodes > 1 && a.rdzv_endpoint.is_none() {
        return Err(Failure::usage(
            format!("--nnodes {} needs --rdzv-endpoint HOST:PORT", a.plan.nnodes),
            "every node gives the same endpoint, e.g. --rdzv-endpoint node0:29400",
        ));
    }
    if let Some(e) = &a.rdzv_endpoint {
        let ok = e
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            return Err(Failure::usage(
                format!("--rdzv-endpoint {e:?}: expected HOST:PORT"),
                "e.g. --rdzv-endpoint node0:29400",
            ));
        }
    }
    Ok(())
}

/// `run` once the plan is known: the filter names ranks that exist.
pub fn check_run_plan(a: &RunCmd, nproc: usize) -> Result<(), Failure> {
    if let Some(f) = &a.local_ranks_filter
        && let Some(bad) = f.iter().find(|r| **r >= nproc)
    {
        return Err(Failure::usage(
            format!(
                "--local-ranks-filter names rank {bad}, but there are {nproc} ranks (0-{})",
                nproc - 1
            ),
            "list local ranks below --nproc-per-node",
        ));
    }
    Ok(())
}

/// `tune`: every file it will write can be written, and the built-in
/// workload's sizes fit, before the first trial.
pub fn check_tune(a: &TuneCmd) -> Result<(), Failure> {
    if a.command.is_empty()
        && let Some(mib) =
            crate::workload::activations_too_big(a.work_size, a.work_batch, a.work_layers)
    {
        return Err(Failure::usage(
            format!(
                "--work-size {} --work-batch {} --work-layers {} would hold {mib} MiB of \
                 activations per rank (at most {} MiB)",
                a.work_size,
                a.work_batch,
                a.work_layers,
                crate::workload::MAX_BYTES >> 20
            ),
            "make them smaller",
        ));
    }
    let files: [(&str, &Option<PathBuf>); 5] = [
        ("--export-json", &a.export_json),
        ("--export-csv", &a.export_csv),
        ("--export-markdown", &a.export_markdown),
        ("--export-svg", &a.export_svg),
        ("--save-plan", &a.save_plan),
    ];
    let mut seen: Vec<&PathBuf> = vec![];
    for (flag, path) in files {
        let Some(path) = path else { continue };
        check_output(path).map_err(|e| Failure::usage(format!("{flag}: {e}"), e.hint()))?;
        if seen.contains(&path) {
            return Err(Failure::usage(
                format!("{flag} {}: another option writes there too", path.display()),
                "give each report its own file",
            ));
        }
        seen.push(path);
    }
    Ok(())
}

/// A warning when others may write in the log directory: they could plant
/// files where rank logs go (links are never followed, but a file of theirs
/// would be overwritten by root).
pub fn log_dir_warning(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    // SAFETY: plain syscall.
    let me = unsafe { libc::geteuid() };
    if m.mode() & 0o002 != 0 {
        Some(format!(
            "--log-dir {}: other users may write in it (mode {:o}); give a directory of your own",
            dir.display(),
            m.mode() & 0o7777
        ))
    } else if m.uid() != me && m.uid() != 0 {
        Some(format!(
            "--log-dir {}: owned by uid {}, not by you (uid {me}); its owner controls the files",
            dir.display(),
            m.uid()
        ))
    } else {
        None
    }
}
