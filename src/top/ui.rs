//! The terminal view (ratatui): one row per rank against its plan, the CPUs
//! as a load strip in the placement picture's layout, and the alerts. `q`
//! or Esc quits; Ctrl-C is passed to the process as SIGINT (so under
//! `run --top` it stops the ranks as it would without the view).

use std::time::Duration;

use ratatui::Frame;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, Wrap};

use super::{Sampler, Target, View};
use crate::picture::rank_letter;
use crate::topology::Topology;

fn load_colour(pct: f64) -> Color {
    match pct {
        p if p >= 90.0 => Color::Red,
        p if p >= 60.0 => Color::Yellow,
        p if p >= 20.0 => Color::Green,
        _ => Color::DarkGray,
    }
}

/// The per-CPU strip: each CPU lettered by the rank planned there (`.` none),
/// coloured by how busy it was, node by node.
fn cpu_strip<'a>(topo: &Topology, targets: &[Target], v: &View) -> Vec<Line<'a>> {
    let mut lines = vec![];
    for n in topo.numa_nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let mut spans = vec![Span::raw(format!("node {:<3} ", n.id))];
        for (i, cpu) in n.cpus.iter().enumerate() {
            if i > 0 && i % 64 == 0 {
                lines.push(Line::from(std::mem::take(&mut spans)));
                spans.push(Span::raw("         "));
            }
            let owner = targets
                .iter()
                .find(|t| t.cpus.contains(cpu))
                .map_or('.', |t| rank_letter(t.local_rank));
            let busy = v.cpu_busy_pct.get(&cpu).copied().unwrap_or(0.0);
            spans.push(Span::styled(
                owner.to_string(),
                Style::default().fg(Color::Black).bg(load_colour(busy)),
            ));
        }
        lines.push(Line::from(spans));
    }
    lines
}

/// Draw one view.
pub(crate) fn draw(f: &mut Frame, topo: &Topology, targets: &[Target], v: &View) {
    let strip = cpu_strip(topo, targets, v);
    let areas = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(4),
        Constraint::Length(strip.len() as u16 + 2),
        Constraint::Length((v.alerts.len().clamp(1, 8) + 2) as u16),
    ])
    .split(f.area());
    f.render_widget(
        Paragraph::new(format!(
            "threadwise top: {} rank(s), every {:.1} s; q quits",
            v.ranks.len(),
            v.interval_s
        ))
        .style(Style::default().add_modifier(Modifier::BOLD)),
        areas[0],
    );
    f.render_widget(rank_table(v), areas[1]);
    f.render_widget(
        Paragraph::new(strip).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" CPUs: planned rank, busy (grey <20% green yellow red >90%) "),
        ),
        areas[2],
    );
    f.render_widget(
        Paragraph::new(alert_lines(v))
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL).title(" alerts ")),
        areas[3],
    );
}

/// The ranks' table: a row a rank, red where it ran off its plan.
fn rank_table(v: &View) -> Table<'static> {
    let header = Row::new([
        "rank",
        "pid",
        "cpu% usr/sys",
        "thr",
        "run",
        "cs/s vol/inv",
        "planned",
        "ran on",
        "RSS MiB",
        "local%",
        "gpu% mem",
        "held",
        "workers (cpus)",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let rows: Vec<Row> = v
        .ranks
        .iter()
        .map(|r| {
            let workers = if r.workers.is_empty() {
                "-".to_string()
            } else {
                let cpus: Vec<String> = r.workers.iter().map(|w| w.ran_on.to_string()).collect();
                format!("{} ({})", r.workers.len(), cpus.join(" "))
            };
            let off = !r.ran_on.is_subset(&r.planned);
            Row::new([
                format!("{}", rank_letter(r.local_rank)),
                r.pid.to_string(),
                if r.alive {
                    format!("{:.0}/{:.0}", r.cpu_user_pct, r.cpu_sys_pct)
                } else {
                    "exited".into()
                },
                r.threads.to_string(),
                r.runnable.to_string(),
                format!("{:.0}/{:.0}", r.voluntary_cs_per_s, r.involuntary_cs_per_s),
                r.planned.to_string(),
                r.ran_on.to_string(),
                format!("{:.0}", r.rss_mib),
                r.local_pages_pct.map_or("-".into(), |p| format!("{p:.0}")),
                r.gpu.as_ref().map_or("-".into(), |g| {
                    format!(
                        "{} {:.0}M",
                        g.util_pct.map_or("?".into(), |u| format!("{u:.0}")),
                        g.mem_mib
                    )
                }),
                // Threads off their role's CPUs now / corrections run made.
                format!(
                    "{}/{}",
                    r.by_thread
                        .iter()
                        .filter(|t| !t.cpus.is_subset(&t.role_cpus))
                        .count(),
                    r.by_thread.iter().map(|t| t.corrections).sum::<u32>()
                ),
                workers,
            ])
            .style(if off {
                Style::default().fg(Color::Red)
            } else {
                Style::default()
            })
        })
        .collect();
    let widths = [
        Constraint::Length(4),
        Constraint::Length(8),
        Constraint::Length(12),
        Constraint::Length(4),
        Constraint::Length(4),
        Constraint::Length(12),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Min(10),
    ];
    Table::new(rows, widths)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(" ranks "))
}

/// The alerts, or "no alerts".
fn alert_lines(v: &View) -> Vec<Line<'static>> {
    if v.alerts.is_empty() {
        vec![Line::from("no alerts")]
    } else {
        v.alerts
            .iter()
            .map(|a| {
                Line::from(vec![
                    Span::styled(
                        format!("{:<15}", a.kind.name()),
                        Style::default().fg(Color::Red),
                    ),
                    Span::raw(a.reason.clone()),
                ])
            })
            .collect()
    }
}

/// Whether the live view can draw here: standard output a terminal, and a
/// controlling terminal to read keys from. Without one (a CI job, `ssh`
/// without `-t`, output to a file) the reason.
pub(crate) fn terminal() -> Result<(), String> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err("standard output is not a terminal".into());
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map(drop)
        .map_err(|e| format!("no controlling terminal to read keys from (/dev/tty: {e})"))
}

/// Run the view until `q`, Esc, or `done()` (the watched run ended).
pub(crate) fn run(
    topo: &Topology,
    sampler: &mut Sampler,
    interval: Duration,
    done: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    terminal().map_err(std::io::Error::other)?;
    let mut term = ratatui::try_init()?;
    let result = (|| -> std::io::Result<()> {
        let mut v = sampler.sample();
        loop {
            let targets = sampler.targets().to_vec();
            term.draw(|f| draw(f, topo, &targets, &v))?;
            let until = std::time::Instant::now() + interval;
            while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
                if event::poll(left)?
                    && let Event::Key(k) = event::read()?
                    && k.kind == KeyEventKind::Press
                {
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            // SAFETY: plain syscall: our own SIGINT handler decides.
                            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                            return Ok(());
                        }
                        _ => {}
                    }
                }
            }
            if done() {
                return Ok(());
            }
            v = sampler.sample();
        }
    })();
    ratatui::restore();
    result
}
