//! Holding a rank's threads in place while it runs, from outside the process
//! (`run`'s supervisor, every other 100 ms tick beside the worker mover; `bind`'s
//! holder process): a thread a library moved off the rank's CPUs is put back,
//! and with `--roles` each new thread goes to its role's CPUs.
//!
//! The rules (`decide`, pure):
//! - A thread whose mask reaches outside the rank's CPUs (NCCL 2.29 leaking
//!   its GPU-local mask into the caller's threads, a library pinning to
//!   "every CPU") is put back on its role's CPUs once it has been seen
//!   outside on two looks in a row, `EVERY` apart (so a library that widens
//!   a mask for less than that
//!   and restores it, as NCCL 2.30 does, is left alone): a correction,
//!   counted and said.
//! - A mask inside the rank's CPUs is never fought, with one exception under
//!   `--roles`: a mask the thread inherited (the rank's whole set, the
//!   service or team set a creator had, or the one we set before its name
//!   told its role) is narrowed to its role's CPUs: a placement, not a
//!   correction. A mask of the thread's own choosing inside the rank
//!   (OMP_PROC_BIND's one core) stays.
//! - `--hold off`: the same is seen, counted and said; nothing is set.
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
        /// Put them back (and place threads by role under --roles).
        #[default]
        On => "on",
        /// Only watch: count and say them.
        Off => "off",
    }
}

/// Where a rank's threads belong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldSpec {
    /// The rank's CPUs.
    pub cpus: CpuSet,
    /// Its role layout, with `--roles`.
    pub roles: Option<RoleCpus>,
}

impl HoldSpec {
    fn target(&self, role: Role) -> &CpuSet {
        self.roles.as_ref().map_or(&self.cpus, |l| l.of(role))
    }
}

/// One correction: a thread found outside its rank's CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Correction {
    pub tid: i32,
    pub name: String,
    pub role: Role,
    /// Its mask when found.
    pub from: CpuSet,
    /// Where it was put back (or would be, with `--hold off`).
    pub to: CpuSet,
    /// Whether the mask was set (false: `--hold off`, or the thread ended).
    pub applied: bool,
}

/// What to do with one thread this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Leave,
    /// Outside the rank once: look again next tick.
    Watch,
    /// Outside the rank again: put it back here.
    Correct(CpuSet),
    /// An inherited mask under `--roles`: place it by its role.
    Place(CpuSet),
}

/// How many looks in a row a thread is seen outside before it is put back.
pub(crate) const OFF_TICKS: u8 = 2;
/// How often a holder looks: a thread moved off its rank's CPUs is back
/// within 2-3 looks (0.4-0.6 s), and 16 ranks of 16 threads cost the
/// supervisor ~0.3-0.4% of a core (scripts/bench-hold.sh).
pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// A thread's name is read again for this many looks after it is first seen
/// (5 s).
const NAME_TICKS: u32 = 25;

/// The rule for one thread: `mask` now, `set` what we set on it before,
/// `off` the ticks in a row it was outside before this one.
pub(crate) fn decide(
    spec: &HoldSpec,
    role: Role,
    mask: &CpuSet,
    set: Option<&CpuSet>,
    off: u8,
) -> Step {
    let target = spec.target(role);
    if mask.is_empty() {
        return Step::Leave;
    }
    if !mask.is_subset(&spec.cpus) {
        return match off + 1 >= OFF_TICKS {
            true => Step::Correct(target.clone()),
            false => Step::Watch,
        };
    }
    let Some(l) = &spec.roles else {
        return Step::Leave;
    };
    let inherited = *mask == spec.cpus
        || *mask == l.service
        || *mask == l.team
        || set.is_some_and(|s| s == mask);
    match inherited && mask != target {
        true => Step::Place(target.clone()),
        false => Step::Leave,
    }
}

#[derive(Debug)]
struct Seen {
    name: String,
    role: Role,
    ticks: u32,
    set: Option<CpuSet>,
    off: u8,
}

/// One rank's holder.
#[derive(Debug)]
pub(crate) struct Holder {
    spec: HoldSpec,
    /// false: `--hold off`, watch only.
    hold: bool,
    seen: HashMap<i32, Seen>,
    /// When to look next.
    next: std::time::Instant,
}

impl Holder {
    pub(crate) fn new(spec: HoldSpec, hold: bool) -> Holder {
        Holder {
            spec,
            hold,
            seen: HashMap::new(),
            next: std::time::Instant::now(),
        }
    }

    /// Every `EVERY` (called more often, it skips): look at every thread of
    /// `pid` once; the corrections made.
    pub(crate) fn tick(&mut self, pid: i32) -> Vec<Correction> {
        let now = std::time::Instant::now();
        if now < self.next {
            return vec![];
        }
        self.next = now + EVERY;
        self.look(pid)
    }

    fn look(&mut self, pid: i32) -> Vec<Correction> {
        let mut out = vec![];
        let tids = tasks(pid);
        self.seen.retain(|t, _| tids.contains(t));
        for tid in tids {
            let Ok(mask) = crate::os::task_affinity(tid) else {
                continue; // ended meanwhile
            };
            let s = self.seen.entry(tid).or_insert_with(|| Seen {
                name: String::new(),
                role: Role::Unknown,
                ticks: 0,
                set: None,
                off: 0,
            });
            if s.ticks < NAME_TICKS {
                if let Some(n) = comm_of_task(pid, tid) {
                    s.role = classify(pid, tid, &n, None);
                    s.name = n;
                }
            }
            s.ticks = s.ticks.saturating_add(1);
            match decide(&self.spec, s.role, &mask, s.set.as_ref(), s.off) {
                Step::Leave => s.off = 0,
                Step::Watch => s.off += 1,
                Step::Place(to) => {
                    s.off = 0;
                    if self.hold && set(tid, &to) {
                        s.set = Some(to);
                    }
                }
                Step::Correct(to) => {
                    s.off = 0;
                    let applied = self.hold && set(tid, &to);
                    if applied {
                        s.set = Some(to.clone());
                    }
                    out.push(Correction {
                        tid,
                        name: s.name.clone(),
                        role: s.role,
                        from: mask,
                        to,
                        applied,
                    });
                }
            }
        }
        out
    }
}

/// One correction in words (run's reporter, bind's holder).
pub(crate) fn said(local_rank: usize, c: &Correction) -> String {
    format!(
        "rank {local_rank}: thread {} '{}' ({}) was on CPUs {}, outside the rank's: {}",
        c.tid,
        c.name,
        c.role,
        c.from,
        match c.applied {
            true => format!("put back on {}", c.to),
            false => format!("left there (--hold off; its role's CPUs are {})", c.to),
        }
    )
}

fn set(tid: i32, cpus: &CpuSet) -> bool {
    crate::os::set_task_affinity(tid, &crate::os::mask_words(cpus)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(s: &str) -> CpuSet {
        CpuSet::parse_list(s).unwrap()
    }

    fn spec(roles: bool) -> HoldSpec {
        HoldSpec {
            cpus: set_of("4-7"),
            roles: roles.then(|| RoleCpus {
                service: set_of("4"),
                team: set_of("5-7"),
            }),
        }
    }

    #[test]
    fn outside_the_rank_twice_is_put_back_on_the_roles_cpus() {
        let wide = set_of("0-15");
        assert_eq!(
            decide(&spec(false), Role::Comm, &wide, None, 0),
            Step::Watch
        );
        assert_eq!(
            decide(&spec(false), Role::Comm, &wide, None, 1),
            Step::Correct(set_of("4-7"))
        );
        assert_eq!(
            decide(&spec(true), Role::Comm, &wide, None, 1),
            Step::Correct(set_of("4"))
        );
        assert_eq!(
            decide(&spec(true), Role::Unknown, &set_of("0"), None, 1),
            Step::Correct(set_of("5-7"))
        );
    }

    #[test]
    fn inside_the_rank_only_inherited_masks_are_placed() {
        // Whole-rank layout: anything inside stays.
        for m in ["4-7", "5", "4,6"] {
            assert_eq!(
                decide(&spec(false), Role::Main, &set_of(m), None, 0),
                Step::Leave
            );
        }
        let s = spec(true);
        // Inherited: the rank's set, main's service set, the team's.
        assert_eq!(
            decide(&s, Role::Main, &set_of("4-7"), None, 0),
            Step::Place(set_of("4"))
        );
        assert_eq!(
            decide(&s, Role::Unknown, &set_of("4"), None, 0),
            Step::Place(set_of("5-7"))
        );
        assert_eq!(
            decide(&s, Role::Comm, &set_of("5-7"), None, 0),
            Step::Place(set_of("4"))
        );
        assert_eq!(decide(&s, Role::Comm, &set_of("4"), None, 0), Step::Leave);
        // Its own choice inside the rank (OMP_PROC_BIND's one core): left.
        assert_eq!(
            decide(&s, Role::Unknown, &set_of("6"), None, 0),
            Step::Leave
        );
        assert_eq!(decide(&s, Role::Main, &set_of("5"), None, 0), Step::Leave);
        // What we set before, then its name told another role: placed again.
        assert_eq!(
            decide(&s, Role::Comm, &set_of("6"), Some(&set_of("6")), 0),
            Step::Place(set_of("4"))
        );
    }
}
