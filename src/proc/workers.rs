//! `run` moves each rank's DataLoader workers onto the plan's worker CPUs from
//! outside, with no code in the user's process: every supervisor tick (100 ms)
//! it walks the rank's descendants (`/proc/PID/task/TID/children`) and sets the
//! CPU mask of every thread of each new worker with `sched_setaffinity`.
//!
//! Which descendants are workers: a process running the same program as its
//! parent (`/proc/PID/exe`): a fork (DataLoader's default start method) or a
//! re-exec of the same interpreter (spawn, forkserver, our workload's loader
//! processes). A different program (the python a shell script starts, a
//! compiler) is the rank's own work and keeps the rank's mask; so are its
//! threads. Threads a worker creates later inherit its new mask; a worker
//! whose thread count changed is set again on the next tick.
//!
//! Limits: a new worker runs up to one tick on the rank's CPUs before it is
//! caught. Under `bind` (which execs the rank) no one moves workers, except
//! with `--roles`, where its holder process (`adopt::holder`) runs a mover:
//! workers forked by the main thread would inherit its service core.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::measure::process::{children, exe, tasks};

/// One rank's mover.
#[derive(Debug)]
pub(crate) struct Mover {
    words: Vec<u64>,
    /// Workers set so far, with the thread count they had then.
    seen: HashMap<i32, usize>,
}

impl Mover {
    pub(crate) fn new(words: Vec<u64>) -> Mover {
        Mover {
            words,
            seen: HashMap::new(),
        }
    }

    /// Find the rank's workers and set the new ones; returns how many
    /// processes were set this time.
    pub(crate) fn tick(&mut self, rank: i32) -> usize {
        let mut moved = 0;
        let mut stack: Vec<(i32, Option<PathBuf>)> = vec![(rank, exe(rank))];
        let mut alive = vec![];
        while let Some((pid, pexe)) = stack.pop() {
            for c in children(pid) {
                let cexe = exe(c);
                let worker = cexe.is_some() && cexe == pexe;
                if worker {
                    alive.push(c);
                    let t = tasks(c);
                    if self.seen.get(&c) != Some(&t.len()) {
                        for tid in &t {
                            // A task that ended meanwhile is no error.
                            let _ = crate::os::set_task_affinity(*tid, &self.words);
                        }
                        self.seen.insert(c, t.len());
                        moved += 1;
                    }
                }
                stack.push((c, cexe));
            }
        }
        self.seen.retain(|p, _| alive.contains(p));
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn allowed(pid: i32) -> String {
        crate::measure::process::affinity(pid).to_string()
    }

    #[test]
    fn moves_forked_workers_not_other_programs() {
        let me = crate::cpuset::CpuSet::parse_list(&allowed(std::process::id() as i32)).unwrap();
        let first = me.first().unwrap();
        let one: crate::cpuset::CpuSet = std::iter::once(first).collect();
        // A shell (the rank) forks a subshell (a worker: same program) and
        // starts sleep (another program).
        let mut rank = Command::new("bash")
            .args(["-c", "( while :; do sleep 0.05; done ) & sleep 30 & wait"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = rank.id() as i32;
        let t = Instant::now();
        // Both children there, and sleep's exec done (until then it is a
        // fork of bash too, and would count as a worker: seen under load).
        let kids = loop {
            let k = children(pid);
            let execd = k.iter().any(|c| exe(*c) != exe(pid));
            if (k.len() >= 2 && execd) || t.elapsed() > Duration::from_secs(5) {
                break k;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut m = Mover::new(crate::os::mask_words(&one));
        assert_eq!(m.tick(pid), 1, "one worker among {kids:?}");
        let (mut worker, mut other) = (None, None);
        for k in &kids {
            if exe(*k) == exe(pid) {
                worker = Some(*k);
            } else {
                other = Some(*k);
            }
        }
        assert_eq!(allowed(worker.unwrap()), first.to_string());
        assert_eq!(
            allowed(other.unwrap()),
            me.to_string(),
            "sleep is not a worker"
        );
        assert_eq!(allowed(pid), me.to_string(), "the rank keeps its mask");
        assert_eq!(m.tick(pid), 0, "set once");
        for k in &kids {
            // SAFETY: plain syscall on our own test children.
            unsafe { libc::kill(*k, libc::SIGKILL) };
        }
        let _ = rank.kill();
        let _ = rank.wait();
    }
}
