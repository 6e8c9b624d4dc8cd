//! The rendezvous host's door over loopback, in this process, with no root:
//! real agents and real sockets against impostors speaking the protocol by
//! hand (a wrong secret, none, a replayed session, a message before hello,
//! garbage, silence) and against fake hosts. Each impostor is refused with
//! its reason; the real job forms and ends with its own ranks' code.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::auth::{self, Auth, Side};
use super::super::proto::{self, Hello, PROTOCOL, Start, ToAgent, ToHost};
use super::super::{AgentConfig, ClusterError, JobEnd, coord, run, server};
use crate::launch::supervise::Peer;

pub(super) const SECRET: &str = "the job's own secret, 32 bytes long";

pub(super) fn secret(s: &str) -> Auth {
    auth::secret_var(s).unwrap()
}

/// Two nodes of the run "door", authenticating with `a`.
pub(super) fn config(port: u16, host: &str, a: Auth) -> AgentConfig {
    AgentConfig {
        run_id: "door".into(),
        auth: a,
        ..super::config(port, 2, host, None)
    }
}

/// An agent in a thread whose ranks end with `code`.
pub(super) fn agent(
    cfg: AgentConfig,
    code: i32,
) -> std::thread::JoinHandle<Result<JobEnd, ClusterError>> {
    std::thread::spawn(move || run(&cfg, move |_: &Start, _: Arc<dyn Peer>| code.into()))
}

/// A hosted rendezvous of two nodes, run id "door", with `a`.
fn host(a: Auth) -> (u16, server::Hosted) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let c = coord::Coordinator::new(
        2,
        "door",
        0,
        None,
        Duration::from_secs(20),
        Duration::from_secs(5),
        Instant::now(),
    );
    (port, server::start(l, c, a).unwrap())
}

struct Raw {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let w = TcpStream::connect(("127.0.0.1", port)).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Raw {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
        }
    }

    fn say(&mut self, m: &ToHost) {
        proto::send(&mut self.w, m).unwrap();
    }

    fn hear(&mut self) -> Option<ToAgent> {
        proto::recv(&mut self.r).ok().flatten()
    }

    /// A message sealed under `key` (the first of the session's).
    fn hear_sealed(&mut self, key: Option<auth::Key>) -> Option<ToAgent> {
        proto::Seal::new(key, proto::Dir::ToAgent)
            .recv(&mut self.r, proto::MAX_LINE)
            .ok()
            .flatten()
    }

    /// Say hello; the digest of what was said, as the session binds it.
    fn hello(&mut self, mode: &str, nonce: &str) -> String {
        let hello = Hello {
            host: "impostor".into(),
            nproc: 1,
            nnodes: 2,
            min_nodes: 0,
            node_rank: Some(1),
            run_id: "door".into(),
            hosting: false,
            port: 1234,
            auth: mode.into(),
            nonce: nonce.into(),
            addr: None,
            ticket: String::new(),
        };
        let said = auth::hello_digest(&serde_json::to_vec(&hello).unwrap());
        self.say(&ToHost::Hello {
            protocol: PROTOCOL.into(),
            hello,
        });
        said
    }
}

/// The session of a handshake, for the tests' own proofs.
fn session<'a>(agent: &'a str, host: &'a str, hello: &'a str) -> auth::Session<'a> {
    auth::Session {
        run_id: "door",
        agent_nonce: agent,
        host_nonce: host,
        hello,
    }
}

fn refused(m: Option<ToAgent>) -> String {
    match m {
        Some(ToAgent::Refused { why }) => why,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_job_with_a_secret_forms_while_impostors_are_refused_with_reasons() {
    let port = crate::launch::env::free_port().unwrap();
    let a = agent(config(port, "a", secret(SECRET)), 0);
    std::thread::sleep(Duration::from_millis(300));
    // The impostor: node 1's place claimed by an open hello, then a failure.
    let mut open = Raw::connect(port);
    open.hello("none", "");
    let why = refused(open.hear());
    assert!(why.contains("authenticates with secret"), "{why}");
    // Its failure falls on a closed door (the write may fail; nothing acts on it).
    let _ = proto::send(
        &mut open.w,
        &ToHost::Failed(proto::Failure {
            round: 0,
            cause: "impostor says so".into(),
            code: 77,
            restartable: false,
        }),
    );
    // A message before hello, and garbage.
    let mut early = Raw::connect(port);
    early.say(&ToHost::Beat);
    assert!(refused(early.hear()).contains("say hello first"));
    let mut junk = Raw::connect(port);
    junk.w
        .write_all(b"\x00\xff GET / HTTP/1.1\r\n\r\n")
        .unwrap();
    assert!(refused(junk.hear()).contains("unreadable hello"));
    // Real agents with no secret and with a wrong one.
    let none = agent(config(port, "x", Auth::Open), 0).join().unwrap();
    assert!(
        matches!(&none, Err(ClusterError::Refused(w)) if w.contains("offered \"none\"")),
        "{none:?}"
    );
    let wrong = agent(config(port, "y", secret("not the job's secret at all")), 0)
        .join()
        .unwrap();
    assert!(
        matches!(&wrong, Err(ClusterError::NotGenuine(w)) if w.contains("proof fails")),
        "the host's proof fails first for a node with another secret: {wrong:?}"
    );
    // The real second node: the job forms and ends with its ranks' code.
    let b = agent(config(port, "b", secret(SECRET)), 5);
    let (ea, eb) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(ea.as_ref().map(|e| e.code).ok(), Some(5), "{ea:?}");
    assert_eq!(eb.as_ref().map(|e| e.code).ok(), Some(5), "{eb:?}");
    let cause = ea.unwrap().cause.unwrap_or_default();
    assert!(cause.contains("b: its ranks ended with code 5"), "{cause}");
}

#[test]
fn a_replayed_session_proves_nothing() {
    let (port, hosted) = host(secret(SECRET));
    let k = secret(SECRET);
    // A genuine node's session, as someone on the network records it.
    let mut genuine = Raw::connect(port);
    let nonce = auth::nonce().unwrap();
    let said = genuine.hello("secret", &nonce);
    let Some(ToAgent::Challenge { nonce: h1, proof }) = genuine.hear() else {
        panic!("no challenge")
    };
    let key = k.check(Side::Host, &session(&nonce, &h1, &said), &proof);
    assert!(key.is_ok(), "the host is genuine");
    let recorded = k
        .prove(Side::Agent, &session(&nonce, &h1, &said))
        .unwrap()
        .text;
    genuine.say(&ToHost::Proof {
        proof: recorded.clone(),
    });
    assert_eq!(genuine.hear_sealed(key.unwrap()), Some(ToAgent::Welcome));
    // The same hello and proof again: the host's nonce is new, the proof old.
    let mut replay = Raw::connect(port);
    replay.hello("secret", &nonce);
    let Some(ToAgent::Challenge { nonce: h2, .. }) = replay.hear() else {
        panic!("no challenge")
    };
    assert_ne!(h1, h2);
    replay.say(&ToHost::Proof { proof: recorded });
    let why = refused(replay.hear());
    assert!(why.contains("authentication failed"), "{why}");
    // A recorded host challenge does not fool an agent either: its nonce is new.
    assert!(
        k.check(
            Side::Host,
            &session(&auth::nonce().unwrap(), &h1, &said),
            &proof
        )
        .is_err()
    );
    hosted.finish();
}

#[test]
fn a_client_that_never_speaks_is_dropped_at_the_hello_deadline() {
    let (port, hosted) = host(Auth::Open);
    let t0 = Instant::now();
    let mut silent = Raw::connect(port);
    let why = refused(silent.hear());
    let waited = t0.elapsed();
    assert!(why.contains("no hello within 10 s"), "{why}");
    assert!(
        waited >= server::HELLO_DEADLINE - Duration::from_millis(100)
            && waited < server::HELLO_DEADLINE + Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(silent.hear(), None, "closed after the refusal");
    hosted.finish();
}

/// A fake host at the endpoint that answers every hello with `reply`.
fn fake_host(reply: ToAgent) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            let mut r = BufReader::new(s.try_clone().unwrap());
            let _ = proto::recv::<ToHost>(&mut r);
            let mut w = s;
            let _ = proto::send(&mut w, &reply);
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    port
}

#[test]
fn an_agent_finds_out_a_fake_host() {
    let other = secret("a secret the job does not have");
    for (reply, expect) in [
        (ToAgent::Welcome, "without proving"),
        (
            ToAgent::Challenge {
                nonce: "00".into(),
                proof: "not hex".into(),
            },
            "proof fails",
        ),
        (
            ToAgent::Challenge {
                nonce: "00".into(),
                proof: other
                    .prove(Side::Host, &session("ab", "00", ""))
                    .unwrap()
                    .text,
            },
            "proof fails",
        ),
        (
            ToAgent::Start(Start {
                round: 0,
                restarts: 0,
                node_rank: 0,
                nnodes: 2,
                rank_offset: 0,
                world_size: 2,
                master_addr: "10.6.6.6".into(),
                master_port: 1,
                max_restarts: 0,
                hosts: vec![],
            }),
            "said \"start\"",
        ),
    ] {
        let port = fake_host(reply);
        let out = agent(config(port, "a", secret(SECRET)), 0).join().unwrap();
        match out {
            Err(ClusterError::NotGenuine(w)) => assert!(w.contains(expect), "{w}"),
            other => panic!("a fake host was trusted ({expect}): {other:?}"),
        }
    }
}

/// A connection to `port` on loopback from the address `from` (any of
/// 127.0.0.0/8 is this machine's), as another host's would come.
fn connect_from(from: std::net::Ipv4Addr, port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, bound and connected with valid addresses,
    // then owned by the TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let local = sin(from, 0);
        assert_eq!(
            libc::bind(fd, &local as *const _ as *const libc::sockaddr, len),
            0
        );
        let peer = sin(std::net::Ipv4Addr::LOCALHOST, port);
        assert_eq!(
            libc::connect(fd, &peer as *const _ as *const libc::sockaddr, len),
            0
        );
        TcpStream::from_raw_fd(fd)
    }
}

/// The attack: 64 sockets from 4 addresses that are no node's, each
/// sending a byte every 2 s (once, the deadline restarted at every read, so
/// they held the door forever and the job never formed). Now the whole
/// hello has one deadline and a newcomer takes the oldest waiting place:
/// the job with a secret forms at once.
#[test]
fn slow_sockets_cannot_hold_the_door_shut() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let port = crate::launch::env::free_port().unwrap();
    let a = agent(config(port, "a", secret(SECRET)), 0);
    std::thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let mut slow = vec![];
    for i in 0..64u8 {
        let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + i % 4);
        let mut s = connect_from(from, port);
        let stop = stop.clone();
        slow.push(std::thread::spawn(move || {
            let hello = b"{\"msg\":\"hello\",\"protocol\":\"threadwise.rdzv/4\"";
            for b in hello.iter().cycle() {
                if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    return;
                }
                for _ in 0..20 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let b = agent(config(port, "b", secret(SECRET)), 0);
    let (ea, eb) = (a.join().unwrap(), b.join().unwrap());
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        let _ = t.join();
    }
    assert_eq!(ea.as_ref().map(|e| e.code).ok(), Some(0), "{ea:?}");
    assert_eq!(eb.as_ref().map(|e| e.code).ok(), Some(0), "{eb:?}");
    assert!(took < Duration::from_secs(15), "the job formed in {took:?}");
}

/// A client that dribbles a byte every 300 ms is dropped at the deadline
/// of its whole hello, not kept while each read succeeds.
#[test]
fn a_dribbling_client_is_dropped_at_the_deadline_of_its_whole_hello() {
    let (port, hosted) = host(Auth::Open);
    let t0 = Instant::now();
    let mut c = Raw::connect(port);
    let mut w = c.w.try_clone().unwrap();
    let dribble = std::thread::spawn(move || {
        for _ in 0..60 {
            if w.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let why = refused(c.hear());
    let waited = t0.elapsed();
    assert!(why.contains("no hello within 10 s"), "{why}");
    assert!(
        waited < server::HELLO_DEADLINE + Duration::from_secs(2),
        "{waited:?}"
    );
    let _ = dribble.join();
    hosted.finish();
}

#[test]
fn a_long_line_before_the_door_is_refused_at_8_kib() {
    let (port, hosted) = host(secret(SECRET));
    let mut c = Raw::connect(port);
    let mut line = vec![b'x'; proto::MAX_DOOR_LINE + 100];
    line.push(b'\n');
    let _ = c.w.write_all(&line);
    let why = refused(c.hear());
    assert!(why.contains("over 8 KiB"), "{why}");
    hosted.finish();
}

/// A machine in the middle relays the handshake untouched, then flips one
/// byte of what the host says next: the agent finds out and stops, and no
/// rank runs with what the middle changed.
#[test]
fn a_machine_in_the_middle_that_changes_a_byte_is_found_out() {
    use std::sync::Mutex;
    let port = crate::launch::env::free_port().unwrap();
    let a = agent(config(port, "a", secret(SECRET)), 0);
    std::thread::sleep(Duration::from_millis(300));
    // The proxy: agent b connects to it; it relays to the host, and flips a
    // byte of the first line after the host's welcome.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mid = l.local_addr().unwrap().port();
    let flipped = Arc::new(Mutex::new(String::new()));
    let seen = flipped.clone();
    std::thread::spawn(move || {
        let (down, _) = l.accept().unwrap();
        let up = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut d2, mut u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut d2, &mut u2);
        });
        let mut r = BufReader::new(up);
        let mut w = down;
        let mut welcomed = false;
        loop {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut r, &mut line).unwrap_or(0) == 0 {
                return;
            }
            if welcomed && seen.lock().unwrap().is_empty() && line.contains("\"start\"") {
                // MASTER_ADDR 127.0.0.1 becomes 127.0.0.7.
                *seen.lock().unwrap() = line.clone();
                line = line.replacen("127.0.0.1", "127.0.0.7", 1);
            }
            welcomed |= line.contains("\"welcome\"");
            if w.write_all(line.as_bytes()).is_err() {
                return;
            }
        }
    });
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran2 = ran.clone();
    let cfg = AgentConfig {
        endpoint: crate::netif::Endpoint::new("127.0.0.1", mid),
        ..config(port, "b", secret(SECRET))
    };
    let b = std::thread::spawn(move || {
        run(&cfg, move |_: &Start, _: Arc<dyn Peer>| {
            ran2.store(true, std::sync::atomic::Ordering::SeqCst);
            0.into()
        })
    });
    let eb = b.join().unwrap();
    let _ = a.join().unwrap();
    assert!(
        flipped.lock().unwrap().contains("\"start\""),
        "the middle saw and changed the start"
    );
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "no rank ran"
    );
    match eb {
        Err(e) => assert!(e.to_string().contains("failed its MAC check"), "{e}"),
        Ok(end) => panic!("the changed start was taken: {end:?}"),
    }
}

#[test]
fn ipv6_addresses_count_by_their_64() {
    let g = |s: &str| server::addr_group(s.parse().unwrap());
    assert_eq!(g("2001:db8:1:2:aaaa::1"), g("2001:db8:1:2:ffff::9"));
    assert_ne!(g("2001:db8:1:2::1"), g("2001:db8:1:3::1"));
    assert_eq!(g("::ffff:10.0.0.1"), g("10.0.0.1"));
    assert_ne!(g("10.0.0.1"), g("10.0.0.2"));
}
