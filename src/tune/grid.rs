//! Which configurations tune measures: the guides' rows and ours by default, a
//! `--grid key=v1,v2 ...` cartesian product, and `--config NAME=key=v ...`.
//! Keys: threads (N, auto or unset), workers, policy, allocator, mem, smt,
//! profile, wait. "threads=unset" leaves every thread variable out, so each runtime
//! sizes its pool to all CPUs (the case the guides start from).

use serde::{Deserialize, Serialize};

use crate::plan::{
    Allocator, AllocatorChoice, AllocatorKind, Amount, PlanRequest, Policy, Profile,
};

/// One complete launch configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneConfig {
    pub name: String,
    pub request: PlanRequest,
    /// Remove the thread-count variables instead of setting them.
    pub unset_threads: bool,
    /// The one `key=value` this row changes from the plan (the default
    /// search's rows; their best values are combined after the second round).
    #[serde(default)]
    pub axis: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GridError {
    #[error(
        "{0:?}: expected key=value (keys: threads, workers, policy, allocator, mem, smt, profile, wait)"
    )]
    Syntax(String),
    #[error(
        "unknown key {0:?} (keys: threads, workers, policy, allocator, mem, smt, profile, wait)"
    )]
    Key(String),
    #[error("{key}={value}: {why}")]
    Value {
        key: String,
        value: String,
        why: String,
    },
    #[error("--config {0:?}: expected NAME=key=value ... (e.g. 'lean=threads=2 policy=l3')")]
    Config(String),
    #[error("two configurations are named {0:?}")]
    Duplicate(String),
    #[error("--grid makes {0} configurations; at most 256")]
    TooMany(usize),
}

/// Set one key on a request; returns whether threads are to be unset.
fn apply_one(req: &mut PlanRequest, key: &str, value: &str) -> Result<bool, GridError> {
    let bad = |why: String| GridError::Value {
        key: key.into(),
        value: value.into(),
        why,
    };
    match key {
        "threads" if value == "unset" => return Ok(true),
        "threads" => req.threads = Amount::parse_threads(value).map_err(bad)?,
        "workers" => req.workers = Amount::parse_workers(value).map_err(bad)?,
        "policy" => req.policy = value.parse().map_err(bad)?,
        "allocator" => req.allocator = value.parse().map_err(bad)?,
        "mem" => req.mem = value.parse().map_err(bad)?,
        "profile" => req.profile = value.parse().map_err(bad)?,
        "wait" => req.omp_wait = value.parse().map_err(bad)?,
        "smt" => {
            req.smt = match value {
                "true" | "on" | "1" => true,
                "false" | "off" | "0" => false,
                _ => return Err(bad("expected true or false".into())),
            }
        }
        _ => return Err(GridError::Key(key.into())),
    }
    Ok(false)
}

/// A configuration from `key=value` words over a base request.
pub fn from_words(name: &str, base: &PlanRequest, words: &[&str]) -> Result<TuneConfig, GridError> {
    let mut request = base.clone();
    let mut unset = false;
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| GridError::Syntax(w.to_string()))?;
        unset |= apply_one(&mut request, k, v)?;
    }
    if unset {
        // Nothing about threads applies; no pinning either (the runtime default).
        request.threads = Amount::Auto;
        if !words.iter().any(|w| w.starts_with("policy=")) {
            request.policy = Policy::None;
        }
    }
    Ok(TuneConfig {
        name: name.to_string(),
        request,
        unset_threads: unset,
        axis: None,
    })
}

fn unset(base: &PlanRequest) -> TuneConfig {
    let request = PlanRequest {
        policy: Policy::None,
        allocator: AllocatorChoice::None,
        profile: Profile::Auto,
        threads: Amount::Auto,
        ..base.clone()
    };
    TuneConfig {
        name: "unset".into(),
        request,
        unset_threads: true,
        axis: None,
    }
}

/// The default rows. First the guides' (threads unset, 4, 2 and 1 without
/// pinning, the seed formulas), so the table still reads like theirs; then
/// threadwise's plan and one row per change of one dimension from it:
/// pinning off, DataLoader workers (0, 1, 2, 4 but the plan's own), each
/// installed allocator, the OpenMP wait policy, one compute thread. After the
/// second round `tune` combines the values that beat the plan into one more
/// row (a coordinate search: these effects are close to independent, and a
/// full product would be 64+ launches). `threads`/`workers` are the plan's
/// own per-rank values.
pub fn defaults(
    base: &PlanRequest,
    planned: (usize, usize),
    allocators: &[Allocator],
) -> Vec<TuneConfig> {
    let unpinned = |n: usize| TuneConfig {
        name: format!("threads={n}"),
        request: PlanRequest {
            policy: Policy::None,
            threads: Amount::Fixed(n),
            allocator: AllocatorChoice::None,
            ..base.clone()
        },
        unset_threads: false,
        axis: None,
    };
    let mut v = vec![unset(base), unpinned(4), unpinned(2), unpinned(1)];
    v.push(TuneConfig {
        name: "seed".into(),
        request: PlanRequest {
            profile: Profile::Seed,
            policy: Policy::None,
            ..base.clone()
        },
        unset_threads: false,
        axis: None,
    });
    v.push(TuneConfig {
        name: "plan".into(),
        request: base.clone(),
        unset_threads: false,
        axis: None,
    });
    let (threads, workers) = planned;
    let mut axes: Vec<(&str, String)> = vec![];
    if base.policy != Policy::None {
        axes.push(("policy", "none".into()));
    }
    if base.workers == Amount::Auto {
        for w in [0usize, 1, 2, 4].into_iter().filter(|w| *w != workers) {
            axes.push(("workers", w.to_string()));
        }
    }
    for kind in [AllocatorKind::Tcmalloc, AllocatorKind::Jemalloc] {
        if base.allocator == AllocatorChoice::None && allocators.iter().any(|a| a.kind == kind) {
            axes.push(("allocator", kind.to_string()));
        }
    }
    if base.omp_wait == crate::plan::WaitPolicy::Default {
        axes.push(("wait", "passive".into()));
        axes.push(("wait", "active".into()));
    }
    if base.threads == Amount::Auto && threads != 1 {
        axes.push(("threads", "1".into()));
    }
    for (k, val) in axes {
        let word = format!("{k}={val}");
        if let Ok(mut c) = from_words(&format!("plan {word}"), base, &[word.as_str()]) {
            c.axis = Some((k.to_string(), val));
            v.push(c);
        }
    }
    v
}

/// The plan with every axis value that beat it, as one more configuration
/// (None when fewer than two did: nothing to combine).
pub fn combined(base: &PlanRequest, better: &[(String, String)]) -> Option<TuneConfig> {
    let mut per_key: Vec<(String, String)> = vec![];
    for (k, v) in better {
        if !per_key.iter().any(|(pk, _)| pk == k) {
            per_key.push((k.clone(), v.clone()));
        }
    }
    if per_key.len() < 2 {
        return None;
    }
    let words: Vec<String> = per_key.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    from_words(&format!("plan {}", words.join(" ")), base, &refs).ok()
}

/// The cartesian product of `key=v1,v2` items, after the unset baseline.
pub fn expand(base: &PlanRequest, grid: &[String]) -> Result<Vec<TuneConfig>, GridError> {
    let mut axes: Vec<(String, Vec<String>)> = vec![];
    for item in grid.iter().flat_map(|g| g.split_whitespace()) {
        let (k, vs) = item
            .split_once('=')
            .ok_or_else(|| GridError::Syntax(item.to_string()))?;
        let vals: Vec<String> = vs
            .split(',')
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        if vals.is_empty() {
            return Err(GridError::Syntax(item.to_string()));
        }
        axes.push((k.to_string(), vals));
    }
    let total: usize = axes.iter().map(|(_, v)| v.len()).product();
    if total > 256 {
        return Err(GridError::TooMany(total));
    }
    let mut out = vec![unset(base)];
    for i in 0..total {
        let mut rest = i;
        let mut words = vec![];
        for (k, vals) in axes.iter().rev() {
            words.push(format!("{k}={}", vals[rest % vals.len()]));
            rest /= vals.len();
        }
        words.reverse();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        out.push(from_words(&words.join(" "), base, &refs)?);
    }
    dedupe(out)
}

/// `NAME=key=value key=value`.
pub fn parse_config(base: &PlanRequest, text: &str) -> Result<TuneConfig, GridError> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| GridError::Config(text.into()))?;
    if name.trim().is_empty() || name.contains(char::is_whitespace) {
        return Err(GridError::Config(text.into()));
    }
    let words: Vec<&str> = rest.split_whitespace().collect();
    from_words(name, base, &words)
}

/// Refuse two configurations of one name; drop a later one that measures
/// exactly what an earlier one does (`--grid threads=unset` is the baseline).
pub fn dedupe(v: Vec<TuneConfig>) -> Result<Vec<TuneConfig>, GridError> {
    let mut out: Vec<TuneConfig> = vec![];
    for c in v {
        if out.iter().any(|d| d.name == c.name) {
            return Err(GridError::Duplicate(c.name.clone()));
        }
        if !out
            .iter()
            .any(|d| d.request == c.request && d.unset_threads == c.unset_threads)
        {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_is_the_cartesian_product_after_the_baseline() {
        let g = expand(
            &PlanRequest::default(),
            &["threads=1,2,4 policy=none,exclusive".into()],
        )
        .unwrap();
        assert_eq!(g.len(), 7);
        assert_eq!(g[0].name, "unset");
        assert!(g[0].unset_threads);
        assert_eq!(g[1].name, "threads=1 policy=none");
        assert_eq!(g[2].name, "threads=1 policy=exclusive");
        assert_eq!(g[6].request.threads, Amount::Fixed(4));
        assert_eq!(g[6].request.policy, Policy::Exclusive);
        assert!(expand(&PlanRequest::default(), &["threads".into()]).is_err());
        assert!(matches!(
            expand(&PlanRequest::default(), &["colour=red".into()]),
            Err(GridError::Key(_))
        ));
        assert!(matches!(
            expand(&PlanRequest::default(), &["policy=fast".into()]),
            Err(GridError::Value { .. })
        ));
        assert!(matches!(
            expand(
                &PlanRequest::default(),
                &["threads=1,2,3,4,5,6,7 workers=1,2,3,4,5,6,7 smt=true,false,1,0,on,off".into()]
            ),
            Err(GridError::TooMany(294))
        ));
    }

    #[test]
    fn configs_and_defaults() {
        let c = parse_config(
            &PlanRequest::default(),
            "lean=threads=2 policy=l3 allocator=jemalloc",
        )
        .unwrap();
        assert_eq!(c.name, "lean");
        assert_eq!(c.request.policy, Policy::L3);
        assert_eq!(c.request.allocator, AllocatorChoice::Jemalloc);
        assert!(parse_config(&PlanRequest::default(), "=threads=2").is_err());
        assert!(parse_config(&PlanRequest::default(), "x=threads").is_err());
        let je = Allocator {
            kind: AllocatorKind::Jemalloc,
            path: "/x".into(),
        };
        let names: Vec<String> = defaults(&PlanRequest::default(), (2, 1), &[je])
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(
            names,
            [
                "unset",
                "threads=4",
                "threads=2",
                "threads=1",
                "seed",
                "plan",
                "plan policy=none",
                "plan workers=0",
                "plan workers=2",
                "plan workers=4",
                "plan allocator=jemalloc",
                "plan wait=passive",
                "plan wait=active",
                "plan threads=1"
            ]
        );
        let all = defaults(&PlanRequest::default(), (1, 1), &[]);
        let passive = all.iter().find(|c| c.name == "plan wait=passive").unwrap();
        assert_eq!(passive.request.omp_wait, crate::plan::WaitPolicy::Passive);
        assert!(
            !all.iter()
                .any(|c| c.name == "plan workers=1" || c.name == "plan threads=1")
        );
        assert!(dedupe([all.clone(), all].concat()).is_err());
    }
}
