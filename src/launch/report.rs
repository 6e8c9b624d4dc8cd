//! What a run says at its end: the per-rank summary, and the failing rank's
//! report (which rank, its pid, how it ended, its recorded exception or its
//! stderr tail), on one node or as one node of many.

use super::RankLaunch;
use super::supervise::Outcome;

/// The end-of-run summary, one line per rank.
pub(crate) fn summary(o: &Outcome) -> String {
    let mut s = format!(
        "threadwise: {} rank(s) in {:.2} s\n{:<5} {:>8}  {:<34} {:>9} {:>9} {:>10} {:>9} {:>9}\n",
        o.results.len(),
        o.wall.as_secs_f64(),
        "rank",
        "pid",
        "end",
        "wall s",
        "cpu s",
        "max rss",
        "vol cs",
        "invol cs"
    );
    for r in &o.results {
        s.push_str(&format!(
            "{:<5} {:>8}  {:<34} {:>9.2} {:>9.2} {:>6.1} MiB {:>9} {:>9}\n",
            r.local_rank,
            r.pid,
            r.exit.describe(),
            r.wall.as_secs_f64(),
            r.cpu.as_secs_f64(),
            r.max_rss_kib as f64 / 1024.0,
            r.voluntary_cs,
            r.involuntary_cs
        ));
    }
    s
}

/// The failing rank's report (None when none failed): its end, its
/// recorded error and its stderr's tail; on one node of many (`host`) the
/// line names the host and calls the rank local: "host1: error: local rank 1 (pid ...)".
pub(crate) fn failure_report_on(
    o: &Outcome,
    errors: Option<&std::path::Path>,
    host: Option<&str>,
) -> Option<String> {
    let i = o.first_failure?;
    let r = &o.results[i];
    let who = match host {
        Some(h) => format!("{h}: error: local rank"),
        None => "error: rank".into(),
    };
    let mut s = format!(
        "{who} {} (pid {}) {}\n",
        r.local_rank,
        r.pid,
        r.exit.describe()
    );
    let recorded = errors.and_then(|d| {
        let f = super::env::error_file(d, r.local_rank);
        Some((super::env::recorded_error(&f)?, f))
    });
    let tail = o.tails.get(i).cloned().unwrap_or_default();
    if let Some((cause, file)) = recorded {
        s.push_str(&format!(
            "root cause (recorded by rank {} in {}):\n",
            r.local_rank,
            file.display()
        ));
        for l in cause.lines() {
            s.push_str(&format!("  | {l}\n"));
        }
    } else if tail.is_empty() {
        s.push_str("  (its stderr was empty)\n");
    } else {
        s.push_str(&format!("last {} line(s) of its stderr:\n", tail.len()));
        for l in tail {
            s.push_str(&format!("  | {l}\n"));
        }
    }
    Some(s)
}

/// Host names as Slurm writes a host list: names that differ only in a
/// numeric suffix of one width become `node[001-003,007]`, in the order each
/// group first appears; other names stay as they are.
pub(crate) fn compact_hosts(hosts: &[String]) -> String {
    // (prefix, width) -> numbers, in first-appearance order.
    let mut groups: Vec<(String, usize, Vec<u64>)> = vec![];
    let mut plain: Vec<(usize, String)> = vec![];
    for (at, h) in hosts.iter().enumerate() {
        let digits = h.len() - h.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, num) = h.split_at(h.len() - digits);
        match num.parse::<u64>() {
            Ok(n) if !num.is_empty() => {
                match groups
                    .iter_mut()
                    .find(|(p, w, _)| p == prefix && *w == num.len())
                {
                    Some(g) => g.2.push(n),
                    None => groups.push((prefix.to_string(), num.len(), vec![n])),
                }
            }
            _ => plain.push((at, h.clone())),
        }
    }
    let mut out: Vec<String> = vec![];
    for (prefix, width, mut nums) in groups {
        nums.sort_unstable();
        nums.dedup();
        if nums.len() == 1 {
            out.push(format!("{prefix}{:0width$}", nums[0]));
            continue;
        }
        let mut ranges: Vec<String> = vec![];
        let mut i = 0;
        while i < nums.len() {
            let mut j = i;
            while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
                j += 1;
            }
            ranges.push(if i == j {
                format!("{:0width$}", nums[i])
            } else {
                format!("{:0width$}-{:0width$}", nums[i], nums[j])
            });
            i = j + 1;
        }
        out.push(format!("{prefix}[{}]", ranges.join(",")));
    }
    out.extend(plain.into_iter().map(|(_, h)| h));
    out.join(",")
}

/// One line saying where this node's ranks go, before they start: their
/// CPUs, threads, DataLoader workers, memory and GPUs, each said once when
/// every rank has the same, else per rank (`0 | 1`).
pub(crate) fn placement_line(launches: &[RankLaunch], rank_base: usize) -> String {
    let each = |f: &dyn Fn(&RankLaunch) -> String| -> String {
        let v: Vec<String> = launches.iter().map(f).collect();
        if v.windows(2).all(|w| w[0] == w[1]) {
            v.first().cloned().unwrap_or_default()
        } else {
            v.join(" | ")
        }
    };
    let env =
        |k: &'static str| move |l: &RankLaunch| l.env.get(k).cloned().unwrap_or_else(|| "-".into());
    let ranks = match launches.len() {
        0 => "no ranks".to_string(),
        1 => format!("rank {rank_base}"),
        n => format!("ranks {rank_base}-{}", rank_base + n - 1),
    };
    let gpus = each(&|l| {
        l.env
            .get("CUDA_VISIBLE_DEVICES")
            .or_else(|| l.env.get("THREADWISE_GPU"))
            .cloned()
            .unwrap_or_else(|| "none".into())
    });
    let roles = match launches
        .iter()
        .any(|l| l.env.contains_key("THREADWISE_SERVICE_CPUS"))
    {
        true => format!(
            "; roles: service {}, team {}",
            each(&env("THREADWISE_SERVICE_CPUS")),
            each(&env("THREADWISE_TEAM_CPUS"))
        ),
        false => String::new(),
    };
    format!(
        "{ranks}: cpus {}; threads {}; workers {}; memory {}; GPU {gpus}{roles}",
        each(&|l| if l.cpus.is_empty() {
            "unbound".into()
        } else {
            l.cpus.clone()
        }),
        each(&env("OMP_NUM_THREADS")),
        each(&env("THREADWISE_NUM_WORKERS")),
        each(&|l| l.mem.clone()),
    )
}

#[cfg(test)]
mod placement_tests {
    use super::*;

    #[test]
    fn hosts_compact_as_slurm_writes_them() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let many: Vec<String> = (1..=256).map(|i| format!("node{i:03}")).collect();
        assert_eq!(compact_hosts(&many), "node[001-256]");
        assert_eq!(
            compact_hosts(&h(&[
                "node001", "node002", "gpu7", "node003", "node010", "login"
            ])),
            "node[001-003,010],gpu7,login"
        );
        assert_eq!(compact_hosts(&h(&["host0", "host1"])), "host[0-1]");
        assert_eq!(
            compact_hosts(&h(&["a9", "a10"])),
            "a9,a10",
            "two widths, two groups"
        );
        assert_eq!(compact_hosts(&h(&["solo"])), "solo");
    }
}
