//! One node's ranks in one round, started and supervised to their end,
//! alike on one node and on many (`rounds`): what is said before they
//! start, their error files, the reporter's events, the output options.

use std::path::Path;
use std::sync::Arc;

use super::events::{Event, Level, Reporter, Shared, say};
use super::settings::RunSettings;
use crate::launch::env::current;
use crate::launch::output::{LineSink, OutputOptions};
use crate::launch::prepare::{self, ErrorFiles};
use crate::launch::supervise::{self, Held, Peer, RunOptions, Spawned};
use crate::launch::{LaunchError, RankLaunch};
use crate::proc::hold::Correction;

/// What `run` says before starting: replaced variables, a log directory
/// that will not hold.
pub(crate) fn before_start(s: &RunSettings, launches: &[RankLaunch], r: &dyn Reporter) {
    if let Some(note) = launches
        .first()
        .and_then(|l| prepare::overrides_note(l, &current))
    {
        say(r, Level::Note, note);
    }
    if let Some(w) = s.log_dir.as_deref().and_then(log_dir_warning) {
        say(r, Level::Warning, w);
    }
}

/// The round's hooks for the pids and the threads held in place, and its
/// line sink, all into `r`; `also` reads the lines too (tune's report of
/// global rank 0's throughput).
pub(super) fn hooks(
    r: &Shared,
    round: u32,
    log_dir: Option<&Path>,
    also: Option<LineSink>,
) -> (Spawned, Held, Option<LineSink>) {
    let (rep, dir) = (r.clone(), log_dir.map(Path::to_path_buf));
    let spawned = Spawned(Arc::new(move |ranks: &[(usize, i32)]| {
        rep.event(&Event::Started {
            round,
            ranks,
            log_dir: dir.as_deref(),
        })
    }));
    let rep = r.clone();
    let held = Held(Arc::new(move |local_rank, c: &Correction| {
        rep.event(&Event::Held {
            round,
            local_rank,
            correction: c,
        })
    }));
    let lines = r.lines().then(|| {
        let rep = r.clone();
        Arc::new(move |rank: usize, line: &str| rep.event(&Event::Line { rank, line })) as LineSink
    });
    let sink = match (lines, also) {
        (Some(a), Some(b)) => Some(Arc::new(move |rank: usize, line: &str| {
            a(rank, line);
            b(rank, line)
        }) as LineSink),
        (a, b) => a.or(b),
    };
    (spawned, held, sink)
}

/// Start this node's ranks and supervise them to the end; `errors` holds
/// their error files (and `errors.dir` is the log directory, if any).
pub(crate) fn supervise_node(
    s: &RunSettings,
    mut launches: Vec<RankLaunch>,
    errors: &ErrorFiles,
    peer: Option<Arc<dyn Peer>>,
    (round, rank_base): (u32, usize),
    (sink, duplicate): (Option<LineSink>, &[Option<LineSink>; 2]),
    r: &Shared,
) -> Result<supervise::Outcome, LaunchError> {
    errors.assign(&mut launches);
    for l in &mut launches {
        l.program = Some(s.program.clone());
    }
    let log_dir = errors.logs().map(Path::to_path_buf);
    let (on_spawned, on_held, sink) = hooks(r, round, log_dir.as_deref(), sink);
    let opts = RunOptions {
        grace: s.grace,
        output: OutputOptions {
            rank_base,
            prefix: s.prefix,
            show: s.show.clone(),
            sink,
            prefix_of: prefix_of(s, rank_base),
            duplicate: duplicate.clone(),
        },
        timeout: None,
        move_workers: s.move_workers,
        hold: s.hold,
        on_held: Some(on_held),
        on_spawned: Some(on_spawned),
        log_dir,
        peer,
    };
    let outcome = supervise::run(&launches, &opts);
    r.event(&Event::RoundEnded {
        round,
        outcome: outcome.as_ref().ok(),
    });
    outcome
}

/// torchrun's --log-line-prefix-template, rendered per local rank:
/// ${rank}, ${local_rank}, ${role_name}, ${hostname}.
fn prefix_of(
    s: &RunSettings,
    rank_base: usize,
) -> Option<Arc<dyn Fn(usize) -> String + Send + Sync>> {
    let t = s.torchrun.prefix_template.as_ref()?;
    let t = t
        .replace("${role_name}", &s.role)
        .replace("${hostname}", &crate::os::hostname());
    Some(Arc::new(move |local| {
        t.replace("${rank}", &(rank_base + local).to_string())
            .replace("${local_rank}", &local.to_string())
    }))
}

/// torchrun's --duplicate-std*-filters: every line holding one of the
/// filters, of any rank, also into DIR/filtered-stdout.log (stderr's into
/// filtered-stderr.log), created afresh once for the whole job (every round
/// writes on), without following a link there.
pub(super) fn duplicates(s: &RunSettings) -> Result<[Option<LineSink>; 2], LaunchError> {
    let t = &s.torchrun;
    let mut out: [Option<LineSink>; 2] = [None, None];
    for (i, name) in ["filtered-stdout.log", "filtered-stderr.log"]
        .iter()
        .enumerate()
    {
        let (Some(filters), Some(dir)) = (&t.duplicate[i], &t.dup_dir) else {
            continue;
        };
        let path = dir.join(name);
        let why = |e: String| LaunchError::LogFile {
            path: path.display().to_string(),
            why: e,
        };
        crate::files::create_private_dirs(dir).map_err(|e| why(e.to_string()))?;
        let file = crate::files::create_log(&path).map_err(|e| why(e.to_string()))?;
        let file = std::sync::Mutex::new(std::io::LineWriter::new(file));
        let filters = filters.clone();
        out[i] = Some(Arc::new(move |_rank, line: &str| {
            if filters.iter().any(|f| line.contains(f.as_str())) {
                use std::io::Write;
                let mut w = file.lock().unwrap_or_else(|e| e.into_inner());
                let _ = writeln!(w, "{line}");
            }
        }));
    }
    Ok(out)
}

/// A warning when others may write in the log directory: they could plant
/// files where rank logs go (links are never followed, but a file of theirs
/// would be overwritten by root).
pub(crate) fn log_dir_warning(dir: &Path) -> Option<String> {
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
