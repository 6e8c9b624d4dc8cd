use super::*;
use crate::tune::stats::Summary;
use crate::tune::{ConfigResult, Trial, TuneReport, finish, new_report};

fn trial(round: usize, v: f64) -> Trial {
    Trial {
        round,
        status: "ok".into(),
        throughput: Some(v),
        wall_s: 2.0,
        cpu_util_pct: 95.0,
        voluntary_cs_per_s: 10.0,
        involuntary_cs_per_s: 2.0,
        peak_rss_mib: 40.0,
        gpu_util_pct: None,
        gpu_mem_mib: None,
        message: None,
        stderr_tail: vec![],
    }
}

fn config(name: &str, v: &[f64]) -> ConfigResult {
    ConfigResult {
        trials: v.iter().enumerate().map(|(i, x)| trial(i, *x)).collect(),
        ..ConfigResult::new(name, format!("options of {name}"))
    }
}

pub fn sample() -> TuneReport {
    let mut r = new_report(vec!["threadwise-workload".into()], 2, "sysfs:/".into(), 2.0);
    r.unit = "samples/s".into();
    r.runs = 3;
    r.configs = vec![
        config("unset", &[1500.0, 1540.0, 1600.0]),
        config("threads=1", &[7400.0, 7500.0, 7600.0]),
        config("plan", &[7450.0, 7550.0, 7700.0]),
    ];
    r.baseline = Some("unset".into());
    r.complete = true;
    finish(&mut r);
    r
}

#[test]
fn json_round_trips() {
    let r = sample();
    let text = exporter("json").unwrap().render(&r);
    let back: TuneReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    assert_eq!(back.winner.as_deref(), Some("plan"));
    assert_eq!(
        back.configs[2].throughput,
        Some(Summary {
            median: 7550.0,
            min: 7450.0,
            max: 7700.0,
            n: 3
        })
    );
}

#[test]
fn snapshots() {
    let r = sample();
    insta::assert_snapshot!("tune_csv", exporter("csv").unwrap().render(&r));
    insta::assert_snapshot!("tune_markdown", exporter("markdown").unwrap().render(&r));
    insta::assert_snapshot!("tune_table", crate::tune::report::render(&r));
}

#[test]
fn svg_has_a_bar_per_config() {
    let svg = exporter("svg").unwrap().render(&sample());
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("threads=1") && svg.contains("plan") && svg.contains("unset"));
    assert!(svg.matches("<rect").count() >= 4, "background and 3 bars");
}

#[test]
fn atomic_write_replaces_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("r.json");
    write(&p, "one").unwrap();
    write(&p, "two").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        1,
        "no temporary left"
    );
}
