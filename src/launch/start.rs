//! Starting a round's ranks: every log opened and every birth prepared
//! before the first clone, each rank born by clone3 (or, where the kernel
//! refuses, forked by `Command`), then each exec waited for; a rank that
//! cannot start stops the others, never half a launch. And the reaping that
//! the supervisor and a failed start share: what has ended, and what the
//! ranks left behind (we are their subreaper).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::output;
use super::{LaunchError, RankLaunch};
use crate::measure::process;
use crate::os;
use crate::proc::contain::JobCgroup;

/// A started rank: its pid and its output's read ends (taken by the pumps).
pub(super) struct RankChild {
    pub pid: i32,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
}

/// A rank on its way: born (its exec not yet seen), or started already.
enum Starting {
    Born(crate::proc::born::Pending),
    Started(RankChild),
}

impl Starting {
    /// The started rank, once it has exec'd, its output pipes widened.
    fn started(self) -> std::io::Result<RankChild> {
        let c = match self {
            Starting::Born(p) => {
                let pid = p.pid;
                let (stdout, stderr) = p.born()?;
                RankChild {
                    pid,
                    stdout: Some(stdout),
                    stderr: Some(stderr),
                }
            }
            Starting::Started(c) => c,
        };
        for f in c.stdout.iter().chain(&c.stderr) {
            widen_pipe(f);
        }
        Ok(c)
    }
}

/// A pipe of `PIPE_BYTES` rather than the kernel's 64 KiB: a rank that
/// prints a lot wakes its pump a sixteenth as often, and each read takes up
/// to that much. Where the kernel refuses (an unprivileged user past
/// `fs.pipe-max-size`, a full `fs.pipe-user-pages-soft`), the pipe stays as it is.
fn widen_pipe(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(
            f.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            output::PIPE_BYTES as libc::c_int,
        )
    };
}

/// Can rank `r` be born by clone3 (its program a path: a bare name is left
/// to Command's own PATH search)?
fn may_be_born(r: &RankLaunch) -> bool {
    (r.program.is_some() || r.argv[0].as_encoded_bytes().contains(&b'/'))
        && crate::proc::born::allowed()
}

/// Start a rank: born by clone3 (a fork with raw syscalls until its exec)
/// from its prepared birth, in the job's cgroup if there is one (no
/// migration to wait for); its exec is waited for later, so births overlap.
/// Where the kernel refuses, or there is no prepared birth, forked by
/// `Command` (and moved into the cgroup before exec, where it may be).
fn spawn_rank(
    r: &RankLaunch,
    prepared: Option<&mut crate::proc::born::Prepared>,
    parent: i32,
    cgroup: Option<&JobCgroup>,
) -> std::io::Result<Starting> {
    // Born into the cgroup when there is one that still takes births; with
    // none, born all the same (no copy of us is made).
    let into = cgroup.map(JobCgroup::birth_fd);
    if let Some(prepared) = prepared
        && crate::proc::born::allowed()
        && into != Some(None)
    {
        match prepared.start(into.flatten()) {
            Ok(p) => return Ok(Starting::Born(p)),
            Err(crate::proc::born::BirthError::Refused(why)) => {
                if let Some(cg) = cgroup {
                    cg.no_births(&why);
                }
            }
            Err(crate::proc::born::BirthError::Failed(e)) => return Err(e),
        }
    }
    let mut c = command_rank(r, parent, cgroup.and_then(JobCgroup::procs_fd))?;
    let file = |fd: Option<std::os::fd::OwnedFd>| fd.map(File::from);
    Ok(Starting::Started(RankChild {
        pid: c.id() as i32,
        stdout: file(c.stdout.take().map(Into::into)),
        stderr: file(c.stderr.take().map(Into::into)),
    }))
}

/// A rank through `std::process::Command`, joining the cgroup (through
/// `cgroup.procs`) between fork and exec.
fn command_rank(
    r: &RankLaunch,
    parent: i32,
    cgroup_fd: Option<i32>,
) -> std::io::Result<std::process::Child> {
    // The resolved path spares a PATH search per rank; argv[0] stays as typed.
    let mut cmd = Command::new(
        r.program
            .as_ref()
            .map_or(r.argv[0].as_os_str(), |p| p.as_os_str()),
    );
    for k in &r.env_remove {
        cmd.env_remove(k);
    }
    cmd.arg0(&r.argv[0])
        .args(&r.argv[1..])
        .envs(&r.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let placement = r.placement.clone();
    // SAFETY: the closure only makes syscalls on memory prepared before fork,
    // and allocates nothing (an io::Error from a raw errno holds no heap).
    unsafe {
        cmd.pre_exec(move || {
            // Join the job's cgroup first: moving resets the CPU affinity.
            // A refusal fails the launch (the dry run said it would join).
            if let Some(fd) = cgroup_fd
                && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
            {
                return Err(std::io::Error::last_os_error());
            }
            if !os::die_with_parent(parent) {
                // threadwise exited during start-up.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            placement.apply().map_err(|(_, e)| e)
        });
    }
    cmd.spawn()
}

/// A rank's log file, never through a link planted at its name.
fn open_log(
    dir: &Option<PathBuf>,
    rank: usize,
    stream: &str,
) -> Result<Option<(File, String)>, LaunchError> {
    let Some(dir) = dir else { return Ok(None) };
    let path = dir.join(format!("rank-{rank}.{stream}"));
    let shown = path.display().to_string();
    crate::files::create_log(&path)
        .map(|f| Some((f, shown.clone())))
        .map_err(|e| LaunchError::LogFile {
            path: shown,
            why: e.to_string(),
        })
}

/// Reap every child that has ended; returns (pid, status, rusage).
pub(super) fn reap() -> Vec<(i32, libc::c_int, libc::rusage)> {
    reap_all().0
}

/// Reap what has ended, and say whether any child is still alive.
fn reap_all() -> (Vec<(i32, libc::c_int, libc::rusage)>, bool) {
    let mut out = vec![];
    loop {
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid out-parameter.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers to status and rusage.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru) };
        if pid <= 0 {
            // 0: children remain, none has ended; -1 (ECHILD): no child at all.
            return (out, pid == 0);
        }
        out.push((pid, status, ru));
    }
}

/// Kill and reap the descendants that were re-parented to us (subreaper),
/// except `keep` (the job cgroup's watchdog).
pub(super) fn kill_orphans(keep: Option<i32>) {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (_, alive) = reap_all();
        if !alive {
            return; // no descendant was re-parented to us
        }
        // Our children as the kernel lists them (every thread's), else a
        // scan of every process for its parent.
        let orphans: Vec<i32> = process::own_children()
            .unwrap_or_else(|| process::with_parent(me))
            .into_iter()
            .filter(|pid| Some(*pid) != keep)
            .collect();
        reap();
        if orphans.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in orphans {
            // SAFETY: plain syscall.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Start every rank before any output thread exists (where a rank is forked,
/// a process with one thread copies less). Every log is opened and every
/// birth prepared before the first clone, and freed after the last (what we
/// write between two clones costs a page fault per page per rank: 32 faults
/// a rank before, on the 2-core VM of BENCHMARKS.md). A rank that cannot
/// start stops the ones already started: never half a launch.
pub(super) fn spawn_all(
    ranks: &[RankLaunch],
    log_dir: &Option<PathBuf>,
    cgroup: Option<&JobCgroup>,
) -> Result<Vec<(RankChild, Logs)>, LaunchError> {
    let parent = std::process::id() as i32;
    let mut logs: Vec<Logs> = Vec::with_capacity(ranks.len());
    for r in ranks {
        logs.push((
            open_log(log_dir, r.local_rank, "stdout")?,
            open_log(log_dir, r.local_rank, "stderr")?,
        ));
    }
    let (handled, base) = match ranks.iter().any(may_be_born) {
        true => (
            crate::proc::vm::handled_signals(),
            crate::proc::born::base_env(),
        ),
        false => Default::default(),
    };
    let mut births = Vec::with_capacity(ranks.len());
    for r in ranks {
        births.push(match may_be_born(r) {
            true => match crate::proc::born::prepare(r, parent, &handled, &base) {
                Ok(b) => Some(b),
                Err(source) => {
                    return Err(LaunchError::Spawn {
                        rank: r.local_rank,
                        program: r.argv[0].to_string_lossy().into_owned(),
                        source,
                    });
                }
            },
            false => None,
        });
    }
    // Every rank cloned first, then each one's exec waited for: the waits
    // overlap instead of adding up.
    let mut starting: Vec<(Starting, Logs)> = Vec::with_capacity(ranks.len());
    let mut failed = None;
    for ((r, birth), logs) in ranks.iter().zip(births.iter_mut()).zip(logs) {
        match spawn_rank(r, birth.as_mut(), parent, cgroup) {
            Ok(s) => starting.push((s, logs)),
            Err(source) => {
                failed = Some((r, source));
                break;
            }
        }
    }
    drop(births);
    let mut children = vec![];
    for ((s, logs), r) in starting.into_iter().zip(ranks) {
        match s.started() {
            Ok(c) => children.push((c, logs)),
            // A birth that failed was reaped: its pid is nobody's to kill.
            Err(source) if failed.is_none() => failed = Some((r, source)),
            Err(_) => {}
        }
    }
    if let Some((r, source)) = failed {
        // Never half a launch.
        abort(children.iter().map(|(c, _)| c.pid), cgroup);
        return Err(LaunchError::Spawn {
            rank: r.local_rank,
            program: r.argv[0].to_string_lossy().into_owned(),
            source,
        });
    }
    Ok(children)
}

/// Stop the ranks started so far, and whatever they started.
fn abort(pids: impl Iterator<Item = i32>, cgroup: Option<&JobCgroup>) {
    for pid in pids {
        os::kill_group(pid, libc::SIGKILL);
        // Also the rank itself, should it not have made its group yet.
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    if let Some(cg) = cgroup {
        cg.kill();
    }
    kill_orphans(cgroup.and_then(JobCgroup::watchdog_pid));
}

pub(super) type Logs = (Option<(File, String)>, Option<(File, String)>);
