//! The view from fixed snapshots: rates, CPUs run on, and each alert with one
//! snapshot that fires it and one that does not.

use super::*;
use crate::measure::proc::{Process, Thread};

fn thread(tid: i32, state: char, cpu: usize, ticks: u64, invol: u64) -> Thread {
    Thread {
        tid,
        name: if tid == 100 {
            "python".into()
        } else {
            "pt_gloo_runloop".into()
        },
        allowed: CpuSet::parse_list("0-3").unwrap(),
        state,
        cpu,
        utime: ticks,
        stime: 0,
        voluntary_cs: 0,
        involuntary_cs: invol,
    }
}

fn process(pid: i32, threads: Vec<Thread>, children: Vec<i32>) -> Process {
    Process {
        pid,
        comm: "python".into(),
        threads,
        rss_kib: 2048,
        affinity: CpuSet::parse_list("0-3").unwrap(),
        pages_per_node: None,
        children,
    }
}

fn target(cpus: &str) -> Target {
    Target {
        local_rank: 0,
        pid: 100,
        cpus: CpuSet::parse_list(cpus).unwrap(),
        worker_cpus: CpuSet::parse_list("2-3").unwrap(),
        mem_nodes: vec![0],
        gpu: None,
        roles: None,
        corrections: Default::default(),
    }
}

fn snap(at: f64, main: Option<Process>, children: Vec<Process>) -> Snapshot {
    Snapshot {
        at,
        cs_at: at,
        ranks: vec![RankSnap { main, children }],
        cpus: [
            (0, (at as u64 * 50, at as u64 * 100)),
            (1, (0, at as u64 * 100)),
        ]
        .into(),
    }
}

fn kinds(v: &View) -> Vec<AlertKind> {
    v.alerts.iter().map(|a| a.kind).collect()
}

#[test]
fn rates_and_cpus_run_on() {
    let t = [target("0-1")];
    let a = snap(
        1.0,
        Some(process(
            100,
            vec![thread(100, 'S', 0, 100, 0), thread(101, 'S', 1, 50, 0)],
            vec![],
        )),
        vec![],
    );
    let b = snap(
        2.0,
        Some(process(
            100,
            vec![thread(100, 'R', 0, 150, 0), thread(101, 'S', 1, 50, 0)],
            vec![],
        )),
        vec![],
    );
    let v = view(&t, &a, &b, 100.0);
    let r = &v.ranks[0];
    assert_eq!(r.cpu_user_pct, 50.0);
    assert_eq!(r.ran_on.to_string(), "0", "thread 101 did not run");
    assert_eq!(r.threads, 2);
    assert_eq!(r.runnable, 1);
    assert_eq!(v.cpu_busy_pct[&0], 50.0);
    assert!(v.alerts.is_empty(), "{:?}", v.alerts);
    // Each thread's role and CPUs: the whole rank's without --roles.
    let by: Vec<(i32, crate::roles::Role, String)> = r
        .by_thread
        .iter()
        .map(|x| (x.tid, x.role, x.role_cpus.to_string()))
        .collect();
    use crate::roles::Role;
    assert_eq!(
        by,
        [
            (100, Role::Main, "0-1".into()),
            (101, Role::Comm, "0-1".into())
        ]
    );
    // With a role layout and a correction of thread 101.
    let mut t = target("0-1");
    t.roles = Some(crate::roles::RoleCpus {
        service: CpuSet::parse_list("0").unwrap(),
        team: CpuSet::parse_list("1").unwrap(),
    });
    t.corrections.insert(101, 2);
    let v = view(&[t], &a, &b, 100.0);
    let th = &v.ranks[0].by_thread;
    assert_eq!(th[1].role_cpus.to_string(), "0", "comm serves with main");
    assert_eq!((th[0].corrections, th[1].corrections), (0, 2));
    assert_eq!(th[1].name, "pt_gloo_runloop");
}

#[test]
fn each_alert_fires_and_keeps_quiet() {
    let t = [target("0-1")];
    let base = |threads: Vec<Thread>| Some(process(100, threads, vec![]));
    let a = snap(
        1.0,
        base(vec![
            thread(100, 'S', 0, 0, 0),
            thread(101, 'S', 1, 0, 0),
            thread(102, 'S', 1, 0, 0),
        ]),
        vec![],
    );
    // Three runnable threads on two CPUs, one on CPU 3, 5000 preemptions.
    let b = snap(
        2.0,
        base(vec![
            thread(100, 'R', 0, 10, 0),
            thread(101, 'R', 1, 10, 2500),
            thread(102, 'R', 3, 10, 2500),
        ]),
        vec![],
    );
    let k = kinds(&view(&t, &a, &b, 100.0));
    for want in [
        AlertKind::Oversubscribed,
        AlertKind::OffPlan,
        AlertKind::Preempted,
    ] {
        assert!(k.contains(&want), "{want:?} in {k:?}");
    }
    // A worker child that ran outside its worker CPUs.
    let child = |cpu| process(200, vec![thread(200, 'S', cpu, 5, 0)], vec![]);
    let a = snap(
        1.0,
        Some(process(100, vec![thread(100, 'S', 0, 0, 0)], vec![200])),
        vec![process(200, vec![thread(200, 'S', 2, 0, 0)], vec![])],
    );
    let off = snap(
        2.0,
        Some(process(100, vec![thread(100, 'S', 0, 0, 0)], vec![200])),
        vec![child(5)],
    );
    let ok = snap(
        2.0,
        Some(process(100, vec![thread(100, 'S', 0, 0, 0)], vec![200])),
        vec![child(3)],
    );
    assert_eq!(kinds(&view(&t, &a, &off, 100.0)), [AlertKind::OffPlan]);
    assert!(kinds(&view(&t, &a, &ok, 100.0)).is_empty());
    let v = view(&t, &a, &ok, 100.0);
    assert_eq!(v.ranks[0].workers[0].ran_on.to_string(), "3");
    // Remote memory: 60% of the pages on node 1.
    let mut m = process(100, vec![thread(100, 'S', 0, 0, 0)], vec![]);
    m.pages_per_node = Some([(0, 40), (1, 60)].into());
    let far = snap(2.0, Some(m.clone()), vec![]);
    assert_eq!(kinds(&view(&t, &a, &far, 100.0)), [AlertKind::RemoteMemory]);
    m.pages_per_node = Some([(0, 95), (1, 5)].into());
    let near = snap(2.0, Some(m), vec![]);
    let v = view(&t, &a, &near, 100.0);
    assert!(v.alerts.is_empty());
    assert_eq!(v.ranks[0].local_pages_pct, Some(95.0));
    // The rank exited.
    let gone = snap(2.0, None, vec![]);
    let v = view(&t, &a, &gone, 100.0);
    assert_eq!(kinds(&v), [AlertKind::Exited]);
    assert!(!v.ranks[0].alive);
}

#[test]
fn the_terminal_view_draws_ranks_strip_and_alerts() {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    let topo = crate::topology::synthetic::parse("core:4").unwrap();
    let t = [target("0-1")];
    let a = snap(
        1.0,
        Some(process(100, vec![thread(100, 'S', 0, 0, 0)], vec![])),
        vec![],
    );
    let b = snap(
        2.0,
        Some(process(100, vec![thread(100, 'R', 3, 10, 0)], vec![])),
        vec![],
    );
    let v = view(&t, &a, &b, 100.0);
    let mut term = Terminal::new(TestBackend::new(110, 16)).unwrap();
    term.draw(|f| ui::draw(f, &topo, &t, &v)).unwrap();
    let screen: String = term
        .backend()
        .buffer()
        .content()
        .chunks(110)
        .map(|row| row.iter().map(|c| c.symbol()).collect::<String>() + "\n")
        .collect();
    assert!(screen.contains("threadwise top: 1 rank(s)"), "{screen}");
    assert!(screen.contains("node 0   AA.."), "{screen}");
    assert!(screen.contains("off-plan"), "{screen}");
}
