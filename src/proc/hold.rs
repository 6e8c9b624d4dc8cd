//! Holding a rank's threads in place while it runs, from outside the process
//! (`run`'s supervisor, every other 100 ms tick beside the worker mover; `bind`'s
//! holder process): a thread a library moved off the rank's CPUs is put back,
//! and with `--roles` each new thread goes to its role's CPUs.
//!
//! The rules (`decide`, pure), each from evidence, never from a mask's value
//! alone:
//! - **Outside the rank** (NCCL 2.29 leaking its GPU-local mask into the
//!   caller's threads, a library pinning to "every CPU"): seen on two looks in
//!   a row, `EVERY` apart (so a library that widens a mask for less than that
//!   and restores it, as NCCL 2.30 does, is left alone), the thread is put
//!   back on its role's CPUs: a correction, counted and said.
//! - **A fight**: a thread put back `TRIES` times that leaves again is
//!   fighting whatever re-pins it. That is said once, with its name and what
//!   to set; with `--hold on` threadwise then leaves it where it went, with
//!   `--hold always` it keeps putting it back (each one counted, not said).
//! - **Inside the rank, a mask the thread or its runtime chose is never
//!   touched**, `--roles` included. Chosen means: a mask that changed since
//!   the holder first saw the thread, not by threadwise; a mask it was born
//!   with that no creator could have given it (not the rank's whole set, and
//!   not a set threadwise gave another thread of the process before this
//!   one was first listed); any mask of a thread whose OpenMP runtime binds
//!   its threads itself (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY or
//!   KMP_AFFINITY in the rank's environment), but the rank's whole set.
//! - **`--roles` places inherited masks once**: a thread on the mask it
//!   inherited (the rank's whole set, or the service or team set its creator
//!   had from threadwise) moves to its role's CPUs: a placement, not a
//!   correction. It moves again only while it still has the mask threadwise
//!   set and its name tells another role (gloo names its threads after
//!   starting them). A placed thread that sets its own mask inside the rank
//!   has chosen: said once, left there.
//! - `--hold off`: the same is seen and said, nothing is set; a thread seen
//!   outside is counted once per departure (it must come back inside before
//!   it counts again).
//!
//! Cost per look (every `EVERY`): one directory read of /proc/PID/task and one
//! sched_getaffinity per thread; a thread's name is read while it is young
//! (runtimes name their threads just after starting them).

use std::collections::HashMap;

use crate::cpuset::CpuSet;
use crate::measure::process::{comm_of_task, tasks};
use crate::roles::{Role, RoleCpus, classify};

crate::named_enum! {
    /// `--hold`: whether threads found outside their rank's CPUs are put back.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) enum Hold ("a hold mode,") {
        /// Put them back, at most `TRIES` times a thread, then leave a thread
        /// that keeps leaving (said once); place threads by role under --roles.
        #[default]
        On => "on",
        /// Only watch: say them, each departure counted once; set nothing.
        Off => "off",
        /// As on, and keep putting back a thread that keeps leaving.
        Always => "always",
    }
}

/// Where a rank's threads belong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldSpec {
    /// The rank's CPUs.
    pub cpus: CpuSet,
    /// Its role layout, with `--roles`.
    pub roles: Option<RoleCpus>,
    /// The rank's OpenMP runtime binds its threads itself (its environment
    /// says so): a mask inside the rank other than the rank's whole set is
    /// the runtime's choice.
    pub runtime_binds: bool,
}

impl HoldSpec {
    fn target(&self, role: Role) -> &CpuSet {
        self.roles.as_ref().map_or(&self.cpus, |l| l.of(role))
    }
}

/// The variables by which an OpenMP runtime binds its threads itself.
pub(crate) const BINDING_VARS: [&str; 4] = [
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
];

/// Whether the environment `get` reads tells the OpenMP runtime to bind its
/// threads (OMP_PROC_BIND other than false, OMP_PLACES or GOMP_CPU_AFFINITY
/// set, KMP_AFFINITY other than disabled or none).
pub(crate) fn runtime_binds(get: impl Fn(&str) -> Option<String>) -> bool {
    BINDING_VARS.iter().any(|k| {
        let Some(v) = get(k) else { return false };
        let v = v.trim().to_ascii_lowercase();
        match *k {
            "OMP_PROC_BIND" => !v.is_empty() && v != "false",
            "KMP_AFFINITY" => {
                !v.is_empty() && !v.contains("disabled") && !v.split(',').any(|p| p == "none")
            }
            _ => !v.is_empty(),
        }
    })
}

/// What the holder found about one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// It was outside the rank's CPUs and was put back: a correction.
    PutBack,
    /// It was outside and was left there (`--hold off`; or the set failed,
    /// the thread ended meanwhile): a sighting, once per departure.
    Seen,
    /// It left again after `TRIES` put-backs: a fight, said once. `held_on`:
    /// put back anyway (`--hold always`); else left where it went.
    Fight { held_on: bool },
    /// Placed by role, it then set its own mask inside the rank: its choice,
    /// left there (said once).
    Chose,
}

/// One finding about a thread, for the reporters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Correction {
    pub tid: i32,
    pub name: String,
    pub role: Role,
    /// Its mask when found.
    pub from: CpuSet,
    /// Its role's CPUs (where it was put back, or would be).
    pub to: CpuSet,
    pub what: What,
}

impl Correction {
    /// A mask threadwise set: what top and the summaries count.
    pub(crate) fn counts(&self) -> bool {
        matches!(self.what, What::PutBack | What::Fight { held_on: true })
    }
}

/// What to do with one thread this look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Leave,
    /// Outside the rank once: look again next time.
    Watch,
    /// Outside the rank again: put it back here.
    Correct(CpuSet),
    /// Outside, `--hold off`: said, counted once for this departure.
    Seen,
    /// Outside again after `TRIES` put-backs: said once; put back here too
    /// where `Some` (`--hold always`).
    Fight(Option<CpuSet>),
    /// An inherited mask under `--roles`: place it by its role.
    Place(CpuSet),
    /// A mask of its own inside the rank after threadwise placed it: said
    /// once, left.
    Chose,
}

/// How many looks in a row a thread is seen outside before it is put back.
pub(crate) const OFF_TICKS: u8 = 2;
/// How many times one thread is put back before its next departure is a
/// fight (said once; then `--hold on` leaves it, `always` holds on).
pub(crate) const TRIES: u32 = 3;
/// How often a holder looks: a thread moved off its rank's CPUs is back
/// within 2-3 looks (0.4-0.6 s), and 16 ranks of 16 threads cost the
/// supervisor ~0.3-0.4% of a core (scripts/bench-hold.sh).
pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// A thread's name is read again for this many looks after it is first seen
/// (5 s).
const NAME_TICKS: u32 = 25;

/// What the holder knows of one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Thread {
    /// Its mask when first seen (what it was born with, as far as a look
    /// can tell).
    pub first: CpuSet,
    /// Whether a creator could have given it `first`: a set threadwise gave
    /// another thread of the process on a look before this one was first
    /// listed.
    pub could_inherit: bool,
    /// The mask threadwise set on it last.
    pub set: Option<CpuSet>,
    /// Looks in a row it was outside, before this one.
    pub off: u8,
    /// `--hold off`: it is outside and this departure was said.
    pub out: bool,
    /// Put-backs so far.
    pub puts: u32,
    /// A fight was said.
    pub fought: bool,
    /// Its own choice after a placement was said.
    pub chose: bool,
}

/// The rule for one thread (`t`) of role `role` whose mask is `mask` now.
pub(crate) fn decide(spec: &HoldSpec, mode: Hold, role: Role, mask: &CpuSet, t: &Thread) -> Step {
    let target = spec.target(role);
    if mask.is_empty() {
        return Step::Leave;
    }
    if !mask.is_subset(&spec.cpus) {
        if t.off + 1 < OFF_TICKS {
            return Step::Watch;
        }
        return match mode {
            Hold::Off if t.out => Step::Leave,
            Hold::Off => Step::Seen,
            _ if t.puts < TRIES => Step::Correct(target.clone()),
            Hold::Always if !t.fought => Step::Fight(Some(target.clone())),
            Hold::Always => Step::Correct(target.clone()),
            _ if t.fought => Step::Leave,
            _ => Step::Fight(None),
        };
    }
    let Some(l) = &spec.roles else {
        return Step::Leave;
    };
    if let Some(s) = &t.set {
        // Ours: placed again if its name now tells another role; anything
        // else it set itself, inside the rank, is its choice.
        return match (s == mask, mask != target) {
            (true, true) => Step::Place(target.clone()),
            (true, false) => Step::Leave,
            (false, _) if t.chose => Step::Leave,
            (false, _) => Step::Chose,
        };
    }
    if mask != &t.first || mask == target {
        return Step::Leave; // changed by itself before we touched it
    }
    let inherited = *mask == spec.cpus
        || (!spec.runtime_binds && t.could_inherit && (*mask == l.service || *mask == l.team));
    match inherited {
        true => Step::Place(target.clone()),
        false => Step::Leave,
    }
}

#[derive(Debug)]
struct Seen {
    name: String,
    role: Role,
    ticks: u32,
    t: Thread,
}

/// One rank's holder.
#[derive(Debug)]
pub(crate) struct Holder {
    spec: HoldSpec,
    mode: Hold,
    seen: HashMap<i32, Seen>,
    /// The look each mask threadwise set was first set on: a thread first
    /// listed on a later look may have inherited it from the thread it was
    /// set on.
    given: HashMap<CpuSet, u64>,
    /// Looks so far.
    looks: u64,
    /// When to look next.
    next: std::time::Instant,
}

impl Holder {
    pub(crate) fn new(spec: HoldSpec, mode: Hold) -> Holder {
        Holder {
            spec,
            mode,
            seen: HashMap::new(),
            given: HashMap::new(),
            looks: 0,
            next: std::time::Instant::now(),
        }
    }

    /// Every `EVERY` (called more often, it skips): look at every thread of
    /// `pid` once; what was found.
    pub(crate) fn tick(&mut self, pid: i32) -> Vec<Correction> {
        let now = std::time::Instant::now();
        if now < self.next {
            return vec![];
        }
        self.next = now + EVERY;
        self.look(pid)
    }

    fn look(&mut self, pid: i32) -> Vec<Correction> {
        self.looks += 1;
        let look = self.looks;
        let mut out = vec![];
        let tids = tasks(pid);
        self.seen.retain(|t, _| tids.contains(t));
        for tid in tids {
            let Ok(mask) = crate::os::task_affinity(tid) else {
                continue; // ended meanwhile
            };
            let given = &self.given;
            let s = self.seen.entry(tid).or_insert_with(|| Seen {
                name: String::new(),
                role: Role::Unknown,
                ticks: 0,
                t: Thread {
                    could_inherit: given.get(&mask).is_some_and(|at| *at < look),
                    first: mask.clone(),
                    ..Thread::default()
                },
            });
            if s.ticks < NAME_TICKS {
                if let Some(n) = comm_of_task(pid, tid) {
                    s.role = classify(pid, tid, &n, None);
                    s.name = n;
                }
            }
            s.ticks = s.ticks.saturating_add(1);
            let step = decide(&self.spec, self.mode, s.role, &mask, &s.t);
            let t = &mut s.t;
            let outside = !mask.is_subset(&self.spec.cpus);
            if !outside {
                t.off = 0;
                t.out = false;
            }
            let target = self.spec.target(s.role);
            let mut found = |what: What| {
                out.push(Correction {
                    tid,
                    name: s.name.clone(),
                    role: s.role,
                    from: mask.clone(),
                    to: target.clone(),
                    what,
                })
            };
            match step {
                Step::Leave => {}
                Step::Watch => t.off += 1,
                Step::Seen => {
                    t.off = 0;
                    t.out = true;
                    found(What::Seen);
                }
                Step::Place(to) => {
                    if self.mode != Hold::Off && set(tid, &to) {
                        self.given.entry(to.clone()).or_insert(look);
                        t.set = Some(to);
                    }
                }
                Step::Chose => {
                    t.chose = true;
                    found(What::Chose);
                }
                Step::Correct(to) => {
                    t.off = 0;
                    // A set refused (the thread ended meanwhile): seen only.
                    match set(tid, &to) {
                        true => {
                            t.puts += 1;
                            t.set = Some(to);
                            found(What::PutBack);
                        }
                        false => found(What::Seen),
                    }
                }
                Step::Fight(again) => {
                    t.off = 0;
                    t.fought = true;
                    let held_on = again.is_some_and(|to| set(tid, &to));
                    t.puts += u32::from(held_on);
                    found(What::Fight { held_on });
                }
            }
        }
        out
    }
}

/// What to set so that a fighting thread stops: its library's own switch,
/// where its name tells the library.
pub(crate) fn fight_hint(name: &str) -> &'static str {
    if name.starts_with("NCCL") || name.starts_with("pt_nccl") {
        "NCCL_IGNORE_CPU_AFFINITY=1 keeps NCCL from re-pinning its threads"
    } else if name.starts_with("gloo") || name.starts_with("pt_") {
        "torch.set_num_threads or the library's own affinity setting re-pins it"
    } else {
        "find what re-pins it (a library's own affinity setting)"
    }
}

/// One finding in words (run's reporter, bind's holder).
pub(crate) fn said(local_rank: usize, c: &Correction) -> String {
    let who = format!(
        "rank {local_rank}: thread {} '{}' ({})",
        c.tid, c.name, c.role
    );
    match c.what {
        What::PutBack => format!(
            "{who} was on CPUs {}, outside the rank's: put back on {}",
            c.from, c.to
        ),
        What::Seen => format!(
            "{who} was on CPUs {}, outside the rank's: left there (--hold off; its role's \
             CPUs are {})",
            c.from, c.to
        ),
        What::Fight { held_on } => format!(
            "{who} left the rank's CPUs again after {TRIES} put-backs (now on {}): a fight \
             with whatever re-pins it; {}; {}",
            c.from,
            match held_on {
                true => "put back again and held on (--hold always), said no more",
                false => "left there now (--hold always keeps putting it back)",
            },
            fight_hint(&c.name)
        ),
        What::Chose => format!(
            "{who} set its own CPUs {} inside the rank after threadwise placed it: its \
             choice, left there (its role's CPUs are {})",
            c.from, c.to
        ),
    }
}

/// How many put-backs or sightings a reporter says one by one per rank and
/// round (`run`'s reporter, bind's holder); the rest are counted in the
/// summary. A fight and a choice are said always: the rules make each once
/// per thread.
pub(crate) const SAID: usize = 3;

/// What a reporter says of one rank's findings, and the summary at its end.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    ranks: std::collections::BTreeMap<usize, RankTally>,
}

#[derive(Debug, Default)]
struct RankTally {
    said: usize,
    /// Masks set (put-backs, held-on fights), sightings, fights.
    set: usize,
    seen: usize,
    fights: usize,
    threads: Vec<String>,
    /// Threads that chose their own CPUs after a placement.
    chose: Vec<String>,
}

/// How loud a finding is said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loud {
    Warning,
    Note,
}

impl Tally {
    /// Count `c` of `local_rank`; the line to say now, if any.
    pub(crate) fn add(&mut self, local_rank: usize, c: &Correction) -> Option<(Loud, String)> {
        let r = self.ranks.entry(local_rank).or_default();
        let who = format!("{} '{}' ({})", c.tid, c.name, c.role);
        let line = said(local_rank, c);
        match c.what {
            What::Chose => {
                r.chose.push(who);
                return Some((Loud::Note, line));
            }
            What::Fight { held_on } => {
                r.fights += 1;
                r.set += usize::from(held_on);
            }
            What::PutBack => r.set += 1,
            What::Seen => r.seen += 1,
        }
        if !r.threads.contains(&who) {
            r.threads.push(who);
        }
        if matches!(c.what, What::Fight { .. }) {
            return Some((Loud::Warning, line));
        }
        r.said += 1;
        (r.said <= SAID).then_some((Loud::Warning, line))
    }

    /// One or two lines per rank with findings, and a fresh tally.
    pub(crate) fn summary(&mut self) -> Vec<String> {
        let mut out = vec![];
        for (rank, r) in std::mem::take(&mut self.ranks) {
            let mut what = vec![];
            if r.set > 0 {
                what.push(format!("{} correction(s)", r.set));
            }
            if r.seen > 0 {
                what.push(format!(
                    "{} departure(s) seen, nothing set (--hold off)",
                    r.seen
                ));
            }
            if r.fights > 0 {
                what.push(format!("{} fight(s)", r.fights));
            }
            if !r.threads.is_empty() {
                out.push(format!(
                    "rank {rank}: {} of thread(s) that left the rank's CPUs: {}",
                    what.join(", "),
                    r.threads.join(", ")
                ));
            }
            if !r.chose.is_empty() {
                out.push(format!(
                    "rank {rank}: {} thread(s) set their own CPUs inside the rank after \
                     threadwise placed them, left there: {}",
                    r.chose.len(),
                    r.chose.join(", ")
                ));
            }
        }
        out
    }
}

fn set(tid: i32, cpus: &CpuSet) -> bool {
    crate::os::set_task_affinity(tid, &crate::os::mask_words(cpus)).is_ok()
}

#[cfg(test)]
mod tests;
