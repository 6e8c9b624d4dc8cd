//! docs/reference/ held to the binary: the exit-code table's commands exit
//! with the codes it names, and the JSON documents' keys are the tables'.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::scratch;

fn page(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/reference")
            .join(name),
    )
    .unwrap()
}

/// Runs `cmd` with sh in `dir`, this build's binaries first on PATH.
fn sh(cmd: &str, dir: &Path) -> std::process::Output {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_threadwise"))
        .parent()
        .unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    Command::new("sh")
        .args(["-c", cmd])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .unwrap()
}

/// A table row's first cell, when it is one backticked command, and the
/// second cell.
fn rows(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let first = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
            Some((first.to_string(), cells.get(1)?.trim().to_string()))
        })
        .collect()
}

#[test]
fn the_exit_code_table_is_what_the_binary_does() {
    let dir = scratch();
    let table: Vec<(String, String)> = rows(&page("exit-codes.md"))
        .into_iter()
        .filter(|(c, _)| c.starts_with("threadwise "))
        .collect();
    assert!(table.len() >= 10, "{table:?}");
    for (cmd, code) in &table {
        let out = sh(cmd, dir.path());
        assert_eq!(
            out.status.code().map(|c| c.to_string()).as_deref(),
            Some(code.as_str()),
            "`{cmd}`:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Bad input says what and what to do.
        if code == "2" || code == "3" {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.starts_with("error: "), "`{cmd}`: {err}");
        }
    }
}

/// One `## \`threadwise.X/1\`` section: its command, and the keys of each of
/// its tables (`""` the top level, else the path its `###` heading names)
/// with whether each is optional.
struct Section {
    schema: String,
    command: String,
    tables: Vec<(String, Vec<(String, bool)>)>,
}

fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = vec![];
    for part in text.split("\n## `").skip(1) {
        let schema = part.split('`').next().unwrap().to_string();
        let command = part
            .split("by `")
            .nth(1)
            .and_then(|r| r.split('`').next())
            .unwrap_or_default()
            .to_string();
        let mut tables = vec![];
        for (i, sub) in part.split("\n### `").enumerate() {
            let path = if i == 0 {
                String::new()
            } else {
                sub.split('`').next().unwrap().to_string()
            };
            let mut keys = vec![];
            for l in sub.lines().filter(|l| l.starts_with("| `")) {
                let cells: Vec<&str> = l.split(" | ").collect();
                let optional = cells.get(1).is_some_and(|c| c.contains("*optional*"));
                for k in cells[0].split('`').skip(1).step_by(2) {
                    keys.push((k.to_string(), optional));
                }
            }
            tables.push((path, keys));
        }
        out.push(Section {
            schema,
            command,
            tables,
        });
    }
    out
}

/// The object at `path` (`ranks[]`: the first element; `configs[].trials[]`).
fn at<'a>(doc: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    path.split('.').filter(|p| !p.is_empty()).fold(doc, |v, p| {
        let key = p.trim_end_matches("[]");
        let v = &v[key];
        if p.ends_with("[]") { &v[0] } else { v }
    })
}

#[test]
fn the_schema_reference_matches_the_binary() {
    let dir = scratch();
    let all = sections(&page("schemas.md"));
    let names: Vec<&str> = all.iter().map(|s| s.schema.as_str()).collect();
    assert_eq!(
        names,
        [
            "threadwise.topology/1",
            "threadwise.plan/1",
            "threadwise.bind/1",
            "threadwise.doctor/1",
            "threadwise.top/1",
            "threadwise.tune/1"
        ]
    );
    // A live rank for top.
    let mut live = Command::new(env!("CARGO_BIN_EXE_threadwise"))
        .args(["run", "-n", "1", "-q", "--", "sleep", "30"])
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    for s in &all {
        let out = sh(&s.command, dir.path());
        assert!(
            out.status.success() || s.schema == "threadwise.doctor/1",
            "`{}`: {}",
            s.command,
            String::from_utf8_lossy(&out.stderr)
        );
        let text = match s.command.split_once("--export-json ") {
            Some((_, rest)) => {
                std::fs::read(dir.path().join(rest.split_whitespace().next().unwrap())).unwrap()
            }
            None => out.stdout,
        };
        let doc: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("`{}`: not JSON: {e}", s.command));
        assert_eq!(doc["schema"], s.schema.as_str(), "`{}`", s.command);
        for (path, keys) in &s.tables {
            let obj = at(&doc, path)
                .as_object()
                .unwrap_or_else(|| panic!("{}: {path} is not an object", s.schema));
            let actual: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
            let documented: BTreeSet<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
            let missing: Vec<&&str> = actual.difference(&documented).collect();
            assert!(
                missing.is_empty(),
                "{} {path}: not documented: {missing:?}",
                s.schema
            );
            let stale: Vec<&str> = keys
                .iter()
                .filter(|(k, optional)| !optional && !actual.contains(k.as_str()))
                .map(|(k, _)| k.as_str())
                .collect();
            assert!(
                stale.is_empty(),
                "{} {path}: documented, not printed: {stale:?}",
                s.schema
            );
        }
    }
    let _ = live.kill();
    let _ = live.wait();
}
