//! The rendezvous host's door over loopback, in this process, with no root:
//! real agents and real sockets against impostors speaking the protocol by
//! hand (a wrong secret, none, a replayed session, a message before hello,
//! garbage, silence) and against fake hosts. Each impostor is refused with
//! its reason; the real job forms and ends with its own ranks' code.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::auth::{self, Auth, Side};
use super::proto::{self, Hello, PROTOCOL, Start, ToAgent, ToHost};
use super::{AgentConfig, ClusterError, JobEnd, coord, run, server};
use crate::launch::supervise::Peer;

const SECRET: &str = "the job's own secret, 32 bytes long";

fn secret(s: &str) -> Auth {
    auth::secret_var(s).unwrap()
}

/// Two nodes of the run "door", authenticating with `a`.
fn config(port: u16, host: &str, a: Auth) -> AgentConfig {
    AgentConfig {
        run_id: "door".into(),
        auth: a,
        ..super::tests::config(port, 2, host, None)
    }
}

/// An agent in a thread whose ranks end with `code`.
fn agent(cfg: AgentConfig, code: i32) -> std::thread::JoinHandle<Result<JobEnd, ClusterError>> {
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

    fn hello(&mut self, mode: &str, nonce: &str) {
        self.say(&ToHost::Hello {
            protocol: PROTOCOL.into(),
            hello: Hello {
                host: "impostor".into(),
                nproc: 1,
                nnodes: 2,
                node_rank: Some(1),
                run_id: "door".into(),
                hosting: false,
                port: 1234,
                auth: mode.into(),
                nonce: nonce.into(),
            },
        });
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
    let nonce = auth::nonce();
    genuine.hello("secret", &nonce);
    let Some(ToAgent::Challenge { nonce: h1, proof }) = genuine.hear() else {
        panic!("no challenge")
    };
    assert!(
        k.check(Side::Host, "door", &nonce, &h1, &proof).is_ok(),
        "the host is genuine"
    );
    let recorded = k.prove(Side::Agent, "door", &nonce, &h1).unwrap();
    genuine.say(&ToHost::Proof {
        proof: recorded.clone(),
    });
    assert_eq!(genuine.hear(), Some(ToAgent::Welcome));
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
        k.check(Side::Host, "door", &auth::nonce(), &h1, &proof)
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
                proof: other.prove(Side::Host, "door", "ab", "00").unwrap(),
            },
            "proof fails",
        ),
        (
            ToAgent::Start(Start {
                round: 0,
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
