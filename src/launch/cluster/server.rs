//! The rendezvous host's sockets: a thread in the agent whose node owns the
//! endpoint. It accepts the agents (its own included, over TCP like the
//! rest), reads each on its own thread, beats every second, and carries out
//! what `coord` decides.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::coord::{Conn, Coordinator, Out};
use super::proto::{self, PROTOCOL, ToAgent, ToHost};

enum Ev {
    /// A connection, the peer's address and ours as the peer reached it.
    Accepted(Conn, TcpStream, String, String),
    Msg(Conn, ToHost),
    Closed(Conn, String),
    /// End serving now, the job over or not.
    Shutdown,
}

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

/// Start serving on `listener`; the host thread ends once the job is over
/// (or `Hosted::finish`), and wakes the accepting thread to end it too.
pub(super) fn start(listener: TcpListener, coord: Coordinator) -> std::io::Result<Hosted> {
    let (tx, rx) = mpsc::channel();
    let wake = wake_addr(&listener)?;
    let accept_tx = tx.clone();
    let accept = std::thread::Builder::new()
        .name("rdzv-accept".into())
        .spawn(move || accept_loop(listener, accept_tx))?;
    let serve_tx = tx.clone();
    let host = std::thread::Builder::new()
        .name("rdzv-host".into())
        .spawn(move || {
            let coord = serve(coord, rx, serve_tx);
            // The receiver is gone: the accepting thread ends at its next connection.
            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
            coord
        })?;
    Ok(Hosted { tx, host, accept })
}

fn accept_loop(listener: TcpListener, tx: Sender<Ev>) {
    let mut next: Conn = 0;
    for stream in listener.incoming() {
        let Ok(s) = stream else { continue };
        let ip = |a: std::io::Result<SocketAddr>| {
            a.map(|a| a.ip().to_canonical().to_string())
                .unwrap_or_default()
        };
        let (addr, local) = (ip(s.peer_addr()), ip(s.local_addr()));
        let _ = s.set_nodelay(true);
        if tx.send(Ev::Accepted(next, s, addr, local)).is_err() {
            return; // the job is over
        }
        next += 1;
    }
}

fn read_loop(conn: Conn, s: TcpStream, tx: Sender<Ev>) {
    let mut r = BufReader::new(s);
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

struct Peer {
    stream: TcpStream,
    addr: String,
    /// This host's address as the peer reached it.
    local: String,
    greeted: bool,
}

fn serve(mut coord: Coordinator, rx: Receiver<Ev>, tx: Sender<Ev>) -> Coordinator {
    let mut peers: HashMap<Conn, Peer> = HashMap::new();
    let mut readers: Vec<JoinHandle<()>> = vec![];
    let mut next_beat = Instant::now() + BEAT;
    while !coord.over() {
        let wait = next_beat.saturating_duration_since(Instant::now());
        let now_outs = match rx.recv_timeout(wait) {
            Ok(Ev::Accepted(conn, s, addr, local)) => {
                if let Ok(r) = s.try_clone() {
                    let tx = tx.clone();
                    readers.extend(
                        std::thread::Builder::new()
                            .name("rdzv-read".into())
                            .spawn(move || read_loop(conn, r, tx)),
                    );
                }
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                peers.insert(
                    conn,
                    Peer {
                        stream: s,
                        addr,
                        local,
                        greeted: false,
                    },
                );
                vec![]
            }
            Ok(Ev::Msg(conn, m)) => on_message(&mut coord, &mut peers, conn, m),
            Ok(Ev::Closed(conn, why)) => {
                let known = peers.get(&conn).is_some_and(|p| p.greeted);
                peers.remove(&conn);
                if known {
                    coord.lost(conn, &why)
                } else {
                    vec![]
                }
            }
            Ok(Ev::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => vec![],
        };
        deliver(&mut peers, now_outs);
        if Instant::now() >= next_beat {
            next_beat = Instant::now() + BEAT;
            let live = coord.live();
            let beats = live
                .into_iter()
                .filter(|c| peers.get(c).is_some_and(|p| p.greeted))
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
    for p in peers.values() {
        let _ = p.stream.shutdown(Shutdown::Both);
    }
    // Every reader's stream is shut down (or its peer gone): each ends.
    drop(peers);
    for r in readers {
        let _ = r.join();
    }
    coord
}

fn on_message(
    coord: &mut Coordinator,
    peers: &mut HashMap<Conn, Peer>,
    conn: Conn,
    m: ToHost,
) -> Vec<Out> {
    let now = Instant::now();
    coord.seen(conn, now);
    match m {
        ToHost::Hello { protocol, hello } => {
            if protocol != PROTOCOL {
                return vec![Out {
                    conn,
                    msg: ToAgent::Refused {
                        why: format!(
                            "protocol {protocol:?} differs from {PROTOCOL:?} (every node needs the same threadwise)"
                        ),
                    },
                    close: true,
                }];
            }
            let addr = match peers.get_mut(&conn) {
                Some(p) => {
                    p.greeted = true;
                    let remote = p.addr.parse::<IpAddr>().is_ok_and(|ip| !ip.is_loopback());
                    if remote {
                        coord.reached_at(&p.local);
                    }
                    p.addr.clone()
                }
                None => return vec![],
            };
            coord.join(conn, hello, &addr, now)
        }
        ToHost::Beat => vec![],
        ToHost::Failed(f) => coord.failed(conn, f),
        ToHost::Report { round, report } => {
            coord.report(conn, round, report);
            vec![]
        }
        ToHost::Ended { round, code, port } => coord.ended(conn, round, code, port),
    }
}

fn deliver(peers: &mut HashMap<Conn, Peer>, outs: Vec<Out>) {
    for o in outs {
        let Some(p) = peers.get_mut(&o.conn) else {
            continue;
        };
        // A node whose link is down fails here after the write timeout; the
        // heartbeat finds it lost.
        let _ = proto::send(&mut p.stream, &o.msg);
        if o.close {
            let _ = p.stream.shutdown(Shutdown::Write);
        }
    }
}
