//! `threadwise topo` and `threadwise plan`: read the topology, plan, print.

use super::args::{PlanCmd, TopoArgs};
use super::settings::{load, request, source, topology_failure};
use super::{Exit, Failure, emit};
use crate::export::{Context, PlanFormat};
use crate::host::facts;
use crate::plan;
use crate::topology::probe;
use crate::topology::{Topology, render};

/// Colour on a terminal, unless NO_COLOR.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// `--svg FILE`, written the safe way.
fn write_svg(
    path: Option<&std::path::Path>,
    t: &Topology,
    p: Option<&plan::Plan>,
) -> Result<(), Failure> {
    if let Some(path) = path {
        crate::files::write_output(path, crate::picture::svg(t, p).as_bytes())?;
    }
    Ok(())
}

pub(super) fn topo(a: TopoArgs) -> Result<Exit, Failure> {
    // topo shows everything, NVML's view included.
    let t = probe::topology_with(&source(&a.source), crate::topology::gpus::NvmlUse::Always)
        .map_err(topology_failure)?;
    write_svg(a.svg.as_deref(), &t, None)?;
    if a.picture {
        return emit(&crate::picture::text(&t, None, colour()));
    }
    if a.json {
        let text = serde_json::to_string_pretty(&t)
            .map_err(|e| Failure::env(e.to_string(), "report this bug"))?;
        emit(&(text + "\n"))
    } else {
        emit(&render::render(&t))
    }
}

/// How to call this binary again in printed command lines.
pub(super) fn program_name() -> String {
    std::env::args()
        .next()
        .filter(|p| !p.contains('/'))
        .unwrap_or_else(|| "threadwise".to_string())
}

pub(super) fn plan(a: PlanCmd) -> Result<Exit, Failure> {
    let t = load(&a.source)?;
    let req = request(&a.plan);
    let p = plan::plan(&t, &req, &facts(&req))?;
    write_svg(a.svg.as_deref(), &t, Some(&p))?;
    if a.picture {
        return emit(&crate::picture::text(&t, Some(&p), colour()));
    }
    let format = if a.json { PlanFormat::Json } else { a.format };
    let ctx = Context {
        command: a.command,
        local_rank: a.local_rank,
        explain: a.explain,
        program: program_name(),
    };
    let text = format
        .exporter()
        .render(&p, &ctx)
        .map_err(|e| Failure::usage(e.to_string(), "see threadwise plan --help"))?;
    emit(&text)
}
