//! Signals as events: the handlers write the signal number to a non-blocking,
//! close-on-exec pipe that the supervisor polls, so nothing but `write`
//! happens inside a handler. We keep this self-pipe rather than signal-hook:
//! it is the one mechanism signal-hook's pipe module implements too, and the
//! supervisor already polls one fd; a crate would add a thread or a second
//! registry for the same bytes.
//!
//! What each signal does (see `Action`): SIGINT, SIGTERM, SIGHUP and SIGQUIT
//! stop the ranks (SIGQUIT as SIGTERM), SIGUSR1/SIGUSR2 are passed on (Slurm's
//! `--signal`, Lightning's requeue), SIGTSTP stops the ranks and then us
//! (Ctrl-Z), SIGCONT continues them. A stopping signal that was ignored when
//! we started (`nohup`, a shell's background job) stays ignored, for us and,
//! through exec, for the ranks.

use std::sync::atomic::{AtomicI32, Ordering};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; errno is saved and restored.
        unsafe {
            let saved = *libc::__errno_location();
            libc::write(fd, (&b as *const u8).cast(), 1);
            *libc::__errno_location() = saved;
        }
    }
}

/// The read end of the signal pipe.
pub(crate) struct SignalPipe {
    fd: libc::c_int,
}

/// What the supervisor does with a signal it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stop every rank with this signal, grace period, SIGKILL.
    Stop(i32),
    /// Send it to every rank and go on.
    Forward,
    /// Stop the ranks (SIGTSTP), then ourselves.
    Suspend,
    /// A child changed state: reap.
    Child,
}

pub(crate) fn action(sig: i32) -> Option<Action> {
    let bit = |s: i32| 1u8 << (s == libc::SIGUSR2) as u8;
    Some(match sig {
        libc::SIGINT | libc::SIGTERM | libc::SIGHUP => Action::Stop(sig),
        libc::SIGQUIT => Action::Stop(libc::SIGTERM),
        libc::SIGUSR1 | libc::SIGUSR2
            if USR_STOPS.load(std::sync::atomic::Ordering::Relaxed) & bit(sig) != 0 =>
        {
            Action::Stop(sig)
        }
        libc::SIGUSR1 | libc::SIGUSR2 | libc::SIGCONT => Action::Forward,
        libc::SIGTSTP => Action::Suspend,
        libc::SIGCHLD => Action::Child,
        _ => return None,
    })
}

/// SIGUSR1 (bit 0) and SIGUSR2 (bit 1) stop the job, forwarded, rather than
/// pass through (torchrun's --signals-to-handle naming them).
static USR_STOPS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Make these user signals stop the job (set once, before the ranks start).
pub(crate) fn stop_on(sigs: &[i32]) {
    let mut bits = 0u8;
    for s in sigs {
        bits |= match *s {
            libc::SIGUSR1 => 1,
            libc::SIGUSR2 => 2,
            _ => 0,
        };
    }
    USR_STOPS.store(bits, std::sync::atomic::Ordering::Relaxed);
}

/// Every signal the supervisor handles.
const HANDLED: [i32; 9] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTSTP,
    libc::SIGCONT,
    libc::SIGCHLD,
];

/// Signals left alone when they were ignored at start (nohup, `cmd &`).
const KEEP_IGNORED: [i32; 3] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT];

fn ignored(sig: i32) -> bool {
    // SAFETY: querying the disposition into a zeroed sigaction.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

impl SignalPipe {
    /// The process's signal pipe, installed on first use (later runs, such as
    /// tune's trials, share it).
    pub(crate) fn get() -> std::io::Result<&'static SignalPipe> {
        static PIPE: std::sync::OnceLock<SignalPipe> = std::sync::OnceLock::new();
        if let Some(p) = PIPE.get() {
            return Ok(p);
        }
        let p = Self::install()?;
        Ok(PIPE.get_or_init(|| p))
    }

    fn install() -> std::io::Result<SignalPipe> {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        WRITE_FD.store(fds[1], Ordering::Relaxed);
        for sig in HANDLED
            .iter()
            .filter(|s| !(KEEP_IGNORED.contains(s) && ignored(**s)))
        {
            // SAFETY: a zeroed sigaction with a valid handler and SA_RESTART.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(*sig, &sa, std::ptr::null_mut());
            }
        }
        Ok(SignalPipe { fd: fds[0] })
    }

    /// Wait up to `timeout_ms` (-1: forever) and return the signals that came.
    pub(crate) fn wait(&self, timeout_ms: i32) -> Vec<i32> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        let mut out = vec![];
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            out.extend(buf[..n as usize].iter().map(|b| *b as i32));
        }
        out
    }
}
