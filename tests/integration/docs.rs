//! The docs' command examples, run: every `threadwise topo|plan|doctor|man|
//! completions` line in a code block of README.md and docs/*.md runs against
//! the real binary and must succeed (doctor: 0, or 1 for a failing check it
//! found). Placeholders become real inputs (`DIR`/`DUMP` a vendored machine
//! dump, `node.xml` an hwloc export), paths outside the scratch directory
//! move into it, `| man -l -` becomes `| cat`. An example that needs more
//! cores than this machine has (`plan -n 8` on 2 cores) runs again on a
//! synthetic machine, as the docs' figures were made. `run`, `bind`, `tune`
//! and `top` lines run in docs_launch.rs.

use std::path::Path;
use std::process::Command;

use super::{extract_dump, scratch, topologies};

/// The machine an example that asks for more than this one runs on.
const BIGGER: &str = "package:2 numa:2 l3:2 core:8 pu:2";

/// The pages whose examples run: README.md and every page under docs/.
pub(super) fn pages() -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![];
    walk(&root.join("docs"), &mut docs);
    docs.sort();
    let mut files = vec![root.join("README.md")];
    files.extend(docs);
    files
}

/// Every command line in a shell code block (not ```python, ```yaml) of the
/// pages that starts threadwise, on its own or under a launcher, with
/// continuation lines joined, and the file it is in.
pub(super) fn all_command_lines() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![];
    for f in pages() {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.strip_prefix(root).unwrap().display().to_string();
        // Code blocks: the text between ``` fences, its first line the info string.
        for (i, block) in text.split("```").enumerate() {
            let info = block.lines().next().unwrap_or_default().trim();
            if i % 2 == 0 || ["python", "yaml", "json"].contains(&info) {
                continue;
            }
            let joined = block.replace("\\\n", " ");
            for line in joined.lines().skip(1) {
                let l = line.split_whitespace().collect::<Vec<_>>().join(" ");
                if !l.starts_with('#')
                    && (l.starts_with("threadwise ") || l.contains(" threadwise "))
                {
                    out.push((name.clone(), l));
                }
            }
        }
    }
    out
}

/// The offline examples: `threadwise topo|plan|doctor|man|completions` lines.
fn examples() -> Vec<(String, String)> {
    let words = ["topo", "plan", "doctor", "man", "completions"];
    all_command_lines()
        .into_iter()
        .filter(|(_, l)| {
            words
                .iter()
                .any(|w| l.starts_with(&format!("threadwise {w}")))
        })
        .collect()
}

/// The line without its trailing `# comment` (outside quotes).
pub(super) fn without_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted && line[..i].ends_with(' ') => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

#[test]
fn every_offline_command_example_in_the_docs_runs() {
    let dir = scratch();
    let root = extract_dump(dir.path(), "32intel64-2p8co2t+8ve");
    let xml = topologies("xml/16em64t-4s2c2t.xml");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_threadwise"))
        .parent()
        .unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let all = examples();
    assert!(all.len() >= 25, "{} examples: {all:?}", all.len());
    let (mut ran, mut bigger) = (0, vec![]);
    for (file, line) in &all {
        let cmd = without_comment(line)
            .replace(" DIR", &format!(" {}", root.display()))
            .replace(" DUMP", &format!(" {}", root.display()))
            .replace(" node.xml", &format!(" {}", xml.display()))
            .replace("/etc/bash_completion.d/", "./")
            .replace("/usr/local/share/man/man1", "./man1")
            .replace("| man -l -", "| cat")
            .replace("node0:29400", "localhost:29400");
        let go = |cmd: &str| {
            Command::new("sh")
                .args(["-c", cmd])
                .current_dir(dir.path())
                .env("PATH", &path)
                .output()
                .unwrap()
        };
        let ok = |o: &std::process::Output| {
            let doctor = cmd.starts_with("threadwise doctor");
            o.status.success() || (doctor && o.status.code() == Some(1))
        };
        let mut out = go(&cmd);
        let has_source = ["--synthetic", "--root", "--topology"]
            .iter()
            .any(|s| cmd.contains(s));
        if !ok(&out) && !has_source && cmd.starts_with("threadwise plan") {
            // Placed on a bigger (synthetic) machine, before any `--`.
            let with = match cmd.split_once(" -- ") {
                Some((head, tail)) => format!("{head} --synthetic \"{BIGGER}\" -- {tail}"),
                None => format!("{cmd} --synthetic \"{BIGGER}\""),
            };
            out = go(&with);
            bigger.push(line.clone());
        }
        assert!(
            ok(&out),
            "{file}: `{line}` exited {:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.stdout.is_empty() || !out.stderr.is_empty() || cmd.contains('>'),
            "{file}: `{line}` said nothing"
        );
        // A JSON example prints the schema the docs name beside it.
        if cmd.contains("--json") {
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{file}: `{line}`: not JSON: {e}"));
            let schema = doc["schema"].as_str().unwrap_or_default();
            assert!(
                schema.starts_with("threadwise.") && line.contains(schema),
                "{file}: `{line}` printed schema {schema:?}"
            );
        }
        ran += 1;
    }
    eprintln!(
        "{ran} examples ran, {} of them on the synthetic machine {BIGGER:?}: {bigger:?}",
        bigger.len()
    );
    assert!(
        dir.path().join("plan.svg").is_file() && dir.path().join("man1/threadwise-run.1").is_file(),
        "the examples' files"
    );
}

/// CONTRIBUTING.md's word on file sizes holds: no source file over 720
/// lines, at most three over 600.
#[test]
fn source_files_are_as_small_as_contributing_says() {
    fn walk(dir: &Path, out: &mut Vec<(usize, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let n = std::fs::read_to_string(&p).unwrap().lines().count();
                out.push((n, p.display().to_string()));
            }
        }
    }
    let mut sizes = vec![];
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut sizes,
    );
    sizes.sort();
    let over: Vec<&(usize, String)> = sizes.iter().filter(|(n, _)| *n > 600).collect();
    assert!(sizes.last().unwrap().0 <= 720, "{:?}", sizes.last());
    assert!(over.len() <= 3, "over 600 lines: {over:?}");
}

/// Every relative link in the top-level pages and docs/ names a file that
/// exists (a page moved or renamed breaks no reader's path).
#[test]
fn relative_links_in_the_docs_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<std::path::PathBuf> = [
        "BENCHMARKS.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "CHANGELOG.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    pages.extend(super::docs::pages());
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for part in text.split("](").skip(1) {
            let Some(target) = part.split(')').next() else {
                continue;
            };
            let (target, anchor) = target.split_once('#').unwrap_or((target, ""));
            if target.contains("://") || target.contains(' ') {
                continue;
            }
            let at = if target.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(target)
            };
            assert!(
                at.exists(),
                "{}: link to {target} leads nowhere",
                page.display()
            );
            // An anchor names a heading of that page, as GitHub makes them.
            if !anchor.is_empty() && at.extension().is_some_and(|e| e == "md") {
                let slugs: Vec<String> = std::fs::read_to_string(&at)
                    .unwrap()
                    .lines()
                    .filter(|l| l.starts_with('#') && l.contains("# "))
                    .map(|l| {
                        l.trim_start_matches('#')
                            .trim()
                            .to_lowercase()
                            .chars()
                            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                            .map(|c| if c == ' ' { '-' } else { c })
                            .collect()
                    })
                    .collect();
                assert!(
                    slugs.iter().any(|s| s == anchor),
                    "{}: link to {target}#{anchor}: no such heading in {slugs:?}",
                    page.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} links");
}

/// Every drawn picture, table or output excerpt in README.md and docs/ (a
/// fenced block with no language) names what it is on the line before it:
/// `<!-- output: threadwise ARGS -->` is run here and the block must be what
/// the binary prints (its lines in order; a `...` line skips some), and
/// `<!-- output of a real run: WHY -->` is a measured run this machine
/// cannot repeat. A new drawn output without either fails here.
#[test]
fn drawn_outputs_are_what_the_binary_prints() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let Some(lang) = lines[i].strip_prefix("```") else {
                i += 1;
                continue;
            };
            let end = i
                + 1
                + lines[i + 1..]
                    .iter()
                    .position(|l| l.starts_with("```"))
                    .unwrap();
            let block = &lines[i + 1..end];
            let before = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .copied()
                .unwrap_or("");
            i = end + 1;
            if !lang.is_empty() {
                continue;
            }
            let name = page.display();
            if before.starts_with("<!-- output of a real run: ") {
                continue;
            }
            let cmd = before
                .strip_prefix("<!-- output: threadwise ")
                .and_then(|c| c.strip_suffix(" -->"))
                .unwrap_or_else(|| {
                    panic!(
                        "{name}: the drawn block before line {} names no command: `{before}`",
                        end
                    )
                });
            let args = shell_words::split(cmd).unwrap();
            let out = super::threadwise().args(&args).output().unwrap();
            assert!(out.status.success(), "{name}: threadwise {cmd}");
            let drawn = String::from_utf8(out.stdout).unwrap();
            let drawn: Vec<&str> = drawn.lines().collect();
            // Each run of lines between `...` lines appears whole, in order.
            let mut from = 0;
            for chunk in block.split(|l| l.trim() == "...") {
                if chunk.is_empty() {
                    continue;
                }
                let at = (from..=drawn.len().saturating_sub(chunk.len()))
                    .find(|&k| drawn[k..k + chunk.len()] == *chunk)
                    .unwrap_or_else(|| {
                        panic!(
                            "{name}: the block under `threadwise {cmd}` is not what it prints:\n{}\n--- it prints:\n{}",
                            chunk.join("\n"),
                            drawn.join("\n")
                        )
                    });
                from = at + chunk.len();
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} drawn outputs checked");
}

/// The README opens with what a user does (install, then run), the project's
/// own two commands after, marked as what they are; and no page tells a
/// user to install threadwise from a package index it is not on.
#[test]
fn the_readme_opens_with_the_users_way_in() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let first_sh = readme
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert!(
        first_sh.contains("pip install dist/") && !first_sh.contains("scripts/test.sh"),
        "README's first commands: {first_sh}"
    );
    let install = readme.find("## Install").unwrap();
    let two = readme.find("## For contributors").unwrap();
    assert!(
        install < two,
        "Install comes before the contributors' commands"
    );
    let mut pages = pages();
    pages.push(root.join("python/README.md"));
    for p in pages {
        let text = std::fs::read_to_string(&p).unwrap();
        let index = text.lines().find(|l| l.contains("pip install threadwise"));
        assert!(
            index.is_none(),
            "{}: `{}`: threadwise is on no package index",
            p.display(),
            index.unwrap_or_default()
        );
    }
}

/// A table's last row followed by a line of text with no blank line between
/// them: CommonMark reads that text as one more row (docs/spawn.md's
/// keyword table once swallowed the paragraph after it). Checked on every
/// page, outside code blocks.
pub(super) fn tables_run_into_text(text: &str) -> Vec<(usize, String)> {
    let mut bad = vec![];
    let mut fenced = false;
    let mut prev_row = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
            prev_row = false;
            continue;
        }
        if fenced {
            continue;
        }
        let row = t.starts_with('|');
        if prev_row && !row && !t.is_empty() {
            bad.push((i + 1, line.to_string()));
        }
        prev_row = row;
    }
    bad
}

#[test]
fn every_table_ends_before_the_text_after_it() {
    // The check itself: it finds the case it is for, and passes a good one.
    let bad = "| a | b |\n|---|---|\n| 1 | 2 | The slice\ncomes from\n";
    assert_eq!(tables_run_into_text(bad).len(), 1);
    assert!(tables_run_into_text("| a |\n|---|\n| 1 |\n\ntext\n").is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<std::path::PathBuf> = ["BENCHMARKS.md", "CONTRIBUTING.md", "SECURITY.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    pages.extend(super::docs::pages());
    let mut found = vec![];
    for p in &pages {
        for (line, text) in tables_run_into_text(&std::fs::read_to_string(p).unwrap()) {
            found.push(format!("{}:{line}: {text}", p.display()));
        }
    }
    assert!(
        found.is_empty(),
        "a table runs into the text after it (add a blank line):\n{}",
        found.join("\n")
    );
}
