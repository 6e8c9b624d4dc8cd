//! The rendezvous host under a flood, with the real binary on loopback: at
//! least 10,000 connections from another address (127.0.0.2), on while two
//! real agents form a job and run it. The job forms and ends with its ranks' code; node 0's
//! threads and memory stay within the bound the door sets (at most
//! `MAX_WAITING_PER_ADDR` = 16 connections of one address at the door, the
//! rest told Busy and closed with no thread).

use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::FromRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A TCP connection to `dst` from the source address `src`.
fn connect_from(src: Ipv4Addr, dst: SocketAddrV4) -> std::io::Result<TcpStream> {
    let addr = |a: SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor we own, with valid addresses.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let a = addr(SocketAddrV4::new(src, 0));
        if libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let d = addr(dst);
        if libc::connect(fd, (&d as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

fn agent(port: u16) -> Child {
    Command::new(assert_cmd::cargo::cargo_bin("threadwise"))
        .args(["run", "--nnodes", "2", "-n", "1", "--rdzv-endpoint"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--rdzv-id",
            "flood",
            "--grace",
            "2",
            "-q",
            "--",
            "sh",
            "-c",
            "sleep 2; exit 6",
        ])
        .env_remove("SLURM_JOB_ID")
        .env_remove("THREADWISE_RDZV_SECRET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// (threads, VmRSS KiB) of a process.
fn threads_and_rss(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    Some((get("Threads:")?, get("VmRSS:")?))
}

#[test]
fn a_flood_of_connections_neither_stops_the_job_nor_grows_node_0() {
    let port = crate_free_port();
    let mut n0 = agent(port);
    let pid = n0.id();
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    // Wait for the rendezvous to listen.
    let t0 = Instant::now();
    while TcpStream::connect(dst).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "node 0 never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut peak_threads, mut peak_rss) = (0, 0);
    let mut open: std::collections::VecDeque<TcpStream> = Default::default();
    let mut n1 = None;
    let mut opened = 0;
    let flood = Instant::now();
    // At least 10,000, and on until the job is over (node 0 has exited).
    while opened < 10_000 || n0.try_wait().unwrap().is_none() {
        assert!(
            flood.elapsed() < Duration::from_secs(60),
            "the job never ended"
        );
        if let Ok(s) = connect_from(Ipv4Addr::new(127, 0, 0, 2), dst) {
            open.push_back(s);
            opened += 1;
        }
        // At most 500 held open here at once (each silent), oldest dropped.
        if open.len() > 500 {
            open.pop_front();
        }
        if opened == 2_000 {
            n1 = Some(agent(port)); // node 1 joins in the middle of the flood
        }
        if opened % 100 == 0
            && let Some((t, r)) = threads_and_rss(pid)
        {
            peak_threads = peak_threads.max(t);
            peak_rss = peak_rss.max(r);
        }
    }
    let flood_s = flood.elapsed().as_secs_f64();
    drop(open);
    let mut n1 = n1.unwrap();
    let c1 = n1.wait().unwrap();
    let c0 = n0.wait().unwrap();
    let err0 = std::io::read_to_string(n0.stderr.take().unwrap()).unwrap();
    let err1 = std::io::read_to_string(n1.stderr.take().unwrap()).unwrap();
    // The job formed and ended with its ranks' own code on both nodes.
    assert_eq!((c0.code(), c1.code()), (Some(6), Some(6)), "{err0}\n{err1}");
    eprintln!(
        "flood: {opened} connections in {flood_s:.2} s (the job's whole life); node 0 peaked at {peak_threads} threads, {} MiB",
        peak_rss / 1024
    );
    // 16 door threads for the flooding address, one per node past the door,
    // and the agent's own (main, rendezvous host and accept, agent reader and
    // heartbeat, the supervisor's): well under 40.
    assert!(peak_threads <= 40, "node 0 grew to {peak_threads} threads");
    assert!(peak_rss < 48 * 1024, "node 0 grew to {peak_rss} KiB");
    assert!(err0.contains("refused a peer at 127.0.0.2"), "{err0}");
}

fn crate_free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
