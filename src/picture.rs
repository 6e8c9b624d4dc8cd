//! The placement picture: the machine by package and NUMA node, one cell per
//! physical core, lettered (and, on a terminal, coloured) by the rank that
//! owns it: `A`, `B`, ... where the rank computes, `a`, `b`, ... where only its
//! DataLoader workers run, `.` an allowed core nobody uses, `x` a core this
//! process may not use. L3 groups are set apart by a space; GPUs and NICs are
//! listed at their node with the rank that drives them. It fits 80 columns up
//! to 256 CPUs and wraps beyond. `svg` draws the same picture for documents.
//! `top` reuses the layout (`layout`) for its per-CPU load strip.

use std::fmt::Write;

use crate::cpuset::CpuSet;
use crate::plan::Plan;
use crate::topology::Topology;

/// What one core is in a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cell {
    /// The rank computes here.
    Compute(usize),
    /// Only the rank's DataLoader workers run here.
    Workers(usize),
    Idle,
    Disallowed,
}

/// The letter of rank `r`: A-Z, then a second round as 0-9, then `#`.
pub(crate) fn rank_letter(r: usize) -> char {
    match r {
        0..=25 => (b'A' + r as u8) as char,
        26..=35 => (b'0' + (r - 26) as u8) as char,
        _ => '#',
    }
}

impl Cell {
    pub(crate) fn letter(self) -> char {
        match self {
            Cell::Compute(r) => rank_letter(r),
            Cell::Workers(r) => rank_letter(r).to_ascii_lowercase(),
            Cell::Idle => '.',
            Cell::Disallowed => 'x',
        }
    }
}

/// Each core's cell: the first rank whose compute CPUs meet it, else whose
/// worker CPUs do.
pub(crate) fn cell(topo: &Topology, plan: Option<&Plan>, cpus: &CpuSet) -> Cell {
    if !cpus.intersects(&topo.allowed_cpus) {
        return Cell::Disallowed;
    }
    let Some(p) = plan else { return Cell::Idle };
    for r in p.ranks.iter().filter(|r| r.bind) {
        // Workers that share the rank's cores leave them compute cores.
        let only_workers = r.cpus.difference(&r.worker_cpus);
        let compute = if only_workers.is_empty() {
            &r.cpus
        } else {
            &only_workers
        };
        if cpus.intersects(compute) {
            return Cell::Compute(r.local_rank);
        }
    }
    for r in p.ranks.iter().filter(|r| r.bind) {
        if cpus.intersects(&r.worker_cpus) {
            return Cell::Workers(r.local_rank);
        }
    }
    Cell::Idle
}

/// The machine as rows: (package, node, L3 groups of cores).
pub(crate) struct Layout {
    pub nodes: Vec<NodeRow>,
}

pub(crate) struct NodeRow {
    pub package: Option<usize>,
    pub node: usize,
    pub memory_bytes: u64,
    /// L3 groups (or one group), each a list of cores' CPU sets.
    pub groups: Vec<Vec<CpuSet>>,
}

/// Group the cores by NUMA node, then L3, in CPU order.
pub(crate) fn layout(topo: &Topology) -> Layout {
    let mut nodes = vec![];
    for n in topo.numa_nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let package = topo
            .packages
            .iter()
            .position(|p| p.cpus.intersects(&n.cpus));
        let cores: Vec<&CpuSet> = topo
            .cores
            .iter()
            .map(|c| &c.cpus)
            .filter(|c| c.intersects(&n.cpus))
            .collect();
        let mut groups: Vec<Vec<CpuSet>> = vec![];
        let l3s: Vec<&CpuSet> = topo
            .l3_groups
            .iter()
            .map(|g| &g.cpus)
            .filter(|g| g.intersects(&n.cpus))
            .collect();
        if l3s.len() > 1 {
            for g in l3s {
                groups.push(
                    cores
                        .iter()
                        .filter(|c| c.intersects(g))
                        .map(|c| (*c).clone())
                        .collect(),
                );
            }
        } else {
            groups.push(cores.iter().map(|c| (*c).clone()).collect());
        }
        groups.retain(|g| !g.is_empty());
        nodes.push(NodeRow {
            package,
            node: n.id,
            memory_bytes: n.memory_bytes,
            groups,
        });
    }
    Layout { nodes }
}

const COLOURS: [u8; 6] = [41, 42, 43, 44, 45, 46];

fn paint(c: Cell, colour: bool) -> String {
    let ch = c.letter();
    match (colour, c) {
        (true, Cell::Compute(r)) => format!("\x1b[30;{}m{ch}\x1b[0m", COLOURS[r % COLOURS.len()]),
        (true, Cell::Workers(r)) => {
            format!("\x1b[2;{}m{ch}\x1b[0m", COLOURS[r % COLOURS.len()] - 10)
        }
        (true, Cell::Disallowed) => format!("\x1b[2m{ch}\x1b[0m"),
        _ => ch.to_string(),
    }
}

/// Cells of one node as lines of at most `width` cells, L3 groups apart.
fn cell_lines(row: &NodeRow, cell_of: &dyn Fn(&CpuSet) -> String, width: usize) -> Vec<String> {
    let mut lines = vec![];
    let (mut line, mut used) = (String::new(), 0usize);
    for (gi, g) in row.groups.iter().enumerate() {
        if gi > 0 && used > 0 {
            if used + 1 >= width {
                lines.push(std::mem::take(&mut line));
                used = 0;
            } else {
                line.push(' ');
                used += 1;
            }
        }
        for c in g {
            if used >= width {
                lines.push(std::mem::take(&mut line));
                used = 0;
            }
            line.push_str(&cell_of(c));
            used += 1;
        }
    }
    if used > 0 {
        lines.push(line);
    }
    lines
}

fn devices_at(topo: &Topology, plan: Option<&Plan>, node: usize) -> Vec<String> {
    let mut out = vec![];
    for g in topo.gpus.iter().filter(|g| g.numa_node == Some(node)) {
        let owner = plan
            .and_then(|p| {
                p.ranks
                    .iter()
                    .find(|r| r.gpu.as_deref() == Some(g.bus_id.as_str()))
            })
            .map_or(String::new(), |r| format!(":{}", rank_letter(r.local_rank)));
        out.push(format!("gpu{}{owner}", g.index));
    }
    for n in topo.nics.iter().filter(|n| n.numa_node == Some(node)) {
        out.push(format!("nic{}", n.index));
    }
    out
}

/// The picture for a terminal (`colour`) or a log (letters only).
pub(crate) fn text(topo: &Topology, plan: Option<&Plan>, colour: bool) -> String {
    const INDENT: usize = 11;
    let width = 80 - INDENT;
    let mut out = String::new();
    match plan {
        Some(p) => {
            let _ = writeln!(
                out,
                "{} rank(s), policy {}, on {}",
                p.nproc, p.request.policy, topo.source
            );
        }
        None => {
            let _ = writeln!(out, "{}", topo.source);
        }
    }
    let l = layout(topo);
    let mut package = None;
    for row in &l.nodes {
        if row.package != package {
            let _ = writeln!(
                out,
                "package {}",
                row.package.map_or("?".into(), |p| p.to_string())
            );
            package = row.package;
        }
        let cell_of = |c: &CpuSet| paint(cell(topo, plan, c), colour);
        let lines = cell_lines(row, &cell_of, width);
        let devs = devices_at(topo, plan, row.node);
        let mem = format!("{:.0}G", row.memory_bytes as f64 / (1u64 << 30) as f64);
        for (i, cells) in lines.iter().enumerate() {
            let head = if i == 0 {
                format!("  node {:<3}", row.node)
            } else {
                " ".repeat(INDENT - 1)
            };
            let _ = writeln!(out, "{head:<10} {cells}");
        }
        let mut tail = vec![mem];
        tail.extend(devs);
        let _ = writeln!(out, "{} {}", " ".repeat(INDENT - 1), tail.join(" "));
    }
    // --roles: which of each rank's cores serve (main, pin-memory, comm).
    let roles: Vec<String> = plan
        .iter()
        .flat_map(|p| &p.ranks)
        .filter_map(|r| {
            let l = r.roles.as_ref()?;
            Some(format!(
                "{} service {} team {}",
                rank_letter(r.local_rank),
                l.service,
                l.team
            ))
        })
        .collect();
    if !roles.is_empty() {
        let _ = writeln!(out, "roles: {}", roles.join("; "));
    }
    // The legend says only what this picture can show: rank letters with a
    // plan, the machine's cores and devices without one.
    out.push_str(if plan.is_some() {
        "legend: one cell per core; A B ... a rank computes there; a b ... only that rank's\n\
         DataLoader workers run there; . idle; x not allowed; gpuN:A rank A drives GPU N\n"
    } else {
        "legend: one cell per core; . a core this process may use; x not allowed;\n\
         under each node its memory and the GPUs and NICs attached to it\n"
    });
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const SVG_FILL: [&str; 6] = [
    "#e4572e", "#29335c", "#f3a712", "#669bbc", "#a8c686", "#8c5383",
];

/// The same picture as a self-contained SVG.
pub(crate) fn svg(topo: &Topology, plan: Option<&Plan>) -> String {
    let (cw, ch, per_line, left) = (18u32, 22u32, 32usize, 90u32);
    let l = layout(topo);
    let mut body = String::new();
    let mut y = 40u32;
    for row in &l.nodes {
        let cores: Vec<&CpuSet> = row.groups.iter().flatten().collect();
        let lines = cores.len().div_ceil(per_line).max(1) as u32;
        let _ = writeln!(
            body,
            r#"<text x="8" y="{}" font-size="13">package {} node {}</text>"#,
            y + 15,
            row.package.map_or("?".into(), |p| p.to_string()),
            row.node
        );
        for (i, c) in cores.iter().enumerate() {
            let cx = left + (i % per_line) as u32 * cw;
            let cy = y + (i / per_line) as u32 * ch;
            let cell = cell(topo, plan, c);
            let (fill, opacity) = match cell {
                Cell::Compute(r) => (SVG_FILL[r % SVG_FILL.len()], "1"),
                Cell::Workers(r) => (SVG_FILL[r % SVG_FILL.len()], "0.4"),
                Cell::Idle => ("#ffffff", "1"),
                Cell::Disallowed => ("#bbbbbb", "1"),
            };
            let _ = writeln!(
                body,
                r##"<g><title>cpus {}</title><rect x="{cx}" y="{cy}" width="{}" height="{}" fill="{fill}" fill-opacity="{opacity}" stroke="#333"/><text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text></g>"##,
                esc(&c.to_string()),
                cw - 2,
                ch - 2,
                cx + cw / 2 - 1,
                cy + 15,
                esc(&cell.letter().to_string())
            );
        }
        let devs = devices_at(topo, plan, row.node).join(" ");
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" font-size="12">{}</text>"#,
            left + per_line as u32 * cw + 10,
            y + 15,
            esc(&devs)
        );
        y += lines * ch + 12;
    }
    let width = left + per_line as u32 * cw + 220;
    let title = match plan {
        Some(p) => format!(
            "{} rank(s), policy {}, on {}",
            p.nproc, p.request.policy, topo.source
        ),
        None => topo.source.clone(),
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{}\" font-family=\"monospace\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"8\" y=\"20\" font-size=\"14\">{}</text>\n{body}<text x=\"8\" y=\"{}\" font-size=\"11\">A B ...: a rank computes; a b ...: its DataLoader workers only; .: idle; x: not allowed</text>\n</svg>\n",
        y + 30,
        esc(&title),
        y + 12
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Facts, PlanRequest, plan};
    use crate::topology::synthetic;

    #[test]
    fn letters_and_cells() {
        assert_eq!(rank_letter(0), 'A');
        assert_eq!(rank_letter(25), 'Z');
        assert_eq!(rank_letter(26), '0');
        assert_eq!(rank_letter(99), '#');
        let t = synthetic::parse("core:4 allowed:0-2").unwrap();
        let p = plan(
            &t,
            &PlanRequest {
                nproc: crate::plan::NProc::Count(1),
                ..Default::default()
            },
            &Facts::default(),
        )
        .unwrap();
        let cells: Vec<char> = t
            .cores
            .iter()
            .map(|c| cell(&t, Some(&p), &c.cpus).letter())
            .collect();
        assert_eq!(cells[3], 'x');
        assert!(
            cells[..3].iter().all(|c| *c == 'A' || *c == 'a'),
            "{cells:?}"
        );
    }

    #[test]
    fn fits_80_columns_up_to_256_cpus_and_wraps_beyond() {
        for desc in ["package:2 numa:2 l3:4 core:8 pu:2", "package:1 core:512"] {
            let t = synthetic::parse(desc).unwrap();
            let pic = text(&t, None, false);
            for line in pic.lines() {
                assert!(
                    line.chars().count() <= 80,
                    "{desc}: {line:?} ({})",
                    line.len()
                );
            }
        }
        let big = text(
            &synthetic::parse("package:1 core:512").unwrap(),
            None,
            false,
        );
        assert!(
            big.lines().filter(|l| l.contains("....")).count() >= 8,
            "wrapped:\n{big}"
        );
    }

    #[test]
    fn svg_is_valid_xml() {
        let t = synthetic::parse("package:2 numa:2 core:4 pu:2 gpu:2").unwrap();
        let p = plan(&t, &PlanRequest::default(), &Facts::default()).unwrap();
        let s = svg(&t, Some(&p));
        let doc = roxmltree::Document::parse(&s).expect("valid XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
        assert_eq!(rects, 1 + t.cores.len(), "background and one per core");
    }
}
