//! The rendezvous host's sockets: a thread in the agent whose node owns the
//! endpoint. It accepts the agents (its own included, over TCP like the
//! rest), reads each on its own thread, beats every second, and carries out
//! what `coord` decides.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::coord::{Conn, Coordinator, Out};
use super::proto::{self, PROTOCOL, ToAgent, ToHost};

enum Ev {
    Accepted(Conn, TcpStream, String),
    Msg(Conn, ToHost),
    Closed(Conn, String),
}

/// How often the host beats, and checks its nodes.
pub const BEAT: Duration = Duration::from_secs(1);

/// Start serving on `listener`; the thread ends once the job is over.
pub fn start(listener: TcpListener, coord: Coordinator) -> std::io::Result<JoinHandle<()>> {
    let (tx, rx) = mpsc::channel();
    let accept_tx = tx.clone();
    std::thread::Builder::new()
        .name("rdzv-accept".into())
        .spawn(move || accept_loop(listener, accept_tx))?;
    std::thread::Builder::new()
        .name("rdzv-host".into())
        .spawn(move || serve(coord, rx, tx))
}

fn accept_loop(listener: TcpListener, tx: Sender<Ev>) {
    let mut next: Conn = 0;
    for stream in listener.incoming() {
        let Ok(s) = stream else { continue };
        let addr = s
            .peer_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        let _ = s.set_nodelay(true);
        if tx.send(Ev::Accepted(next, s, addr)).is_err() {
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
    greeted: bool,
}

fn serve(mut coord: Coordinator, rx: Receiver<Ev>, tx: Sender<Ev>) {
    let mut peers: HashMap<Conn, Peer> = HashMap::new();
    let mut next_beat = Instant::now() + BEAT;
    while !coord.over() {
        let wait = next_beat.saturating_duration_since(Instant::now());
        let now_outs = match rx.recv_timeout(wait) {
            Ok(Ev::Accepted(conn, s, addr)) => {
                if let Ok(r) = s.try_clone() {
                    let tx = tx.clone();
                    let _ = std::thread::Builder::new()
                        .name("rdzv-read".into())
                        .spawn(move || read_loop(conn, r, tx));
                }
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                peers.insert(
                    conn,
                    Peer {
                        stream: s,
                        addr,
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
            Err(RecvTimeoutError::Timeout) => vec![],
            Err(RecvTimeoutError::Disconnected) => return,
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
                    p.addr.clone()
                }
                None => return vec![],
            };
            coord.join(conn, hello, &addr, now)
        }
        ToHost::Beat => vec![],
        ToHost::Failed(f) => coord.failed(conn, f),
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
