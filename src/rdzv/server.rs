//! The rendezvous host's sockets: a thread in the agent whose node owns the
//! endpoint. It accepts the agents (its own included, over TCP like the
//! rest), lets each through the door (the whole handshake within
//! `HELLO_DEADLINE`, however slowly its bytes come; lines of at most
//! `proto::MAX_DOOR_LINE`; the job's run id, its authentication: `auth`) on
//! a thread of its own, then reads it there, every message sealed
//! (`proto::Seal`); beats every second, and carries out what `coord`
//! decides. Bounded by design: at most `MAX_WAITING` connections at the
//! door, `MAX_WAITING_PER_ADDR` from one address (an IPv6 /64 counts as one);
//! a newcomer past either bound takes the place of the oldest connection
//! still at the door (of its address, or of all), so nobody can hold the
//! door shut, and a node that has proved itself is never pushed out; MUNGE's
//! tools run for at most `MUNGE_BURST` hellos from one address at once,
//! `MUNGE_PER_SEC` a second after that, the rest told Busy. Past the door,
//! one connection per node (the coordinator refuses more).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Side};
use super::coord::{Conn, Coordinator, Out};
use super::proto::{self, Dir, Hello, PROTOCOL, Seal, ToAgent, ToHost};

enum Ev {
    /// A connection through the door: its stream and seal (for writing), its
    /// hello, the peer's address and ours as the peer reached it.
    Joined(Conn, TcpStream, Seal, Hello, String, String),
    Msg(Conn, ToHost),
    Closed(Conn, String),
    /// A peer turned away at the door: its address and why.
    Refused(String, String),
    /// End serving now, the job over or not.
    Shutdown,
}

/// How long a connection may take to say hello and, where the job asks it,
/// prove itself: the whole handshake, not each read.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Connections still at the door at once, in all and from one address (an
/// IPv6 /64); a newcomer past either takes the oldest one's place.
pub(crate) const MAX_WAITING: usize = 64;
pub(crate) const MAX_WAITING_PER_ADDR: usize = 16;

/// Hellos from one address that may run MUNGE's tools at once, and how
/// many a second after that.
pub(crate) const MUNGE_BURST: f64 = 8.0;
pub(crate) const MUNGE_PER_SEC: f64 = 4.0;

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
        munge: Arc::default(),
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
    waiting: Arc<(Mutex<Waiting>, Condvar)>,
    /// MUNGE's tools run per address: (tokens, when last filled).
    munge: Arc<Mutex<HashMap<IpAddr, (f64, Instant)>>>,
}

/// A connection's place at the door.
struct Place {
    /// Its address's group (`addr_group`).
    group: IpAddr,
    /// A handle to close it by, to make room.
    stream: TcpStream,
    /// Its hello carried the job's ticket (`auth::Auth::ticket`): it is
    /// never pushed out to make room.
    ticket: bool,
}

/// The connections at the door, oldest first; and the door's threads, by
/// address, those of connections closed to make room among them until they
/// have ended.
#[derive(Default)]
struct Waiting {
    conns: BTreeMap<Conn, Place>,
    threads: HashMap<IpAddr, usize>,
    all_threads: usize,
}

/// How long a newcomer waits for a thread it pushed out to end.
const MAKE_ROOM: Duration = Duration::from_millis(100);

impl Waiting {
    fn remove(&mut self, conn: Conn) -> Option<TcpStream> {
        self.conns.remove(&conn).map(|p| p.stream)
    }

    /// Connections of `group` at the door (at most `MAX_WAITING` to count).
    fn of(&self, group: IpAddr) -> usize {
        self.conns.values().filter(|p| p.group == group).count()
    }

    /// The oldest connection without a ticket, of `group` or of any.
    fn oldest_unticketed(&self, group: Option<IpAddr>) -> Option<Conn> {
        self.conns
            .iter()
            .find(|(_, p)| !p.ticket && group.is_none_or(|g| p.group == g))
            .map(|(c, _)| *c)
    }
}

/// What counts as one address at the door: an IPv6 address's /64 (one
/// host's, or one site's, share), an IPv4 address itself.
pub(super) fn addr_group(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

impl Door {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a place at the door for `conn` from `ip`. Where its address is
    /// full, its own oldest connection without a ticket is closed to make
    /// room, at once; where the door is full, the oldest without a ticket of
    /// all. So a flood's connections push out each other, and a node that
    /// shows the job's ticket in its hello (a cheap, stateless check: one
    /// HMAC) keeps its place whatever the flood, from any address, its own
    /// included. A thread pushed out is waited for (briefly), so the door
    /// never holds more threads than places. False (the newcomer is told
    /// Busy) where every place holds a ticket, or `s` cannot be kept.
    fn enter(&self, conn: Conn, ip: IpAddr, s: &TcpStream) -> bool {
        let group = addr_group(ip);
        let mut w = self.lock();
        let address_full = w.of(group) >= MAX_WAITING_PER_ADDR;
        let push_out = if address_full || w.conns.len() >= MAX_WAITING {
            let Some(oldest) = w.oldest_unticketed(address_full.then_some(group)) else {
                return false;
            };
            Some(oldest)
        } else {
            None
        };
        let Ok(handle) = s.try_clone() else {
            return false;
        };
        if let Some(old) = push_out.and_then(|c| w.remove(c)) {
            // Its thread's next read fails, and it leaves.
            let _ = old.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + MAKE_ROOM;
        while w.threads.get(&group).copied().unwrap_or(0) >= MAX_WAITING_PER_ADDR
            || w.all_threads >= MAX_WAITING
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            w = self
                .waiting
                .1
                .wait_timeout(w, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        w.conns.insert(
            conn,
            Place {
                group,
                stream: handle,
                ticket: false,
            },
        );
        *w.threads.entry(group).or_insert(0) += 1;
        w.all_threads += 1;
        true
    }

    /// `conn`'s hello carried the job's ticket: its place is kept.
    fn ticketed(&self, conn: Conn) {
        if let Some(p) = self.lock().conns.get_mut(&conn) {
            p.ticket = true;
        }
    }

    /// `conn`'s thread is past the door, or done: its place and its count.
    fn leave(&self, conn: Conn, ip: IpAddr) {
        let group = addr_group(ip);
        let mut w = self.lock();
        w.remove(conn);
        if let Some(n) = w.threads.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                w.threads.remove(&group);
            }
        }
        w.all_threads = w.all_threads.saturating_sub(1);
        self.waiting.1.notify_all();
    }

    /// May a hello from `ip` run MUNGE's tools now (a token bucket per address)?
    fn munge_allowed(&self, ip: IpAddr, now: Instant) -> bool {
        let mut m = self.munge.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() > 4096 {
            // Forget the full buckets of addresses long quiet.
            m.retain(|_, (t, at)| {
                *t + now.duration_since(*at).as_secs_f64() * MUNGE_PER_SEC < MUNGE_BURST
            });
        }
        let (tokens, at) = m.entry(addr_group(ip)).or_insert((MUNGE_BURST, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() * MUNGE_PER_SEC).min(MUNGE_BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
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
        let conn = next;
        next += 1;
        if !door.enter(conn, ip, &s) {
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
        let (tx2, door2) = (tx.clone(), door.clone());
        let spawned = std::thread::Builder::new()
            .name("rdzv-read".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let joined = admit(conn, s, ip, local, &door2, &tx2);
                door2.leave(conn, ip);
                if let Some((r, seal)) = joined {
                    read_loop(conn, r, seal, tx2);
                }
            });
        if spawned.is_err() {
            door.leave(conn, ip);
        }
    }
}

/// A stream whose reads end at a deadline for all of them together, not
/// for each: a peer that sends a byte at a time cannot stretch it.
pub(super) struct Timed {
    s: TcpStream,
    deadline: Option<Instant>,
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            self.s.set_read_timeout(Some(left))?;
        }
        self.s.read(buf)
    }
}

/// Why a peer did not come through the door.
enum Turn {
    /// Refused, with the reason it is told.
    Refused(String),
    /// Told Busy (MUNGE's rate): it may try again.
    Busy(String),
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
) -> Option<(BufReader<Timed>, Seal)> {
    let mut w = s.try_clone().ok()?;
    let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
    let mut r = BufReader::new(Timed {
        s,
        deadline: Some(Instant::now() + HELLO_DEADLINE),
    });
    match handshake(conn, &mut r, &mut w, door, ip) {
        Ok((hello, send, recv)) => {
            r.get_mut().deadline = None;
            let _ = r.get_ref().s.set_read_timeout(None);
            tx.send(Ev::Joined(conn, w, send, hello, ip.to_string(), local))
                .ok()?;
            Some((r, recv))
        }
        Err(turn) => {
            let why = match turn {
                Turn::Refused(why) => {
                    let _ = proto::send(&mut w, &ToAgent::Refused { why: why.clone() });
                    why
                }
                Turn::Busy(why) => {
                    let _ = proto::send(&mut w, &ToAgent::Busy);
                    why
                }
            };
            let _ = w.shutdown(Shutdown::Both);
            let _ = tx.send(Ev::Refused(ip.to_string(), why));
            None
        }
    }
}

/// One plain message before the handshake's deadline, or why there was none.
fn recv_by(r: &mut BufReader<Timed>, what: &str) -> Result<ToHost, String> {
    match Seal::plain(Dir::ToHost).recv::<ToHost>(r, proto::MAX_DOOR_LINE) {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(format!("closed before its {what}")),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err(format!("no {what} within {} s", HELLO_DEADLINE.as_secs()))
        }
        Err(e) => Err(format!("unreadable {what}: {e}")),
    }
}

/// The door's side of the handshake: the hello, the seals of both
/// directions (keyed where the job authenticates), or why not.
fn handshake(
    conn: Conn,
    r: &mut BufReader<Timed>,
    w: &mut TcpStream,
    door: &Door,
    ip: IpAddr,
) -> Result<(Hello, Seal, Seal), Turn> {
    let refused = Turn::Refused;
    let (protocol, hello) = match recv_by(r, "hello").map_err(refused)? {
        ToHost::Hello { protocol, hello } => (protocol, hello),
        _ => {
            return Err(refused(
                "a message before its hello: say hello first".into(),
            ));
        }
    };
    // A node that holds the job's secret shows it at once, at the cost of one
    // HMAC here: its place at the door is kept against a flood.
    if door
        .auth
        .ticket_ok(&hello.run_id, &hello.nonce, &hello.ticket, auth::unix_now())
    {
        door.ticketed(conn);
    }
    if protocol != PROTOCOL {
        return Err(refused(format!(
            "protocol {protocol:?} differs from {PROTOCOL:?} (every node needs the same threadwise)"
        )));
    }
    if hello.run_id != door.run_id {
        return Err(refused(format!(
            "run id {:?} differs from the job's {:?} (--rdzv-id)",
            hello.run_id, door.run_id
        )));
    }
    let mode = door.auth.mode();
    if hello.auth != mode {
        return Err(refused(format!(
            "this job's rendezvous authenticates with {mode}; the node offered {:?}{}",
            hello.auth,
            match mode {
                "secret" =>
                    " (give every node the same --rdzv-secret-file or THREADWISE_RDZV_SECRET)",
                "munge" => " (run every node inside the same Slurm job, where MUNGE answers)",
                _ => " (give no secret to any node, or the same to all)",
            }
        )));
    }
    let mut key = None;
    if !door.auth.is_open() {
        let ok =
            |n: &str| !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_hexdigit());
        if !ok(&hello.nonce) {
            return Err(refused("its hello carries no usable nonce".into()));
        }
        if matches!(door.auth, Auth::Munge(_)) && !door.munge_allowed(ip, Instant::now()) {
            return Err(Turn::Busy(format!(
                "more than {MUNGE_PER_SEC} MUNGE hellos a second from its address"
            )));
        }
        let nonce = auth::nonce().map_err(|e| refused(format!("the host has no nonce: {e}")))?;
        // The hello as this host read it, bound to the session: where a relay
        // changed what the node said, the node's proof fails here and the
        // host's fails there.
        let said = auth::hello_digest(&serde_json::to_vec(&hello).unwrap_or_default());
        let session = auth::Session {
            run_id: &door.run_id,
            agent_nonce: &hello.nonce,
            host_nonce: &nonce,
            hello: &said,
        };
        let proof = door
            .auth
            .prove(Side::Host, &session)
            .map_err(|e| refused(format!("the host cannot prove itself: {e}")))?;
        key = proof.key;
        proto::send(
            w,
            &ToAgent::Challenge {
                nonce: nonce.clone(),
                proof: proof.text,
            },
        )
        .map_err(|e| refused(e.to_string()))?;
        let ToHost::Proof { proof } = recv_by(r, "proof").map_err(refused)? else {
            return Err(refused("no proof after the challenge".into()));
        };
        let theirs = door
            .auth
            .check(Side::Agent, &session, &proof)
            .map_err(|e| refused(format!("authentication failed: {e}")))?;
        key = key.or(theirs);
    }
    let mut send = Seal::new(key.clone(), Dir::ToAgent);
    send.send(w, &ToAgent::Welcome)
        .map_err(|e| refused(e.to_string()))?;
    Ok((hello, send, Seal::new(key, Dir::ToHost)))
}

fn read_loop(conn: Conn, mut r: BufReader<Timed>, mut seal: Seal, tx: Sender<Ev>) {
    loop {
        match seal.recv::<ToHost>(&mut r, proto::MAX_LINE) {
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
    let mut peers: HashMap<Conn, (TcpStream, Seal)> = HashMap::new();
    let mut refused = 0usize;
    let mut next_beat = Instant::now() + BEAT;
    while !coord.over() {
        // The heartbeat's tick, or sooner where the coordinator asks (a
        // newcomer to admit).
        let wake = coord.wake_at().map_or(next_beat, |w| w.min(next_beat));
        let wait = wake.saturating_duration_since(Instant::now());
        let now_outs = match rx.recv_timeout(wait) {
            Ok(Ev::Joined(conn, stream, seal, hello, addr, local)) => {
                let now = Instant::now();
                if addr.parse::<IpAddr>().is_ok_and(|ip| !ip.is_loopback()) {
                    coord.reached_at(&local);
                }
                peers.insert(conn, (stream, seal));
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
        if coord.wake_at().is_some_and(|w| Instant::now() >= w) {
            let outs = coord.tick(Instant::now());
            deliver(&mut peers, outs);
        }
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
    for (p, _) in peers.values() {
        let _ = p.shutdown(Shutdown::Both);
    }
    coord
}

/// A message from a node that came through the door.
pub(super) fn on_message(coord: &mut Coordinator, conn: Conn, m: ToHost) -> Vec<Out> {
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

fn deliver(peers: &mut HashMap<Conn, (TcpStream, Seal)>, outs: Vec<Out>) {
    for o in outs {
        let Some((p, seal)) = peers.get_mut(&o.conn) else {
            continue;
        };
        // A node whose link is down fails here after the write timeout; the
        // heartbeat finds it lost.
        let _ = seal.send(p, &o.msg);
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

#[cfg(test)]
mod tests;
