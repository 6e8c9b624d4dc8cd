use super::*;
use crate::topology::synthetic;

fn req(n: usize) -> PlanRequest {
    PlanRequest {
        nproc: NProc::Count(n),
        ..Default::default()
    }
}

#[test]
fn two_cpu_ranks_on_two_cores() {
    let t = synthetic::parse("core:2").unwrap();
    let p = plan(&t, &req(2), &Facts::default()).unwrap();
    assert_eq!(p.ranks[0].cpus.to_string(), "0");
    assert_eq!(p.ranks[1].cpus.to_string(), "1");
    assert_eq!(p.ranks[0].threads, 1);
    assert_eq!(p.ranks[0].env["OMP_NUM_THREADS"], "1");
}
