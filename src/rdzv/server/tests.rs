//! The door's places and MUNGE's rate, with made-up addresses.
use super::*;

fn door() -> Door {
    Door {
        auth: Auth::Open,
        run_id: "t".into(),
        waiting: Arc::default(),
        munge: Arc::default(),
    }
}

#[test]
fn munge_hellos_are_rate_limited_per_address() {
    let d = door();
    let t0 = Instant::now();
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let b: IpAddr = "2001:db8::1".parse().unwrap();
    let b2: IpAddr = "2001:db8::2".parse().unwrap();
    let burst = (0..20).filter(|_| d.munge_allowed(a, t0)).count();
    assert_eq!(burst, MUNGE_BURST as usize);
    // Another address has its own bucket; the same /64 shares one.
    assert!(d.munge_allowed(b, t0));
    let same64 = (0..20).filter(|_| d.munge_allowed(b2, t0)).count();
    assert_eq!(same64, MUNGE_BURST as usize - 1);
    // A second later, MUNGE_PER_SEC more.
    let later = t0 + Duration::from_secs(1);
    let refill = (0..20).filter(|_| d.munge_allowed(a, later)).count();
    assert_eq!(refill, MUNGE_PER_SEC as usize);
}

#[test]
fn a_full_door_closes_its_oldest_unticketed_connection_and_keeps_ticketed_ones() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    let d = door();
    let kept = std::cell::RefCell::new(vec![]);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let enter = |conn: Conn, from: &str| {
        let c = TcpStream::connect(at).unwrap();
        let (s, _) = l.accept().unwrap();
        let ok = d.enter(conn, ip(from), &s);
        kept.borrow_mut().push(c);
        ok
    };
    // A thread of the door that ends soon (as one does once its socket is shut).
    let ends = |conn: Conn, from: &'static str| {
        let d = d.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d.leave(conn, from.parse().unwrap());
        })
    };
    let closed = |c: &TcpStream| {
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        matches!(std::io::Read::read(&mut &*c, &mut [0u8; 1]), Ok(0) | Err(_))
    };
    for c in 0..MAX_WAITING_PER_ADDR {
        assert!(enter(c as Conn, "10.0.0.1"));
    }
    // Connection 0 showed the job's ticket: it keeps its place.
    d.ticketed(0);
    // The address is full: a newcomer from it takes the place of its
    // oldest without a ticket (1), at once, once that one's thread ended.
    let e = ends(1, "10.0.0.1");
    assert!(enter(100, "10.0.0.1"), "room made at once");
    e.join().unwrap();
    assert!(
        closed(&kept.borrow()[1]),
        "the oldest without a ticket was closed"
    );
    {
        let w = d.lock();
        assert!(w.conns.contains_key(&0), "the ticketed one stays");
        assert!(!w.conns.contains_key(&1) && w.conns.contains_key(&100));
    }
    // Where that thread never ends, no room is made (Busy after MAKE_ROOM).
    let t = Instant::now();
    assert!(!enter(101, "10.0.0.1"));
    assert!(t.elapsed() >= MAKE_ROOM);
    // Where every place of the address holds a ticket: Busy at once.
    let d2 = door();
    let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
    let at2 = l2.local_addr().unwrap();
    let mut keep = vec![];
    for c in 0..MAX_WAITING_PER_ADDR {
        keep.push(TcpStream::connect(at2).unwrap());
        let (s, _) = l2.accept().unwrap();
        assert!(d2.enter(c as Conn, ip("10.0.0.2"), &s));
        d2.ticketed(c as Conn);
    }
    keep.push(TcpStream::connect(at2).unwrap());
    let (s, _) = l2.accept().unwrap();
    let t = Instant::now();
    assert!(!d2.enter(500, ip("10.0.0.2"), &s));
    assert!(t.elapsed() < MAKE_ROOM);
    // The whole door, full: a newcomer from another address takes the
    // place of the oldest without a ticket of all.
    let d3 = door();
    let mut keep3 = vec![];
    for i in 0..MAX_WAITING {
        keep3.push(TcpStream::connect(at2).unwrap());
        let (s, _) = l2.accept().unwrap();
        assert!(d3.enter(i as Conn, ip(&format!("10.0.{}.{}", i / 8, i % 8)), &s));
    }
    d3.ticketed(0);
    let e = {
        let d3 = d3.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d3.leave(1, "10.0.0.1".parse().unwrap());
        })
    };
    keep3.push(TcpStream::connect(at2).unwrap());
    let (s, _) = l2.accept().unwrap();
    assert!(d3.enter(900, ip("10.9.9.9"), &s));
    e.join().unwrap();
    let w = d3.lock();
    assert_eq!(w.conns.len(), MAX_WAITING);
    assert!(w.conns.contains_key(&0) && !w.conns.contains_key(&1));
}
