//! The rendezvous host's sockets: a thread in the agent whose node owns the
//! endpoint. It accepts the agents (its own included, over TCP like the
//! rest), lets each through the door (a hello within `HELLO_DEADLINE`, the
//! job's run id, its authentication: `auth`) on a thread of its own, then
//! reads it there; beats every second, and carries out what `coord` decides.
//! Bounded by design: at most `MAX_WAITING` connections at the door
//! (`MAX_WAITING_PER_ADDR` from one address), the rest told Busy and closed
//! at once; past the door, one per node (the coordinator refuses more).

use std::collections::HashMap;
use std::io::{BufReader, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Side};
use super::coord::{Conn, Coordinator, Out};
use super::proto::{self, Hello, PROTOCOL, ToAgent, ToHost};

enum Ev {
    /// A connection through the door: its stream (for writing), its hello,
    /// the peer's address and ours as the peer reached it.
    Joined(Conn, TcpStream, Hello, String, String),
    Msg(Conn, ToHost),
    Closed(Conn, String),
    /// A peer turned away at the door: its address and why.
    Refused(String, String),
    /// End serving now, the job over or not.
    Shutdown,
}

/// How long a connection may take to say hello and, where the job asks it,
/// prove itself.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Connections still at the door at once, in all and from one address;
/// those beyond are told Busy and closed at once, with no thread or buffer.
pub(crate) const MAX_WAITING: usize = 64;
pub(crate) const MAX_WAITING_PER_ADDR: usize = 16;

/// A door (then reader) thread's stack: it holds a line reader and little else.
const READER_STACK: usize = 256 * 1024;

/// Refusals said one by one on stderr; past these, counted and said at the end.
const REFUSALS_SAID: usize = 20;

/// How often the host beats, and checks its nodes.
pub(super) const BEAT: Duration = Duration::from_secs(1);

/// A rendezvous being hosted: its threads, joined by `finish`.
pub(crate) struct Hosted {
    tx: Sender<Ev>,
    host: JoinHandle<Coordinator>,
    accept: JoinHandle<()>,
}

impl Hosted {
    /// The job is over and every node was told.
    pub(crate) fn is_finished(&self) -> bool {
        self.host.is_finished()
    }

    /// Stop serving (at once, if the job is not over yet), join every thread
    /// and give back what the coordinator knew.
    pub(crate) fn finish(self) -> Coordinator {
        let _ = self.tx.send(Ev::Shutdown);
        let coord = self
            .host
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        let _ = self.accept.join();
        coord
    }
}

/// Where to connect to wake the accepting thread (the listener's own
/// address, its loopback where it listens on every address).
fn wake_addr(listener: &TcpListener) -> std::io::Result<SocketAddr> {
    let mut a = listener.local_addr()?;
    if a.ip().is_unspecified() {
        a.set_ip(match a.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Ok(a)
}

/// Start serving on `listener`, letting in only peers that `auth` admits;
/// the host thread ends once the job is over (or `Hosted::finish`), and
/// wakes the accepting thread to end it too.
pub(super) fn start(
    listener: TcpListener,
    coord: Coordinator,
    auth: Auth,
) -> std::io::Result<Hosted> {
    let (tx, rx) = mpsc::channel();
    let wake = wake_addr(&listener)?;
    let accept_tx = tx.clone();
    let door = Door {
        auth,
        run_id: coord.run_id().to_string(),
        waiting: Arc::default(),
    };
    let over = Arc::new(AtomicBool::new(false));
    let over2 = over.clone();
    let accept = std::thread::Builder::new()
        .name("rdzv-accept".into())
        .spawn(move || accept_loop(listener, accept_tx, door, &over2))?;
    let host = std::thread::Builder::new()
        .name("rdzv-host".into())
        .spawn(move || {
            let coord = serve(coord, rx);
            over.store(true, Ordering::SeqCst);
            // The receiver is gone: the accepting thread ends at its next connection.
            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
            coord
        })?;
    Ok(Hosted { tx, host, accept })
}

/// Who may come in, and who is waiting at the door.
#[derive(Clone)]
struct Door {
    auth: Auth,
    run_id: String,
    /// Connections at the door, by the peer's address.
    waiting: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Door {
    /// Take a place at the door for `ip`, if there is one.
    fn enter(&self, ip: IpAddr) -> bool {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let all: usize = w.values().sum();
        let here = w.get(&ip).copied().unwrap_or(0);
        if all >= MAX_WAITING || here >= MAX_WAITING_PER_ADDR {
            return false;
        }
        *w.entry(ip).or_insert(0) += 1;
        true
    }

    fn leave(&self, ip: IpAddr) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = w.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                w.remove(&ip);
            }
        }
    }
}

fn accept_loop(listener: TcpListener, tx: Sender<Ev>, door: Door, over: &AtomicBool) {
    let mut next: Conn = 0;
    for stream in listener.incoming() {
        if over.load(Ordering::SeqCst) {
            return; // the job is over
        }
        let Ok(mut s) = stream else { continue };
        let Ok(peer) = s.peer_addr() else { continue };
        let ip = peer.ip().to_canonical();
        if !door.enter(ip) {
            // No thread, no buffer: a short line into an empty socket buffer,
            // then closed.
            let _ = s.set_nonblocking(true);
            let _ = proto::send(&mut s, &ToAgent::Busy);
            continue;
        }
        let local = s
            .local_addr()
            .map(|a| a.ip().to_canonical().to_string())
            .unwrap_or_default();
        let _ = s.set_nodelay(true);
        let (conn, tx2, door2) = (next, tx.clone(), door.clone());
        next += 1;
        let spawned = std::thread::Builder::new()
            .name("rdzv-read".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let joined = admit(conn, s, ip, local, &door2, &tx2);
                door2.leave(ip);
                if let Some(r) = joined {
                    read_loop(conn, r, tx2);
                }
            });
        if spawned.is_err() {
            door.leave(ip);
        }
    }
}

/// The door: a hello within the deadline, of our protocol and run, in the
/// job's mode of authentication, proven where it asks; then Welcome, and
/// the connection is the coordinator's. A refusal names its reason to the
/// peer and on the host's stderr, and changes nothing in the job.
fn admit(
    conn: Conn,
    s: TcpStream,
    ip: IpAddr,
    local: String,
    door: &Door,
    tx: &Sender<Ev>,
) -> Option<BufReader<TcpStream>> {
    let mut w = s.try_clone().ok()?;
    let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
    let mut r = BufReader::new(s);
    match handshake(&mut r, &mut w, door) {
        Ok(hello) => {
            let _ = r.get_ref().set_read_timeout(None);
            tx.send(Ev::Joined(conn, w, hello, ip.to_string(), local))
                .ok()?;
            Some(r)
        }
        Err(why) => {
            let _ = proto::send(&mut w, &ToAgent::Refused { why: why.clone() });
            let _ = w.shutdown(Shutdown::Both);
            let _ = tx.send(Ev::Refused(ip.to_string(), why));
            None
        }
    }
}

/// One message before `deadline`, or why there was none.
fn recv_by(r: &mut BufReader<TcpStream>, deadline: Instant, what: &str) -> Result<ToHost, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(format!("no {what} within {} s", HELLO_DEADLINE.as_secs()));
    }
    let _ = r.get_ref().set_read_timeout(Some(left));
    match proto::recv::<ToHost>(r) {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(format!("closed before its {what}")),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err(format!("no {what} within {} s", HELLO_DEADLINE.as_secs()))
        }
        Err(e) => Err(format!("unreadable {what}: {e}")),
    }
}

fn handshake(
    r: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    door: &Door,
) -> Result<Hello, String> {
    let deadline = Instant::now() + HELLO_DEADLINE;
    let (protocol, hello) = match recv_by(r, deadline, "hello")? {
        ToHost::Hello { protocol, hello } => (protocol, hello),
        _ => return Err("a message before its hello: say hello first".into()),
    };
    if protocol != PROTOCOL {
        return Err(format!(
            "protocol {protocol:?} differs from {PROTOCOL:?} (every node needs the same threadwise)"
        ));
    }
    if hello.run_id != door.run_id {
        return Err(format!(
            "run id {:?} differs from the job's {:?} (--rdzv-id)",
            hello.run_id, door.run_id
        ));
    }
    let mode = door.auth.mode();
    if hello.auth != mode {
        return Err(format!(
            "this job's rendezvous authenticates with {mode}; the node offered {:?}{}",
            hello.auth,
            match mode {
                "secret" =>
                    " (give every node the same --rdzv-secret-file or THREADWISE_RDZV_SECRET)",
                "munge" => " (run every node inside the same Slurm job, where MUNGE answers)",
                _ => " (give no secret to any node, or the same to all)",
            }
        ));
    }
    if !door.auth.is_open() {
        let ok =
            |n: &str| !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_hexdigit());
        if !ok(&hello.nonce) {
            return Err("its hello carries no usable nonce".into());
        }
        let nonce = auth::nonce();
        let proof = door
            .auth
            .prove(Side::Host, &door.run_id, &hello.nonce, &nonce)
            .map_err(|e| format!("the host cannot prove itself: {e}"))?;
        proto::send(
            w,
            &ToAgent::Challenge {
                nonce: nonce.clone(),
                proof,
            },
        )
        .map_err(|e| e.to_string())?;
        let ToHost::Proof { proof } = recv_by(r, deadline, "proof")? else {
            return Err("no proof after the challenge".into());
        };
        door.auth
            .check(Side::Agent, &door.run_id, &hello.nonce, &nonce, &proof)
            .map_err(|e| format!("authentication failed: {e}"))?;
    }
    proto::send(w, &ToAgent::Welcome).map_err(|e| e.to_string())?;
    Ok(hello)
}

fn read_loop(conn: Conn, mut r: BufReader<TcpStream>, tx: Sender<Ev>) {
    loop {
        match proto::recv::<ToHost>(&mut r) {
            Ok(Some(m)) => {
                if tx.send(Ev::Msg(conn, m)).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = tx.send(Ev::Closed(conn, "its agent's connection closed".into()));
                return;
            }
            Err(e) => {
                let _ = tx.send(Ev::Closed(conn, format!("its connection failed: {e}")));
                return;
            }
        }
    }
}

fn serve(mut coord: Coordinator, rx: Receiver<Ev>) -> Coordinator {
    let mut peers: HashMap<Conn, TcpStream> = HashMap::new();
    let mut refused = 0usize;
    let mut next_beat = Instant::now() + BEAT;
    while !coord.over() {
        let wait = next_beat.saturating_duration_since(Instant::now());
        let now_outs = match rx.recv_timeout(wait) {
            Ok(Ev::Joined(conn, stream, hello, addr, local)) => {
                let now = Instant::now();
                if addr.parse::<IpAddr>().is_ok_and(|ip| !ip.is_loopback()) {
                    coord.reached_at(&local);
                }
                peers.insert(conn, stream);
                coord.join(conn, hello, &addr, now)
            }
            Ok(Ev::Msg(conn, m)) => on_message(&mut coord, conn, m),
            Ok(Ev::Refused(addr, why)) => {
                refused += 1;
                if refused <= REFUSALS_SAID {
                    crate::say!("threadwise: rendezvous: refused a peer at {addr}: {why}");
                }
                vec![]
            }
            Ok(Ev::Closed(conn, why)) => {
                peers.remove(&conn);
                coord.lost(conn, &why)
            }
            Ok(Ev::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => vec![],
        };
        deliver(&mut peers, now_outs);
        if Instant::now() >= next_beat {
            next_beat = Instant::now() + BEAT;
            let beats = coord
                .live()
                .into_iter()
                .filter(|c| peers.contains_key(c))
                .map(|conn| Out {
                    conn,
                    msg: ToAgent::Beat,
                    close: false,
                })
                .collect();
            deliver(&mut peers, beats);
            let outs = coord.tick(Instant::now());
            deliver(&mut peers, outs);
        }
    }
    if refused > REFUSALS_SAID {
        crate::say!(
            "threadwise: rendezvous: refused {refused} peers in all ({} more than said above)",
            refused - REFUSALS_SAID
        );
    }
    // Every reader's stream is shut down (or its peer gone): each ends.
    for p in peers.values() {
        let _ = p.shutdown(Shutdown::Both);
    }
    coord
}

/// A message from a node that came through the door.
fn on_message(coord: &mut Coordinator, conn: Conn, m: ToHost) -> Vec<Out> {
    let now = Instant::now();
    coord.seen(conn, now);
    match m {
        // Said once, at the door.
        ToHost::Hello { .. } | ToHost::Proof { .. } | ToHost::Beat => vec![],
        ToHost::Failed(f) => coord.failed(conn, f),
        ToHost::Report { round, report } => {
            coord.report(conn, round, report);
            vec![]
        }
        ToHost::Ended { round, code, port } => coord.ended(conn, round, code, port),
    }
}

fn deliver(peers: &mut HashMap<Conn, TcpStream>, outs: Vec<Out>) {
    for o in outs {
        let Some(p) = peers.get_mut(&o.conn) else {
            continue;
        };
        // A node whose link is down fails here after the write timeout; the
        // heartbeat finds it lost.
        let _ = proto::send(p, &o.msg);
        if let ToAgent::Refused { .. } = o.msg {
            // A peer the coordinator turned away (in an open job, past the
            // door): closed both ways, so its reader thread ends now rather
            // than when the peer chooses to close.
            let _ = p.shutdown(Shutdown::Both);
            peers.remove(&o.conn);
        } else if o.close {
            let _ = p.shutdown(Shutdown::Write);
        }
    }
}
