//! One node's agent: join the rendezvous (hosting it when this node owns
//! the endpoint), then run each round's ranks through `supervise` with a
//! `Peer` that reports our failures and brings the other nodes' news: a stop,
//! a restart, the end, or silence from the rendezvous host. What to do is
//! decided by `state::AgentState` (pure); this file carries it out: one
//! socket, a reader thread and a heartbeat thread, both joined on every path.

use std::io::BufReader;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Side};
use super::coord::Coordinator;
use super::proto::{self, Dir, Hello, PROTOCOL, Report, Seal, Start, ToAgent, ToHost};
use super::server;
use super::state::{Action, AgentState, Event};
use super::{ClusterError, JobEnd};
use crate::launch::supervise::{LocalFailure, Peer};
use crate::proc::signals::{self, SignalPipe};

/// What every node of a job gives alike (but `node_rank` and `nproc`).
#[derive(Debug, Clone)]
pub(crate) struct AgentConfig {
    /// HOST:PORT of the rendezvous.
    pub endpoint: crate::netif::Endpoint,
    /// The most nodes (`--nnodes N`, or MAX of `MIN:MAX`).
    pub nnodes: usize,
    /// The fewest (MIN; `nnodes` for a fixed job).
    pub min_nodes: usize,
    /// How long an elastic rendezvous waits for more nodes once MIN joined.
    pub last_call: Duration,
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
    /// The address this node gives the others (torchrun's --local-addr):
    /// MASTER_ADDR when it is node 0; else the address it connects from.
    pub local_addr: Option<String>,
    /// How long the rendezvous host stays, once its own part ended, for the
    /// others to stop theirs (their grace period and a little).
    pub linger: Duration,
    /// How the nodes know each other (the same on every node).
    pub auth: Auth,
}

/// The agent's state and its connection, shared by the main thread (rounds),
/// the reader, the heartbeat and the supervisor (as its `Peer`).
#[derive(Debug)]
struct Link {
    state: Mutex<AgentState>,
    /// The stream and the seal of what we send (one sequence, whichever
    /// thread sends).
    writer: Mutex<(TcpStream, Seal)>,
    /// Starts and the end, for the main thread.
    todo: Sender<Action>,
}

impl Link {
    fn state(&self) -> MutexGuard<'_, AgentState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, m: &ToHost) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let (stream, seal) = &mut *w;
        let _ = seal.send(stream, m);
    }

    /// Apply an event and carry out its actions; messages are sent in the
    /// order the state decided them (the state stays locked meanwhile).
    fn apply(&self, ev: Event) {
        let mut st = self.state();
        for a in st.on(ev, Instant::now()) {
            match a {
                Action::Send(m) => self.send(&m),
                other => {
                    let _ = self.todo.send(other);
                }
            }
        }
    }
}

impl Peer for Link {
    fn stop_requested(&self) -> bool {
        self.state().stop_requested(Instant::now())
    }

    fn local_failure(&self, what: LocalFailure) {
        self.apply(Event::Local(what));
    }
}

/// Does `endpoint` name this node? It does when we can listen on it. A
/// host *name* that resolves to loopback (`localhost`, which TorchX gives
/// node 0, or Debian's own-hostname 127.0.1.1) names this node to itself
/// only: the others reach it at another address, so it listens on every
/// address of the port, as torchrun's c10d store does. A loopback address
/// typed as such stays loopback (agents on one machine).
fn host_listener(endpoint: &crate::netif::Endpoint, addrs: &[SocketAddr]) -> Option<TcpListener> {
    let named = endpoint.is_named();
    addrs.iter().find_map(|a| {
        let mut a = *a;
        if named && a.ip().is_loopback() {
            a.set_ip(match a.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            });
        }
        TcpListener::bind(a).ok()
    })
}

/// A stopping signal that came while we waited, if any.
fn stop_signal(pipe: &SignalPipe, ms: i32) -> Option<i32> {
    pipe.wait(ms)
        .into_iter()
        .find(|s| matches!(signals::action(*s), Some(signals::Action::Stop(_))))
}

/// What a try that was told Busy says.
const BUSY: &str = "the rendezvous host is busy";

/// Why a try at the host's door did not get in.
enum Turned {
    /// Busy, closed or silent: try again until the join timeout.
    Again(String),
    Away(ClusterError),
}

/// A connection through the door: the stream, the reader of what the host
/// says next, and the seals of what we send and what we read.
type Entered = (TcpStream, BufReader<TcpStream>, Seal, Seal);

/// Connect and go through the host's door (`handshake`), trying again
/// while the door is busy or the host not there yet, until the join timeout.
fn enter(
    addrs: &[SocketAddr],
    cfg: &AgentConfig,
    hosting: bool,
    pipe: &SignalPipe,
) -> Result<Entered, ClusterError> {
    let t0 = Instant::now();
    let mut last = String::new();
    // How often the host said it was busy: what the node says at the end,
    // whatever the last try met (a host that answered busy is there).
    let mut busy = 0u32;
    loop {
        for a in addrs {
            let s = match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => s,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let _ = s.set_nodelay(true);
            let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
            match handshake(&s, cfg, hosting) {
                Ok((r, send, recv)) => return Ok((s, r, send, recv)),
                Err(Turned::Away(e)) => return Err(e),
                Err(Turned::Again(why)) => {
                    busy += u32::from(why == BUSY);
                    last = why;
                }
            }
        }
        if t0.elapsed() >= cfg.join_timeout {
            return Err(ClusterError::Unreachable {
                endpoint: cfg.endpoint.to_string(),
                secs: cfg.join_timeout.as_secs(),
                why: match busy {
                    0 => last,
                    n => {
                        format!("it answered that it was busy, {n} time(s) (the last try: {last})")
                    }
                },
            });
        }
        if let Some(sig) = stop_signal(pipe, 500) {
            return Err(ClusterError::Signal(sig));
        }
    }
}

/// Say hello; where the job authenticates, check the host's proof of our
/// nonce (so a host without the job's secret or MUNGE is found out before
/// we say more) and prove ourselves; then the host's Welcome, sealed under
/// the session key (so a host that relayed someone else's proof is found
/// out too). The reader, and the seals of what we send and read.
fn handshake(
    s: &TcpStream,
    cfg: &AgentConfig,
    hosting: bool,
) -> Result<(BufReader<TcpStream>, Seal, Seal), Turned> {
    let io = |e: std::io::Error| Turned::Again(e.to_string());
    let mut w = s.try_clone().map_err(io)?;
    let mut r = BufReader::new(s.try_clone().map_err(io)?);
    let mine = auth::nonce()
        .map_err(|e| Turned::Away(ClusterError::Io(format!("no nonce for this node: {e}"))))?;
    let hello = Hello {
        host: cfg.host.clone(),
        nproc: cfg.nproc,
        nnodes: cfg.nnodes,
        min_nodes: match cfg.min_nodes < cfg.nnodes {
            true => cfg.min_nodes,
            false => 0,
        },
        node_rank: cfg.node_rank,
        run_id: cfg.run_id.clone(),
        hosting,
        port: crate::launch::env::free_port().unwrap_or(29500),
        auth: cfg.auth.mode().to_string(),
        nonce: mine.clone(),
        addr: cfg.local_addr.clone(),
        ticket: cfg.auth.ticket(&cfg.run_id, &mine, auth::unix_now()),
    };
    // What this node says of itself is bound to the session: a relay that
    // rewrites it makes both proofs fail.
    let said = auth::hello_digest(&serde_json::to_vec(&hello).unwrap_or_default());
    proto::send(
        &mut w,
        &ToHost::Hello {
            protocol: PROTOCOL.into(),
            hello,
        },
    )
    .map_err(io)?;
    let _ = s.set_read_timeout(Some(server::HELLO_DEADLINE + Duration::from_secs(5)));
    let fake = |why: String| {
        Turned::Away(ClusterError::NotGenuine(format!(
            "the rendezvous host at {} is not this job's: {why}",
            cfg.endpoint
        )))
    };
    let mut proven = cfg.auth.is_open();
    // Plain until the host has proved itself; then sealed under the key.
    let mut recv = Seal::plain(Dir::ToAgent);
    let mut key = None;
    loop {
        match recv.recv::<ToAgent>(&mut r, proto::MAX_LINE) {
            Ok(Some(ToAgent::Challenge { nonce, proof })) if !proven => {
                let session = auth::Session {
                    run_id: &cfg.run_id,
                    agent_nonce: &mine,
                    host_nonce: &nonce,
                    hello: &said,
                };
                let theirs = cfg.auth.check(Side::Host, &session, &proof).map_err(|e| {
                    // Both ends prove the session, this node's hello in
                    // it: a host without the secret and a relay that
                    // changed the hello on its way fail alike.
                    Turned::Away(ClusterError::NotGenuine(format!(
                        "the rendezvous host at {}'s proof fails ({e}): either it is not \
                             this job's (it does not hold the job's {}), or something between \
                             the nodes changed this node's hello on its way (a relay or proxy \
                             rewriting the connection)",
                        cfg.endpoint,
                        cfg.auth.mode()
                    )))
                })?;
                let ours = cfg.auth.prove(Side::Agent, &session).map_err(|e| {
                    Turned::Away(ClusterError::Io(format!("cannot prove this node: {e}")))
                })?;
                proto::send(&mut w, &ToHost::Proof { proof: ours.text }).map_err(io)?;
                key = theirs.or(ours.key);
                recv = Seal::new(key.clone(), Dir::ToAgent);
                proven = true;
            }
            Ok(Some(ToAgent::Welcome)) if proven => {
                let _ = s.set_read_timeout(None);
                return Ok((r, Seal::new(key, Dir::ToHost), recv));
            }
            Ok(Some(ToAgent::Welcome)) => {
                return Err(fake(format!(
                    "it let this node in without proving it holds the job's {}",
                    cfg.auth.mode()
                )));
            }
            Ok(Some(ToAgent::Busy)) => {
                return Err(Turned::Again(BUSY.into()));
            }
            Ok(Some(ToAgent::Refused { why })) => {
                return Err(Turned::Away(ClusterError::Refused(why)));
            }
            Ok(Some(other)) => {
                let name = serde_json::to_value(&other)
                    .ok()
                    .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_string))
                    .unwrap_or_default();
                return Err(fake(format!(
                    "it said {name:?} before letting this node in"
                )));
            }
            Ok(None) => {
                return Err(Turned::Again(
                    "the rendezvous host closed the connection".into(),
                ));
            }
            Err(e) if proven && e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(fake(format!(
                    "its welcome is not sealed with this session's key ({e})"
                )));
            }
            Err(e) => return Err(Turned::Again(format!("the rendezvous host: {e}"))),
        }
    }
}

/// Every message from the host into the state, until the node is done or
/// the connection ends.
fn reader(link: Arc<Link>, mut r: BufReader<TcpStream>, mut seal: Seal, endpoint: String) {
    loop {
        let ev = match seal.recv(&mut r, proto::MAX_LINE) {
            Ok(Some(m)) => Event::Msg(m),
            Ok(None) => Event::Closed(format!(
                "the rendezvous host {endpoint} closed the connection"
            )),
            Err(e) => Event::Closed(format!("the connection to {endpoint} failed: {e}")),
        };
        let closed = matches!(ev, Event::Closed(_));
        link.apply(ev);
        if closed || link.state().done() {
            return;
        }
    }
}

/// A beat every `server::BEAT` until `quit` is dropped.
fn beater(link: Arc<Link>, quit: Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = quit.recv_timeout(server::BEAT) {
        link.send(&ToHost::Beat);
    }
}

pub(super) fn coordinator(cfg: &AgentConfig) -> Coordinator {
    Coordinator::new(
        cfg.nnodes,
        &cfg.run_id,
        cfg.max_restarts,
        cfg.master_port,
        cfg.join_timeout,
        cfg.heartbeat_timeout,
        Instant::now(),
    )
    .elastic(cfg.min_nodes, cfg.last_call)
}

/// How a round's ranks ended on this node: their exit code, and the node's
/// report when one was asked for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundEnd {
    pub code: i32,
    pub report: Option<Report>,
}

impl From<i32> for RoundEnd {
    fn from(code: i32) -> Self {
        RoundEnd { code, report: None }
    }
}

/// Join the job and run its rounds: `round` starts and supervises this
/// node's ranks for a `Start` and says how they ended.
pub(crate) fn run(
    cfg: &AgentConfig,
    round: impl FnMut(&Start, Arc<dyn Peer>) -> RoundEnd,
) -> Result<JobEnd, ClusterError> {
    let pipe = SignalPipe::get().map_err(|e| ClusterError::Io(e.to_string()))?;
    let addrs = cfg
        .endpoint
        .addrs()
        .map_err(|e| ClusterError::Resolve(cfg.endpoint.to_string(), e.to_string()))?;
    let hosted = match host_listener(&cfg.endpoint, &addrs) {
        Some(l) => Some(
            server::start(l, coordinator(cfg), cfg.auth.clone())
                .map_err(|e| ClusterError::Io(e.to_string()))?,
        ),
        None => None,
    };
    let result = join_and_run(cfg, &addrs, hosted.is_some(), pipe, round);
    if let Some(h) = hosted {
        // The other nodes hear the end from us: keep hosting while they stop
        // their ranks (their grace period), unless a second signal comes.
        if matches!(result, Ok(_) | Err(ClusterError::Signal(_))) {
            let t0 = Instant::now();
            while !h.is_finished() && t0.elapsed() < cfg.linger {
                if stop_signal(pipe, 20).is_some() {
                    break;
                }
            }
        }
        h.finish();
    }
    result
}

/// Connect, say hello, run the rounds; the reader and heartbeat threads are
/// joined before this returns.
fn join_and_run(
    cfg: &AgentConfig,
    addrs: &[SocketAddr],
    hosting: bool,
    pipe: &SignalPipe,
    mut round: impl FnMut(&Start, Arc<dyn Peer>) -> RoundEnd,
) -> Result<JobEnd, ClusterError> {
    let (stream, from_host, send, recv) = enter(addrs, cfg, hosting, pipe)?;
    let io = |e: std::io::Error| ClusterError::Io(e.to_string());
    let (todo, rx) = mpsc::channel();
    let link = Arc::new(Link {
        state: Mutex::new(AgentState::new(
            &cfg.host,
            &cfg.endpoint.to_string(),
            cfg.join_timeout,
            cfg.heartbeat_timeout,
            Instant::now(),
        )),
        writer: Mutex::new((stream.try_clone().map_err(io)?, send)),
        todo,
    });
    let read = {
        let (link, e) = (link.clone(), cfg.endpoint.to_string());
        std::thread::Builder::new()
            .name("rdzv-agent-read".into())
            .spawn(move || reader(link, from_host, recv, e))
            .map_err(io)?
    };
    let (quit, quit_rx) = mpsc::channel::<()>();
    let beat = {
        let link = link.clone();
        std::thread::Builder::new()
            .name("rdzv-agent-beat".into())
            .spawn(move || beater(link, quit_rx))
            .map_err(io)?
    };
    let result = rounds(&link, &rx, pipe, &mut round);
    drop(quit);
    let _ = stream.shutdown(Shutdown::Both);
    let _ = beat.join();
    let _ = read.join();
    result
}

/// What carries the agent's state to its rendezvous: a socket to a host
/// (`Link`), or the coordinator in this process (`local::Local`).
pub(super) trait Carrier: Peer + 'static {
    /// Apply an event and carry out its actions (starts and the end go to
    /// the main thread).
    fn apply(&self, ev: Event);
    fn send(&self, m: &ToHost);
}

impl Carrier for Link {
    fn apply(&self, ev: Event) {
        Link::apply(self, ev)
    }
    fn send(&self, m: &ToHost) {
        Link::send(self, m)
    }
}

/// Carry out what the state asks of the main thread: a round's ranks, or
/// the end; between rounds, watch the clock and the user's signals.
pub(super) fn rounds<L: Carrier>(
    link: &Arc<L>,
    rx: &Receiver<Action>,
    pipe: &SignalPipe,
    round: &mut impl FnMut(&Start, Arc<dyn Peer>) -> RoundEnd,
) -> Result<JobEnd, ClusterError> {
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Action::Start(s)) => {
                let RoundEnd { code, report } = round(&s, link.clone() as Arc<dyn Peer>);
                let port = crate::launch::env::free_port().unwrap_or(29500);
                link.apply(Event::RoundEnded { code, port, report });
            }
            Ok(Action::Finish(r)) => return r,
            Ok(Action::Send(m)) => link.send(&m),
            Err(RecvTimeoutError::Timeout) => {
                if let Some(sig) = stop_signal(pipe, 0) {
                    link.apply(Event::Signal(sig));
                }
                link.apply(Event::Tick);
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(ClusterError::Io("the agent's state went away".into()));
            }
        }
    }
}
