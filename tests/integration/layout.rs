//! The source's layout holds to CONTRIBUTING.md: no import cycle between
//! files (a `mod.rs` that declares and dispatches to its own children is one
//! unit with them), no folder of `src/` over 20% of the non-test lines, no
//! module outside the rendezvous naming its insides, and tune and top
//! reaching a launch only through the job's entry point and its events.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every library source file, by module path, with its non-test text.
fn modules() -> BTreeMap<Module, (PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    let mut out = BTreeMap::new();
    for p in files {
        let rel = p.strip_prefix(&src).unwrap().with_extension("");
        let mut m: Module = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if m[0] == "bin" || m[0] == "main" {
            continue;
        }
        if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
            m.pop();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // Test code: whole test files, and a file's own test module at its end.
        let last = m.last().map(String::as_str).unwrap_or("");
        if last == "tests"
            || last.ends_with("_tests")
            || last.starts_with("tests_")
            || m.contains(&"tests".to_string())
        {
            continue;
        }
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        let code: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(m, (p, code));
    }
    out
}

/// `a::b::c` paths in `code` after `start` (`crate::` or `super::`...).
fn paths_after<'a>(code: &'a str, start: &'a str) -> impl Iterator<Item = Vec<String>> + 'a {
    code.match_indices(start).filter_map(move |(i, _)| {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            return None;
        }
        let rest = &code[i + start.len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let segs: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        (!segs.is_empty()).then_some(segs)
    })
}

/// Which file each file names: `crate::...`, `super::...`, and a `mod.rs`'s
/// own children by name.
fn edges(mods: &BTreeMap<Module, (PathBuf, String)>) -> BTreeMap<Module, BTreeSet<Module>> {
    let resolve = |path: &[String]| -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|m| mods.contains_key(m))
    };
    let mut out: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, (p, code)) in mods {
        let dir_mod = matches!(p.file_stem().and_then(|s| s.to_str()), Some("mod" | "lib"));
        let parent: Module = if dir_mod {
            m.clone()
        } else {
            m[..m.len() - 1].to_vec()
        };
        let mut refs: Vec<Vec<String>> = paths_after(code, "crate::").collect();
        for segs in paths_after(code, "super::") {
            let ups = 1 + segs.iter().take_while(|s| *s == "super").count();
            let rest: Vec<String> = segs.into_iter().skip_while(|s| s == "super").collect();
            // `super` of a mod.rs's module is its parent; of a file, its folder's.
            let base = if dir_mod { m.clone() } else { parent.clone() };
            if base.len() >= ups {
                let mut r = base[..base.len() - ups].to_vec();
                r.extend(rest);
                refs.push(r);
            }
        }
        if dir_mod {
            for line in code.lines() {
                let l = line.trim();
                let Some(name) = l
                    .strip_prefix("pub(crate) mod ")
                    .or_else(|| l.strip_prefix("mod "))
                    .and_then(|r| r.strip_suffix(';'))
                else {
                    continue;
                };
                for segs in paths_after(code, &format!("{name}::")) {
                    let mut r = m.clone();
                    r.push(name.to_string());
                    r.extend(segs);
                    refs.push(r);
                }
            }
        }
        for r in refs {
            if let Some(t) = resolve(&r)
                && &t != m
                // A mod.rs dispatching to its own children is one unit with them.
                && !(dir_mod && t.starts_with(m))
            {
                out.entry(m.clone()).or_default().insert(t);
            }
        }
    }
    out
}

#[test]
fn no_import_cycle_between_files() {
    let mods = modules();
    let e = edges(&mods);
    // A cycle exists where a file reaches itself.
    let mut cycles = vec![];
    for start in mods.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Module> = e.get(start).into_iter().flatten().cloned().collect();
        while let Some(n) = stack.pop() {
            if &n == start {
                cycles.push(start.join("/"));
                break;
            }
            if seen.insert(n.clone()) {
                stack.extend(e.get(&n).into_iter().flatten().cloned());
            }
        }
    }
    assert!(cycles.is_empty(), "files on an import cycle: {cycles:?}");
    // And between the top-level modules.
    let top = |m: &Module| m.first().cloned().unwrap_or_default();
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in &e {
        for b in bs {
            if !a.is_empty() && !b.is_empty() && top(a) != top(b) {
                tops.entry(top(a)).or_default().insert(top(b));
            }
        }
    }
    for (a, bs) in &tops {
        for b in bs {
            assert!(
                !tops.get(b).is_some_and(|x| x.contains(a)),
                "top-level modules {a} and {b} name each other"
            );
        }
    }
}

#[test]
fn no_folder_holds_more_than_a_fifth_of_the_source() {
    let mods = modules();
    let lines = |c: &str| c.lines().filter(|l| !l.trim().is_empty()).count();
    let total: usize = mods.values().map(|(_, c)| lines(c)).sum();
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for (m, (p, c)) in &mods {
        if m.len() > 1 || p.file_stem().is_some_and(|s| s == "mod") {
            *by.entry(m[0].clone()).or_default() += lines(c);
        }
    }
    for (folder, n) in &by {
        assert!(
            *n * 5 <= total,
            "src/{folder}/ holds {n} of {total} non-test lines ({:.0}%)",
            100.0 * *n as f64 / total as f64
        );
    }
}

#[test]
fn the_rendezvous_and_the_launch_are_reached_through_their_doors() {
    let mods = modules();
    let mut wrong = vec![];
    for (m, (_, code)) in &mods {
        let top = m.first().map(String::as_str).unwrap_or("");
        for segs in paths_after(code, "crate::") {
            let first = segs[0].as_str();
            // Outside the rendezvous: only what its mod.rs gives (and its
            // authentication, which the command line configures).
            if top != "rdzv"
                && first == "rdzv"
                && segs.len() > 2
                && segs[1] != "auth"
                && segs[1] != "local"
            {
                wrong.push(format!("{}: crate::{}", m.join("/"), segs.join("::")));
            }
            if matches!(top, "tune" | "doctor") && first == "rdzv" {
                wrong.push(format!("{}: crate::{}", m.join("/"), segs.join("::")));
            }
            // tune and top: a launch only through the job's entry points.
            if matches!(top, "tune" | "top") && matches!(first, "launch" | "proc" | "rdzv") {
                wrong.push(format!("{}: crate::{}", m.join("/"), segs.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "reached past a door: {wrong:#?}");
}

/// Unit tests have one layout: a module's tests are its child `tests`
/// (inline, `tests.rs`, or a `tests/` folder), never a sibling of another
/// name (`door_tests.rs`, `tests_model.rs`).
#[test]
fn unit_tests_have_one_layout() {
    let mut odd = vec![];
    fn walk(dir: &Path, odd: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, odd);
                continue;
            }
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let in_tests = p
                .parent()
                .and_then(|d| d.file_name())
                .is_some_and(|d| d == "tests");
            let rust = p.extension().is_some_and(|x| x == "rs");
            if rust && stem.contains("test") && stem != "tests" && !in_tests {
                odd.push(p.display().to_string());
            }
        }
    }
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut odd);
    assert!(
        odd.is_empty(),
        "test files outside a `tests` module: {odd:?}"
    );
}
