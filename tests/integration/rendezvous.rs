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
        // Closed with a reset, so the flood leaves no TIME_WAIT behind to
        // use up 127.0.0.2's ports.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
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

/// An agent whose rank runs until `flag` exists, then exits 6.
fn agent(port: u16, flag: &std::path::Path) -> Child {
    let rank = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 6",
        flag.display()
    );
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
            &rank,
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
    let port = super::free_port();
    let d = tempfile::tempdir().unwrap();
    let flag = d.path().join("enough");
    let mut n0 = agent(port, &flag);
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
    // 10,000 while the job forms and runs (its ranks wait for the flag), or
    // as many as this test opens in 40 s where the suite's other tests slow
    // it down (9,574 in 60 s was seen in CI), and on until the job is over
    // (node 0 has exited): then the job has 30 s to end.
    let mut flagged: Option<(Instant, usize)> = None;
    while flagged.is_none() || n0.try_wait().unwrap().is_none() {
        if flagged.is_none() && (opened >= 10_000 || flood.elapsed() > Duration::from_secs(40)) {
            std::fs::write(&flag, "").unwrap();
            flagged = Some((Instant::now(), opened));
        }
        if flagged.is_some_and(|(t, _)| t.elapsed() > Duration::from_secs(30)) {
            let _ = n0.kill();
            let _ = n0.wait();
            let err0 = std::io::read_to_string(n0.stderr.take().unwrap()).unwrap();
            let err1 = n1.as_mut().map(|c: &mut Child| {
                let _ = c.kill();
                let _ = c.wait();
                std::io::read_to_string(c.stderr.take().unwrap()).unwrap()
            });
            panic!(
                "the job never ended, 30 s after the flood's flag ({opened} opened):\n{err0}\n{err1:?}"
            );
        }
        if let Ok(s) = connect_from(Ipv4Addr::new(127, 0, 0, 2), dst) {
            open.push_back(s);
            opened += 1;
        }
        // At most 500 held open here at once (each silent), oldest dropped.
        if open.len() > 500 {
            open.pop_front();
        }
        // Node 1 joins in the middle of the flood.
        if n1.is_none() && (opened >= 2_000 || flood.elapsed() > Duration::from_secs(1)) {
            n1 = Some(agent(port, &flag));
        }
        if opened % 100 == 0
            && let Some((t, r)) = threads_and_rss(pid)
        {
            peak_threads = peak_threads.max(t);
            peak_rss = peak_rss.max(r);
        }
    }
    let flood_s = flood.elapsed().as_secs_f64();
    let at_flag = flagged.map_or(0, |(_, n)| n);
    assert!(
        at_flag >= 2_000,
        "only {at_flag} connections before the flag: no flood"
    );
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
