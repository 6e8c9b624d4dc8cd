//! The race (session.rs with race.rs) on the fake runner: what stops when.

use super::{Strategy, fake, opts, tuned};

#[test]
fn the_race_stops_a_row_the_model_calls_slower() {
    let mut f = fake(&[
        ("unset", &[1.0]),
        ("plan", &[10.0, 10.1, 9.9, 10.0, 10.05, 9.95]),
        ("near", &[10.0, 9.9, 10.1, 10.0, 9.95, 10.05]),
        ("worse", &[7.9, 7.5, 7.7, 7.8, 7.6, 7.7]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "plan", "near", "worse"],
        &opts(6, 0, Strategy::Auto),
    );
    let calls = |n: &str| f.calls.iter().filter(|c| *c == n).count();
    let st = r.configs[3].stopped.clone().expect("worse stopped");
    assert_eq!(st.why, crate::tune::race::StopWhy::Slower, "{st:?}");
    assert!(st.after_round < 6, "{st:?}");
    assert_eq!(calls("worse"), st.after_round);
    assert_eq!(r.configs[3].dropped_after_round, Some(st.after_round - 1));
    assert_eq!(calls("unset"), 6, "the reference runs in every base round");
    assert!(r.complete);
    let notes = crate::tune::report::notes(&r);
    assert!(
        notes.contains(&format!(
            "worse: stopped after {} round(s): slower than",
            st.after_round
        )),
        "{notes}"
    );
}

#[test]
fn strategy_all_measures_every_row_in_every_base_round() {
    let mut f = fake(&[
        ("unset", &[1.0]),
        ("plan", &[10.0, 10.1, 9.9, 10.0]),
        ("worse", &[7.9, 7.5, 7.7, 7.8]),
    ]);
    let r = tuned(
        &mut f,
        &["unset", "plan", "worse"],
        &opts(4, 0, Strategy::All),
    );
    assert!(r.configs.iter().all(|c| c.trials.len() == 4), "{r:?}");
}
