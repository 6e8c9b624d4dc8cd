//! One node's agent: join the rendezvous (hosting it when this node owns
//! the endpoint), then run each round's ranks through `supervise` with a
//! `Peer` that reports our failures and brings the other nodes' news: a stop,
//! a restart, the end, or silence from the rendezvous host.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::coord::Coordinator;
use super::proto::{self, Failure, Hello, PROTOCOL, Start, ToAgent, ToHost};
use super::server;
use super::{ClusterError, JobEnd};
use crate::launch::signals::{Action, SignalPipe, action};
use crate::launch::supervise::{LocalFailure, Peer};

/// What every node of a job gives alike (but `node_rank` and `nproc`).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// HOST:PORT of the rendezvous.
    pub endpoint: String,
    pub nnodes: usize,
    pub node_rank: Option<usize>,
    pub run_id: String,
    /// Ranks on this node.
    pub nproc: usize,
    pub max_restarts: u32,
    /// MASTER_PORT for every round (else a free port of node 0's).
    pub master_port: Option<u16>,
    /// How long the rendezvous waits for every node.
    pub join_timeout: Duration,
    /// Silence after which a node, or the rendezvous host, is lost.
    pub heartbeat_timeout: Duration,
    /// This node's name (its hostname).
    pub host: String,
    /// How long the rendezvous host stays, once its own part ended, for the
    /// others to stop theirs (their grace period and a little).
    pub linger: Duration,
}

/// The connection to the rendezvous host, shared with the reader, the
/// heartbeat and the supervisor.
#[derive(Debug)]
struct Link {
    writer: Mutex<TcpStream>,
    /// The round under way and its first global rank (from its Start).
    round: AtomicU32,
    rank_offset: AtomicUsize,
    stop: AtomicBool,
    /// Why the rendezvous host is gone, once it is.
    lost: Mutex<Option<String>>,
    last_heard: Mutex<Instant>,
    heartbeat_timeout: Duration,
    closing: AtomicBool,
    host: String,
    endpoint: String,
    /// Our failure in this round, as sent.
    failed: Mutex<Option<Failure>>,
}

impl Link {
    fn send(&self, m: &ToHost) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = proto::send(&mut *w, m);
    }

    fn lose(&self, why: String) {
        let mut l = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if l.is_none() {
            *l = Some(why);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    fn lost(&self) -> Option<String> {
        self.check_silence();
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn check_silence(&self) {
        let heard = *self.last_heard.lock().unwrap_or_else(|e| e.into_inner());
        let silent = heard.elapsed();
        if silent >= self.heartbeat_timeout && !self.closing.load(Ordering::SeqCst) {
            self.lose(format!(
                "no heartbeat from the rendezvous host {} for {} s",
                self.endpoint,
                silent.as_secs()
            ));
        }
    }
}

impl Peer for Link {
    fn stop_requested(&self) -> bool {
        self.check_silence();
        self.stop.load(Ordering::SeqCst)
    }

    fn local_failure(&self, what: LocalFailure) {
        let round = self.round.load(Ordering::SeqCst);
        let offset = self.rank_offset.load(Ordering::SeqCst);
        let f = match what {
            LocalFailure::Rank(local, pid, exit) => Failure {
                round,
                cause: format!(
                    "{}: rank {} (local rank {local}, pid {pid}) {}",
                    self.host,
                    offset + local,
                    exit.describe()
                ),
                code: exit.code(),
                restartable: true,
            },
            LocalFailure::Signal(sig) => Failure {
                round,
                cause: format!(
                    "{}: threadwise was stopped by {}",
                    self.host,
                    crate::os::signal_name(sig)
                ),
                code: 128 + sig,
                restartable: false,
            },
        };
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(f.clone());
        self.send(&ToHost::Failed(f));
    }
}

/// Does `endpoint` name this node? It does when we can listen on it.
fn host_listener(addrs: &[SocketAddr]) -> Option<TcpListener> {
    addrs.iter().find_map(|a| TcpListener::bind(a).ok())
}

/// A stopping signal that came while we waited, if any.
fn stop_signal(pipe: &SignalPipe, ms: i32) -> Option<i32> {
    pipe.wait(ms)
        .into_iter()
        .find(|s| matches!(action(*s), Some(Action::Stop(_))))
}

fn connect(
    addrs: &[SocketAddr],
    cfg: &AgentConfig,
    pipe: &SignalPipe,
) -> Result<TcpStream, ClusterError> {
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        for a in addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = e.to_string(),
            }
        }
        if t0.elapsed() >= cfg.join_timeout {
            return Err(ClusterError::Unreachable {
                endpoint: cfg.endpoint.clone(),
                secs: cfg.join_timeout.as_secs(),
                why: last,
            });
        }
        if let Some(sig) = stop_signal(pipe, 500) {
            return Err(ClusterError::Signal(sig));
        }
    }
}

fn reader(link: Arc<Link>, stream: TcpStream, tx: mpsc::Sender<ToAgent>) {
    let mut r = BufReader::new(stream);
    loop {
        let m = proto::recv::<ToAgent>(&mut r);
        *link.last_heard.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        match m {
            Ok(Some(ToAgent::Beat)) => {}
            Ok(Some(ToAgent::Stop { round, .. })) => {
                if round == link.round.load(Ordering::SeqCst) {
                    link.stop.store(true, Ordering::SeqCst);
                }
                // The cause comes again with the End; nothing to keep.
            }
            Ok(Some(ToAgent::Start(st))) => {
                // Here, not when the round starts: a stop may follow at once.
                link.round.store(st.round, Ordering::SeqCst);
                link.rank_offset.store(st.rank_offset, Ordering::SeqCst);
                *link.failed.lock().unwrap_or_else(|e| e.into_inner()) = None;
                link.stop.store(false, Ordering::SeqCst);
                if tx.send(ToAgent::Start(st)).is_err() {
                    return;
                }
            }
            Ok(Some(m)) => {
                let end = matches!(
                    m,
                    ToAgent::End { .. } | ToAgent::Refused { .. } | ToAgent::Incomplete { .. }
                );
                if end {
                    link.closing.store(true, Ordering::SeqCst);
                }
                if tx.send(m).is_err() || end {
                    return;
                }
            }
            Ok(None) => {
                if !link.closing.load(Ordering::SeqCst) {
                    link.lose(format!(
                        "the rendezvous host {} closed the connection",
                        link.endpoint
                    ));
                }
                return;
            }
            Err(e) => {
                link.lose(format!("the connection to {} failed: {e}", link.endpoint));
                return;
            }
        }
    }
}

fn beater(link: Arc<Link>) {
    while !link.closing.load(Ordering::SeqCst) {
        link.send(&ToHost::Beat);
        std::thread::sleep(server::BEAT);
    }
}

/// Wait for the next message that is not a beat, watching signals and the
/// link.
fn next(
    rx: &Receiver<ToAgent>,
    link: &Link,
    pipe: &SignalPipe,
    limit: Option<Duration>,
) -> Result<ToAgent, ClusterError> {
    let t0 = Instant::now();
    loop {
        if let Ok(m) = rx.recv_timeout(Duration::from_millis(100)) {
            return Ok(m);
        }
        if let Some(why) = link.lost() {
            return Err(ClusterError::Lost(why));
        }
        if let Some(sig) = stop_signal(pipe, 0) {
            return Err(ClusterError::Signal(sig));
        }
        if limit.is_some_and(|l| t0.elapsed() >= l) {
            return Err(ClusterError::Lost(format!(
                "the rendezvous host {} did not answer in {} s",
                link.endpoint,
                limit.unwrap_or_default().as_secs()
            )));
        }
    }
}

/// Join the job and run its rounds: `round` starts and supervises this
/// node's ranks for a `Start` and returns their exit code.
pub fn run(
    cfg: &AgentConfig,
    mut round: impl FnMut(&Start, Arc<dyn Peer>) -> i32,
) -> Result<JobEnd, ClusterError> {
    let pipe = SignalPipe::get().map_err(|e| ClusterError::Io(e.to_string()))?;
    let addrs: Vec<SocketAddr> = cfg
        .endpoint
        .to_socket_addrs()
        .map_err(|e| ClusterError::Resolve(cfg.endpoint.clone(), e.to_string()))?
        .collect();
    let listener = host_listener(&addrs);
    let hosting = listener.is_some();
    let server = match listener {
        Some(l) => Some(
            server::start(
                l,
                Coordinator::new(
                    cfg.nnodes,
                    &cfg.run_id,
                    cfg.max_restarts,
                    cfg.master_port,
                    cfg.join_timeout,
                    cfg.heartbeat_timeout,
                    Instant::now(),
                ),
            )
            .map_err(|e| ClusterError::Io(e.to_string()))?,
        ),
        None => None,
    };
    let stream = connect(&addrs, cfg, pipe)?;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let link = Arc::new(Link {
        writer: Mutex::new(
            stream
                .try_clone()
                .map_err(|e| ClusterError::Io(e.to_string()))?,
        ),
        round: AtomicU32::new(0),
        rank_offset: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        lost: Mutex::new(None),
        last_heard: Mutex::new(Instant::now()),
        heartbeat_timeout: cfg.heartbeat_timeout,
        closing: AtomicBool::new(false),
        host: cfg.host.clone(),
        endpoint: cfg.endpoint.clone(),
        failed: Mutex::new(None),
    });
    link.send(&ToHost::Hello {
        protocol: PROTOCOL.into(),
        hello: Hello {
            host: cfg.host.clone(),
            nproc: cfg.nproc,
            nnodes: cfg.nnodes,
            node_rank: cfg.node_rank,
            run_id: cfg.run_id.clone(),
            hosting,
            port: crate::launch::env::free_port().unwrap_or(29500),
        },
    });
    let (tx, rx) = mpsc::channel();
    {
        let link = link.clone();
        std::thread::spawn(move || reader(link, stream, tx));
    }
    {
        let link = link.clone();
        std::thread::spawn(move || beater(link));
    }
    let result = rounds(cfg, &link, &rx, pipe, &mut round);
    link.closing.store(true, Ordering::SeqCst);
    let told = matches!(result, Ok(_) | Err(ClusterError::Signal(_)));
    if let (Some(h), true) = (server, told) {
        // The other nodes hear the end from us: keep hosting while they stop
        // their ranks (their grace period), unless a second signal comes.
        let t0 = Instant::now();
        while !h.is_finished() && t0.elapsed() < cfg.linger {
            if stop_signal(pipe, 20).is_some() {
                break;
            }
        }
    }
    result
}

fn rounds(
    cfg: &AgentConfig,
    link: &Arc<Link>,
    rx: &Receiver<ToAgent>,
    pipe: &SignalPipe,
    round: &mut impl FnMut(&Start, Arc<dyn Peer>) -> i32,
) -> Result<JobEnd, ClusterError> {
    // The rendezvous itself ends (Incomplete) at its own timeout; a little
    // more here covers a host that never answers. Later waits are bounded by
    // the heartbeat instead.
    let mut wait = Some(cfg.join_timeout + Duration::from_secs(5));
    let mut last_start: Option<Start> = None;
    loop {
        let msg = match next(rx, link, pipe, wait) {
            Ok(m) => m,
            Err(ClusterError::Signal(sig)) => {
                // Stopped between rounds or before the start: the others
                // hear it as a stop, not as a lost node.
                link.local_failure(LocalFailure::Signal(sig));
                return Err(ClusterError::Signal(sig));
            }
            Err(e) => return Err(e),
        };
        match msg {
            ToAgent::Start(s) => {
                wait = None;
                let code = round(&s, link.clone() as Arc<dyn Peer>);
                if let Some(why) = link.lost() {
                    return Err(ClusterError::Lost(why));
                }
                // Read before saying we ended: a restart's Start resets it.
                let ours = link
                    .failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                link.send(&ToHost::Ended {
                    round: s.round,
                    code,
                    port: crate::launch::env::free_port().unwrap_or(29500),
                });
                // Stopped by the user: the others were told; we do not wait.
                if let Some(f) = ours.filter(|f| !f.restartable) {
                    return Ok(JobEnd {
                        code: f.code,
                        cause: Some(f.cause),
                        start: Some(s),
                    });
                }
                last_start = Some(s);
            }
            ToAgent::End { code, cause } => {
                return Ok(JobEnd {
                    code,
                    cause,
                    start: last_start,
                });
            }
            ToAgent::Refused { why } => return Err(ClusterError::Refused(why)),
            ToAgent::Incomplete { why } => return Err(ClusterError::Incomplete(why)),
            ToAgent::Beat | ToAgent::Stop { .. } => {}
        }
    }
}
