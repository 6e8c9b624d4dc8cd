//! Which configurations tune measures: the guides' rows and ours by default, a
//! `--grid key=v1,v2 ...` cartesian product, and `--config NAME=key=v ...`.
//! Keys: threads (N, auto or unset), workers, policy, allocator, mem, smt,
//! profile, wait. "threads=unset" leaves every thread variable out, so each runtime
//! sizes its pool to all CPUs (the case the guides start from).

use std::fmt;

use crate::plan::{
    Allocator, AllocatorChoice, AllocatorKind, Amount, MemPolicy, PlanRequest, Policy, Profile,
    WaitPolicy,
};

/// Why a configuration is in the table: the rules that treat rows apart
/// (the baseline of every speed-up, the plan the search moves around) look at
/// this, never at a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    /// Threads unset: what users have without threadwise; every speed-up's base.
    Baseline,
    /// The guides' rows: threads=N without pinning, the seed formulas.
    Guide,
    /// threadwise's plan, which the default search moves around.
    Plan,
    /// The plan with one change (the default search's rows).
    OneChange,
    /// The plan with every change that beat it (after the second round).
    Combined,
    /// A point of `--grid`.
    GridPoint,
    /// `--config NAME=...`.
    User,
}

impl Role {
    /// Among configurations the data cannot tell apart, the one to choose:
    /// the plan, then the fewest changes from it, then what the user asked
    /// for, the guides' rows, and the unset baseline last.
    pub(crate) fn tie_rank(self) -> u8 {
        match self {
            Role::Plan => 0,
            Role::OneChange => 1,
            Role::Combined => 2,
            Role::User => 3,
            Role::GridPoint => 4,
            Role::Guide => 5,
            Role::Baseline => 6,
        }
    }
}

/// One change a configuration makes to a request: the keys of `--grid`,
/// `--config` and the default search's rows. Strings only at the edge
/// (`Change::parse`, `Display`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    /// Leave every thread variable out (and, unless a policy is given, pin nothing).
    ThreadsUnset,
    Threads(Amount),
    Workers(Amount),
    Policy(Policy),
    Allocator(AllocatorChoice),
    Mem(MemPolicy),
    Smt(bool),
    Profile(Profile),
    Wait(WaitPolicy),
    Roles(bool),
}

/// An on/off value as `smt=` and `roles=` take it.
fn switch(value: &str) -> Option<bool> {
    match value {
        "true" | "on" | "1" => Some(true),
        "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

impl Change {
    /// `key=value` as the user wrote it.
    pub(crate) fn parse(key: &str, value: &str) -> Result<Change, GridError> {
        let bad = |why: String| GridError::Value {
            key: key.into(),
            value: value.into(),
            why,
        };
        Ok(match key {
            "threads" if value == "unset" => Change::ThreadsUnset,
            "threads" => Change::Threads(Amount::parse_threads(value).map_err(bad)?),
            "workers" => Change::Workers(Amount::parse_workers(value).map_err(bad)?),
            "policy" => Change::Policy(value.parse().map_err(bad)?),
            "allocator" => Change::Allocator(value.parse().map_err(bad)?),
            "mem" => Change::Mem(value.parse().map_err(bad)?),
            "profile" => Change::Profile(value.parse().map_err(bad)?),
            "wait" => Change::Wait(value.parse().map_err(bad)?),
            "smt" => {
                Change::Smt(switch(value).ok_or_else(|| bad("expected true or false".into()))?)
            }
            "roles" => {
                Change::Roles(switch(value).ok_or_else(|| bad("expected on or off".into()))?)
            }
            _ => return Err(GridError::Key(key.into())),
        })
    }

    /// The key this change sets (one value per key in a combination).
    pub(crate) fn key(&self) -> &'static str {
        match self {
            Change::ThreadsUnset | Change::Threads(_) => "threads",
            Change::Workers(_) => "workers",
            Change::Policy(_) => "policy",
            Change::Allocator(_) => "allocator",
            Change::Mem(_) => "mem",
            Change::Smt(_) => "smt",
            Change::Profile(_) => "profile",
            Change::Wait(_) => "wait",
            Change::Roles(_) => "roles",
        }
    }

    fn apply(&self, req: &mut PlanRequest) {
        match self {
            Change::ThreadsUnset => req.unset_threads = true,
            Change::Threads(a) => req.threads = *a,
            Change::Workers(a) => req.workers = *a,
            Change::Policy(p) => req.policy = *p,
            Change::Allocator(a) => req.allocator = *a,
            Change::Mem(m) => req.mem = *m,
            Change::Smt(b) => req.smt = *b,
            Change::Profile(p) => req.profile = *p,
            Change::Wait(w) => req.omp_wait = *w,
            Change::Roles(b) => req.roles = *b,
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.key())?;
        match self {
            Change::ThreadsUnset => f.write_str("unset"),
            Change::Threads(a) | Change::Workers(a) => write!(f, "{a}"),
            Change::Policy(p) => write!(f, "{p}"),
            Change::Allocator(a) => write!(f, "{a}"),
            Change::Mem(m) => write!(f, "{m}"),
            Change::Smt(b) => write!(f, "{b}"),
            Change::Profile(p) => write!(f, "{p}"),
            Change::Wait(w) => write!(f, "{w}"),
            Change::Roles(b) => f.write_str(if *b { "on" } else { "off" }),
        }
    }
}

/// `base` with `changes` applied. Threads unset also means no pinning unless
/// a policy is among the changes (the runtime's default).
pub(crate) fn apply(base: &PlanRequest, changes: &[Change]) -> PlanRequest {
    let mut request = base.clone();
    for c in changes {
        c.apply(&mut request);
    }
    if request.unset_threads {
        request.threads = Amount::Auto;
        if !changes.iter().any(|c| matches!(c, Change::Policy(_))) {
            request.policy = Policy::None;
        }
    }
    request
}

/// One complete launch configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TuneConfig {
    pub name: String,
    pub role: Role,
    pub request: PlanRequest,
    /// The one change from the plan this row measures (the default search's
    /// rows, and a row that launches exactly as one); their best values are
    /// combined after the second round.
    pub axis: Option<Change>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum GridError {
    #[error(
        "{0:?}: expected key=value (keys: threads, workers, policy, allocator, mem, smt, profile, wait, roles)"
    )]
    Syntax(String),
    #[error(
        "unknown key {0:?} (keys: threads, workers, policy, allocator, mem, smt, profile, wait, roles)"
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

/// The changes `key=value` words ask for (the edge where strings end).
fn parse_words(words: &[&str]) -> Result<Vec<Change>, GridError> {
    words
        .iter()
        .map(|w| {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| GridError::Syntax(w.to_string()))?;
            Change::parse(k, v)
        })
        .collect()
}

/// A configuration from `key=value` words over a base request.
pub(crate) fn from_words(
    name: &str,
    role: Role,
    base: &PlanRequest,
    words: &[&str],
) -> Result<TuneConfig, GridError> {
    let changes = parse_words(words)?;
    Ok(TuneConfig {
        name: name.to_string(),
        role,
        request: apply(base, &changes),
        axis: None,
    })
}

fn unset(base: &PlanRequest) -> TuneConfig {
    let request = PlanRequest {
        policy: Policy::None,
        allocator: AllocatorChoice::None,
        profile: Profile::Auto,
        threads: Amount::Auto,
        unset_threads: true,
        ..base.clone()
    };
    TuneConfig {
        name: "unset".into(),
        role: Role::Baseline,
        request,
        axis: None,
    }
}

/// The default rows. First the guides' (threads unset, 4, 2 and 1 without
/// pinning, the seed formulas), so the table still reads like theirs; then
/// threadwise's plan and one row per change of one dimension from it:
/// pinning off, DataLoader workers (0, 1, 2, 4 but the plan's own), each
/// installed allocator, the OpenMP wait policy, one compute thread, threads
/// placed by role. After the
/// second round `tune` combines the values that beat the plan into one more
/// row (a coordinate search: these effects are close to independent, and a
/// full product would be 64+ launches). `threads`/`workers` are the plan's
/// own per-rank values.
pub(crate) fn defaults(
    base: &PlanRequest,
    planned: (usize, usize),
    allocators: &[Allocator],
) -> Vec<TuneConfig> {
    let guide = |name: String, request: PlanRequest| TuneConfig {
        name,
        role: Role::Guide,
        request,
        axis: None,
    };
    let unpinned = |n: usize| {
        let request = PlanRequest {
            policy: Policy::None,
            threads: Amount::Fixed(n),
            allocator: AllocatorChoice::None,
            ..base.clone()
        };
        guide(format!("threads={n}"), request)
    };
    let mut v = vec![unset(base), unpinned(4), unpinned(2), unpinned(1)];
    v.push(guide(
        "seed".into(),
        PlanRequest {
            profile: Profile::Seed,
            policy: Policy::None,
            ..base.clone()
        },
    ));
    v.push(TuneConfig {
        name: "plan".into(),
        role: Role::Plan,
        request: base.clone(),
        axis: None,
    });
    let (threads, workers) = planned;
    let mut axes: Vec<Change> = vec![];
    if base.policy != Policy::None {
        axes.push(Change::Policy(Policy::None));
    }
    if base.workers == Amount::Auto {
        for w in [0usize, 1, 2, 4].into_iter().filter(|w| *w != workers) {
            axes.push(Change::Workers(Amount::Fixed(w)));
        }
    }
    for (kind, choice) in [
        (AllocatorKind::Tcmalloc, AllocatorChoice::Tcmalloc),
        (AllocatorKind::Jemalloc, AllocatorChoice::Jemalloc),
    ] {
        if base.allocator == AllocatorChoice::None && allocators.iter().any(|a| a.kind == kind) {
            axes.push(Change::Allocator(choice));
        }
    }
    if base.omp_wait == WaitPolicy::Default {
        axes.push(Change::Wait(WaitPolicy::Passive));
        axes.push(Change::Wait(WaitPolicy::Active));
    }
    if base.threads == Amount::Auto && threads != 1 {
        axes.push(Change::Threads(Amount::Fixed(1)));
    }
    // Threads by role (a rank with too few cores launches as the plan, and
    // the two rows merge into one).
    if !base.roles && base.policy != Policy::None {
        axes.push(Change::Roles(true));
    }
    for change in axes {
        v.push(TuneConfig {
            name: format!("plan {change}"),
            role: Role::OneChange,
            request: apply(base, std::slice::from_ref(&change)),
            axis: Some(change),
        });
    }
    v
}

/// The plan with every change that beat it (best first; the first per key
/// counts), as one more configuration (None when fewer than two keys did:
/// nothing to combine).
pub(crate) fn combined(base: &PlanRequest, better: &[Change]) -> Option<TuneConfig> {
    let mut per_key: Vec<Change> = vec![];
    for c in better {
        if !per_key.iter().any(|p| p.key() == c.key()) {
            per_key.push(c.clone());
        }
    }
    if per_key.len() < 2 {
        return None;
    }
    let words: Vec<String> = per_key.iter().map(Change::to_string).collect();
    Some(TuneConfig {
        name: format!("plan {}", words.join(" ")),
        role: Role::Combined,
        request: apply(base, &per_key),
        axis: None,
    })
}

/// The cartesian product of `key=v1,v2` items, after the unset baseline.
pub(crate) fn expand(base: &PlanRequest, grid: &[String]) -> Result<Vec<TuneConfig>, GridError> {
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
        out.push(from_words(&words.join(" "), Role::GridPoint, base, &refs)?);
    }
    dedupe(out)
}

/// `NAME=key=value key=value`.
pub(crate) fn parse_config(base: &PlanRequest, text: &str) -> Result<TuneConfig, GridError> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| GridError::Config(text.into()))?;
    if name.trim().is_empty() || name.contains(char::is_whitespace) {
        return Err(GridError::Config(text.into()));
    }
    let words: Vec<&str> = rest.split_whitespace().collect();
    from_words(name, Role::User, base, &words)
}

/// Refuse two configurations of one name; drop a later one that measures
/// exactly what an earlier one does (`--grid threads=unset` is the baseline).
pub(crate) fn dedupe(v: Vec<TuneConfig>) -> Result<Vec<TuneConfig>, GridError> {
    let mut out: Vec<TuneConfig> = vec![];
    for c in v {
        if out.iter().any(|d| d.name == c.name) {
            return Err(GridError::Duplicate(c.name.clone()));
        }
        if !out.iter().any(|d| d.request == c.request) {
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
        assert_eq!(g[0].role, Role::Baseline);
        assert!(g[0].request.unset_threads);
        assert_eq!(g[1].role, Role::GridPoint);
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
                "plan threads=1",
                "plan roles=on"
            ]
        );
        let all = defaults(&PlanRequest::default(), (1, 1), &[]);
        let passive = all.iter().find(|c| c.name == "plan wait=passive").unwrap();
        assert_eq!(passive.request.omp_wait, crate::plan::WaitPolicy::Passive);
        assert_eq!(passive.role, Role::OneChange);
        assert_eq!(passive.axis, Some(Change::Wait(WaitPolicy::Passive)));
        assert_eq!(all.iter().filter(|c| c.role == Role::Plan).count(), 1);
        assert!(
            !all.iter()
                .any(|c| c.name == "plan workers=1" || c.name == "plan threads=1")
        );
        assert!(dedupe([all.clone(), all].concat()).is_err());
    }

    #[test]
    fn changes_read_and_print_alike() {
        for (k, v) in [
            ("threads", "unset"),
            ("threads", "2"),
            ("threads", "auto"),
            ("workers", "0"),
            ("policy", "none"),
            ("allocator", "jemalloc"),
            ("mem", "interleave"),
            ("smt", "true"),
            ("profile", "seed"),
            ("wait", "passive"),
        ] {
            let c = Change::parse(k, v).unwrap();
            assert_eq!(c.to_string(), format!("{k}={v}"));
            assert_eq!(c.key(), k);
        }
        // Threads unset pins nothing unless a policy is asked for too.
        let base = PlanRequest::default();
        let r = apply(&base, &[Change::ThreadsUnset]);
        assert!(r.unset_threads && r.policy == Policy::None);
        let r = apply(&base, &[Change::ThreadsUnset, Change::Policy(Policy::L3)]);
        assert_eq!(r.policy, Policy::L3);
        // A combination keeps the first (best) value per key.
        let c = combined(
            &base,
            &[
                Change::Workers(Amount::Fixed(4)),
                Change::Wait(WaitPolicy::Active),
                Change::Workers(Amount::Fixed(0)),
            ],
        )
        .unwrap();
        assert_eq!(c.name, "plan workers=4 wait=active");
        assert_eq!(c.role, Role::Combined);
        assert_eq!(c.request.workers, Amount::Fixed(4));
        assert!(combined(&base, &[Change::Workers(Amount::Fixed(4))]).is_none());
    }
}
