use super::*;
use crate::tune::outcome::finish;
use crate::tune::stats::Summary;
use crate::tune::{ConfigResult, Trial, TuneReport, new_report};

fn trial(round: usize, v: f64) -> Trial {
    Trial {
        round,
        status: crate::tune::TrialStatus::Ok,
        throughput: Some(v),
        wall_s: 2.0,
        cpu_util_pct: 95.0,
        voluntary_cs_per_s: 10.0,
        involuntary_cs_per_s: 2.0,
        peak_rss_mib: 40.0,
        gpu_util_pct: None,
        gpu_mem_mib: None,
        gpu_job_mem_mib: None,
        gpu_others: vec![],
        message: None,
        stderr_tail: vec![],
        hit: None,
        outlier: false,
        seq: 0,
        ratio: None,
        outside_cpu_s: Some(0.04),
        steal_s: Some(0.0),
        disturbance: Some(0.01),
        disturbed: false,
        nodes: vec![],
        weight: None,
        figures: Default::default(),
    }
}

fn role_of(name: &str) -> crate::tune::grid::Role {
    use crate::tune::grid::Role;
    match name {
        "unset" => Role::Baseline,
        "plan" => Role::Plan,
        _ => Role::Guide,
    }
}

fn config(name: &str, v: &[f64]) -> ConfigResult {
    ConfigResult {
        trials: v.iter().enumerate().map(|(i, x)| trial(i, *x)).collect(),
        ..ConfigResult::new(name, role_of(name), format!("options of {name}"))
    }
}

pub(super) fn sample() -> TuneReport {
    let mut r = new_report(vec!["threadwise-workload".into()], 2, "sysfs:/".into(), 2.0);
    r.unit = "samples/s".into();
    r.runs = 3;
    r.configs = vec![
        config("unset", &[1500.0, 1540.0, 1600.0]),
        ConfigResult {
            same_launch: vec!["plan policy=none".into()],
            ..config("threads=1", &[7400.0, 7500.0, 7600.0])
        },
        config("plan", &[7450.0, 7550.0, 7700.0]),
    ];
    r.baseline = Some("unset".into());
    r.complete = true;
    finish(&mut r);
    r
}

fn render(f: ReportFormat, r: &TuneReport) -> String {
    f.exporter().render(r, &()).unwrap()
}

#[test]
fn json_round_trips() {
    let r = sample();
    let text = render(ReportFormat::Json, &r);
    let back: TuneReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    assert_eq!(back.winner.as_deref(), Some("plan"));
    let t: Summary = back.configs[2].throughput.unwrap();
    assert_eq!(
        (t.median, t.min, t.max, t.n, t.mad),
        (7550.0, 7450.0, 7700.0, 3, 100.0)
    );
    assert!(t.ci_low >= t.min && t.ci_high <= t.max && t.ci_low <= t.median);
}

#[test]
fn snapshots() {
    let r = sample();
    insta::assert_snapshot!("tune_csv", render(ReportFormat::Csv, &r));
    insta::assert_snapshot!("tune_markdown", render(ReportFormat::Markdown, &r));
    insta::assert_snapshot!("tune_table", crate::tune::report::render(&r));
}

/// Names from --config may hold what each format must escape.
fn hostile() -> TuneReport {
    let mut r = sample();
    r.configs[1].name = "a|b, \"c\" <d&e>".into();
    r.configs[1].options = "x\ny".into();
    finish(&mut r);
    r
}

#[test]
fn markdown_escapes_cell_separators() {
    let md = render(ReportFormat::Markdown, &hostile());
    let row = md.lines().find(|l| l.contains("a\\|b")).unwrap();
    // Every row has the header's number of unescaped separators.
    let cells = |l: &str| l.replace("\\|", "").matches('|').count();
    assert_eq!(cells(row), cells(md.lines().next().unwrap()), "{row}");
}

#[test]
fn csv_quotes_through_the_csv_crate_and_reads_back() {
    let text = render(ReportFormat::Csv, &hostile());
    let mut rd = ::csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<::csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 9);
    assert!(
        rows.iter()
            .any(|r| &r[0] == "a|b, \"c\" <d&e>" && &r[1] == "x\ny")
    );
}

#[test]
fn svg_is_valid_xml_with_a_bar_per_config() {
    let svg = render(ReportFormat::Svg, &hostile());
    let doc = roxmltree::Document::parse(&svg).expect("valid XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let text: String = doc
        .descendants()
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        text.contains("a|b, \"c\" <d&e>") && text.contains("unset"),
        "{text}"
    );
    assert!(svg.matches("<rect").count() >= 4, "background and 3 bars");
}
