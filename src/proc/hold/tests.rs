//! The holder's rules (`decide`), case by case.
use super::*;

fn set_of(s: &str) -> CpuSet {
    CpuSet::parse_list(s).unwrap()
}

fn spec(roles: bool) -> HoldSpec {
    HoldSpec {
        cpus: set_of("4-7"),
        roles: roles.then(|| RoleCpus {
            service: set_of("4"),
            team: set_of("5-7"),
        }),
        runtime_binds: false,
    }
}

/// A thread first seen on `first`.
fn born(first: &str) -> Thread {
    Thread {
        first: set_of(first),
        ..Thread::default()
    }
}

#[test]
fn outside_the_rank_twice_is_put_back_on_the_roles_cpus() {
    let wide = set_of("0-15");
    let t = born("4-7");
    assert_eq!(
        decide(&spec(false), Hold::On, Role::Comm, &wide, &t),
        Step::Watch
    );
    let t = Thread { off: 1, ..t };
    assert_eq!(
        decide(&spec(false), Hold::On, Role::Comm, &wide, &t),
        Step::Correct(set_of("4-7"))
    );
    assert_eq!(
        decide(&spec(true), Hold::On, Role::Comm, &wide, &t),
        Step::Correct(set_of("4"))
    );
    assert_eq!(
        decide(&spec(true), Hold::On, Role::Unknown, &set_of("0"), &t),
        Step::Correct(set_of("5-7"))
    );
}

#[test]
fn a_thread_that_keeps_leaving_is_a_fight_said_once_and_bounded() {
    let wide = set_of("0-15");
    let s = spec(false);
    let t = |puts, fought| Thread {
        off: 1,
        puts,
        fought,
        ..born("4-7")
    };
    for p in 0..TRIES {
        assert_eq!(
            decide(&s, Hold::On, Role::Comm, &wide, &t(p, false)),
            Step::Correct(set_of("4-7"))
        );
    }
    // On: said once, then left where it went.
    assert_eq!(
        decide(&s, Hold::On, Role::Comm, &wide, &t(TRIES, false)),
        Step::Fight(None)
    );
    assert_eq!(
        decide(&s, Hold::On, Role::Comm, &wide, &t(TRIES, true)),
        Step::Leave
    );
    // Always: said once and put back, then put back without a word.
    assert_eq!(
        decide(&s, Hold::Always, Role::Comm, &wide, &t(TRIES, false)),
        Step::Fight(Some(set_of("4-7")))
    );
    assert_eq!(
        decide(&s, Hold::Always, Role::Comm, &wide, &t(TRIES + 5, true)),
        Step::Correct(set_of("4-7"))
    );
}

#[test]
fn hold_off_sees_a_departure_once() {
    let wide = set_of("0-15");
    let s = spec(false);
    let t = Thread {
        off: 1,
        ..born("4-7")
    };
    assert_eq!(decide(&s, Hold::Off, Role::Comm, &wide, &t), Step::Seen);
    let t = Thread { out: true, ..t };
    assert_eq!(decide(&s, Hold::Off, Role::Comm, &wide, &t), Step::Leave);
}

#[test]
fn inside_the_rank_only_inherited_masks_are_placed() {
    // Whole-rank layout: anything inside stays.
    for m in ["4-7", "5", "4,6"] {
        assert_eq!(
            decide(&spec(false), Hold::On, Role::Main, &set_of(m), &born(m)),
            Step::Leave
        );
    }
    let s = spec(true);
    // Born on the rank's whole set: placed by its role.
    assert_eq!(
        decide(&s, Hold::On, Role::Main, &set_of("4-7"), &born("4-7")),
        Step::Place(set_of("4"))
    );
    // Born on a set threadwise gave its creator: placed.
    let from_creator = |m: &str| Thread {
        could_inherit: true,
        ..born(m)
    };
    assert_eq!(
        decide(
            &s,
            Hold::On,
            Role::Unknown,
            &set_of("4"),
            &from_creator("4")
        ),
        Step::Place(set_of("5-7"))
    );
    assert_eq!(
        decide(
            &s,
            Hold::On,
            Role::Comm,
            &set_of("5-7"),
            &from_creator("5-7")
        ),
        Step::Place(set_of("4"))
    );
    assert_eq!(
        decide(&s, Hold::On, Role::Comm, &set_of("4"), &from_creator("4")),
        Step::Leave
    );
    // The same mask, but listed before threadwise gave it to anyone (a
    // thread's own pin to the service core): left.
    assert_eq!(
        decide(&s, Hold::On, Role::Unknown, &set_of("4"), &born("4")),
        Step::Leave
    );
    // Its own choice inside the rank (OMP_PROC_BIND's one core): left.
    assert_eq!(
        decide(&s, Hold::On, Role::Unknown, &set_of("6"), &born("6")),
        Step::Leave
    );
    // Changed since first seen, not by us: left.
    assert_eq!(
        decide(
            &s,
            Hold::On,
            Role::Unknown,
            &set_of("4"),
            &from_creator("4-7")
        ),
        Step::Leave
    );
    // An OpenMP runtime that binds its threads: a team thread born on
    // the service core is the runtime's choice.
    let binds = HoldSpec {
        runtime_binds: true,
        ..spec(true)
    };
    assert_eq!(
        decide(
            &binds,
            Hold::On,
            Role::Unknown,
            &set_of("4"),
            &from_creator("4")
        ),
        Step::Leave
    );
    assert_eq!(
        decide(&binds, Hold::On, Role::Main, &set_of("4-7"), &born("4-7")),
        Step::Place(set_of("4"))
    );
}

#[test]
fn a_placed_thread_is_placed_again_by_name_and_its_own_choice_is_said_once() {
    let s = spec(true);
    let placed = |set: &str| Thread {
        set: Some(set_of(set)),
        ..born("4-7")
    };
    // What we set, then its name told another role: placed again.
    assert_eq!(
        decide(&s, Hold::On, Role::Comm, &set_of("5-7"), &placed("5-7")),
        Step::Place(set_of("4"))
    );
    // It re-pinned itself to the rank's whole set: its choice, said once.
    assert_eq!(
        decide(&s, Hold::On, Role::Unknown, &set_of("4-7"), &placed("5-7")),
        Step::Chose
    );
    let said = Thread {
        chose: true,
        ..placed("5-7")
    };
    assert_eq!(
        decide(&s, Hold::On, Role::Unknown, &set_of("4-7"), &said),
        Step::Leave
    );
}

#[test]
fn the_binding_variables_are_read_as_openmp_reads_them() {
    let env = |k: &'static str, v: &'static str| move |q: &str| (q == k).then(|| v.to_string());
    assert!(runtime_binds(env("OMP_PROC_BIND", "close")));
    assert!(!runtime_binds(env("OMP_PROC_BIND", "false")));
    assert!(runtime_binds(env("OMP_PLACES", "{1},{0}")));
    assert!(runtime_binds(env(
        "KMP_AFFINITY",
        "granularity=fine,compact"
    )));
    assert!(!runtime_binds(env("KMP_AFFINITY", "disabled")));
    assert!(!runtime_binds(env("KMP_AFFINITY", "none")));
    assert!(!runtime_binds(|_: &str| None));
}
