//! One-shot reads of live processes from /proc: what `launch` (the worker
//! mover, the supervisor's orphan sweep and peak RSS), `top` (finding ranks)
//! and their tests need, each file parsed in one place. The sampler `top`
//! polls many times a second is `proc.rs` beside this one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cpuset::CpuSet;

fn path(pid: i32, rel: &str) -> String {
    format!("/proc/{pid}/{rel}")
}

/// Every process id in /proc now.
pub(crate) fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid`'s threads.
pub(crate) fn tasks(pid: i32) -> Vec<i32> {
    std::fs::read_dir(path(pid, "task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Child processes of any of `pid`'s threads, sorted: the one rule for
/// children (the kernel lists a child under the thread that forked it, so a
/// worker started from another thread than the main one is found too).
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let mut out = vec![];
    for tid in tasks(pid) {
        if let Ok(s) = std::fs::read_to_string(path(pid, &format!("task/{tid}/children"))) {
            add_children(&mut out, &s);
        }
    }
    finish_children(&mut out);
    out
}

/// The pids of one `task/TID/children` file, added to `out`.
pub(crate) fn add_children(out: &mut Vec<i32>, text: &str) {
    out.extend(
        text.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok()),
    );
}

/// Every thread's children, once each, sorted.
pub(crate) fn finish_children(out: &mut Vec<i32>) {
    out.sort_unstable();
    out.dedup();
}

/// The program `pid` runs.
pub(crate) fn exe(pid: i32) -> Option<PathBuf> {
    std::fs::read_link(path(pid, "exe")).ok()
}

/// `pid`'s command name.
pub(crate) fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(path(pid, "comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Thread `tid` of `pid`: its name.
pub(crate) fn comm_of_task(pid: i32, tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// The fields of a /proc/PID/stat text after the command: `[0]` is the
/// state (field 3), `[1]` the parent (field 4) ... `[36]` the last CPU (field
/// 39). The command may hold `)` and spaces, so the last `)` ends it; a short
/// or odd read gives None or fewer fields, never a panic. The one reader of
/// that file's layout.
pub(crate) fn stat_fields(text: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(text.get(text.rfind(')')? + 1..)?.split_whitespace())
}

fn stat_field(pid: i32, index: usize) -> Option<String> {
    let s = std::fs::read_to_string(path(pid, "stat")).ok()?;
    stat_fields(&s)?.nth(index).map(str::to_string)
}

/// `pid`'s parent.
pub(crate) fn parent(pid: i32) -> Option<i32> {
    stat_field(pid, 1)?.parse().ok()
}

/// Processes whose parent is `ppid` now (those re-parented to a subreaper too).
pub(crate) fn with_parent(ppid: i32) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&p| parent(p) == Some(ppid))
        .collect()
}

/// This process's children (`children`'s rule); None where the kernel keeps
/// no such lists (CONFIG_PROC_CHILDREN), for the caller to scan instead.
pub(crate) fn own_children() -> Option<Vec<i32>> {
    let me = std::process::id() as i32;
    std::fs::metadata(path(me, &format!("task/{me}/children"))).ok()?;
    Some(children(me))
}

/// One `Key:` line of /proc/PID/status (`self` for this process), trimmed.
fn status_line(who: &str, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

fn kib(v: &str) -> Option<i64> {
    v.trim_end_matches("kB").trim().parse().ok()
}

/// `pid`'s peak RSS (VmHWM) in KiB, with its command name.
pub(crate) fn peak_rss_kib(pid: i32) -> Option<(String, i64)> {
    let who = pid.to_string();
    let name = status_line(&who, "Name")?;
    Some((name, kib(&status_line(&who, "VmHWM")?)?))
}

/// This process's RSS in KiB.
pub(crate) fn own_rss_kib() -> Option<i64> {
    kib(&status_line("self", "VmRSS")?)
}

/// The CPUs `pid` may run on (its main thread's mask), empty when gone.
pub(crate) fn affinity(pid: i32) -> CpuSet {
    status_line(&pid.to_string(), "Cpus_allowed_list")
        .and_then(|v| CpuSet::parse_list(&v).ok())
        .unwrap_or_default()
}

/// `pid`'s environment as it started, NUL-separated `KEY=value` pairs
/// (entries that are not UTF-8 or have no `=` are left out).
pub(crate) fn environ(pid: i32) -> std::io::Result<BTreeMap<String, String>> {
    let raw = std::fs::read(path(pid, "environ"))?;
    Ok(parse_environ(&raw))
}

/// `KEY=value` pairs of a NUL-separated environment block.
pub(crate) fn parse_environ(raw: &[u8]) -> BTreeMap<String, String> {
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let (k, v) = std::str::from_utf8(kv).ok()?.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id() as i32;
        assert!(pids().contains(&me));
        assert!(tasks(me).contains(&me));
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id() as i32));
        assert_eq!(exe(me), std::env::current_exe().ok());
        assert!(!affinity(me).is_empty());
        assert!(own_rss_kib().is_some_and(|k| k > 0));
        let (_, hwm) = peak_rss_kib(me).unwrap();
        assert!(hwm >= own_rss_kib().unwrap() / 2);
        let env = environ(me).unwrap();
        assert!(env.contains_key("PATH") || std::env::var("PATH").is_err());
    }

    #[test]
    fn a_child_is_found_under_its_parent() {
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let pid = c.id() as i32;
        assert!(children(me).contains(&pid));
        assert!(with_parent(me).contains(&pid));
        assert_eq!(comm(pid).as_deref(), Some("sleep"));
        c.kill().unwrap();
        c.wait().unwrap();
        assert!(comm(pid).is_none(), "gone once reaped");
    }

    #[test]
    fn environment_blocks() {
        let e = parse_environ(b"A=1\0B=x=y\0junk\0\xff=2\0");
        assert_eq!(e.len(), 2);
        assert_eq!(e["B"], "x=y");
    }
}
