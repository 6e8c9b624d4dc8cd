//! `--roles`: a rank's service threads on a core of their own, its team on
//! the rest (the split itself is `crate::roles::layout`; this says why).

use super::{PlanRequest, RankPlan};
use crate::topology::Topology;

/// Give `rank` its role layout when asked and it has the cores, with the
/// reason either way.
pub(super) fn place_roles(topo: &Topology, req: &PlanRequest, rank: &mut RankPlan) {
    if !req.roles {
        return;
    }
    if !rank.bind {
        rank.reasons.push(
            "roles: not placed: the rank is not bound (policy none), so its threads have no \
             CPUs of their own to divide"
                .into(),
        );
        return;
    }
    match crate::roles::layout(topo, &rank.cpus) {
        Ok(l) => {
            rank.reasons.push(format!(
                "roles: the main thread, pin-memory and communication threads on CPUs {} \
                 (a core of their own: they never wait behind the team); the intra-op team and \
                 every other thread on {}; {} compute thread(s) as before: the main thread \
                 computes its share on its own core, the team's other {} on theirs, so a \
                 spinning team delays no service thread",
                l.service,
                l.team,
                rank.threads,
                rank.threads.saturating_sub(1)
            ));
            rank.roles = Some(l);
        }
        Err(why) => rank
            .reasons
            .push(format!("roles: kept the whole-rank layout: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Facts, NProc, plan};
    use super::*;
    use crate::topology::synthetic;

    #[test]
    fn roles_are_placed_where_a_rank_has_the_cores_and_said_where_not() {
        let t = synthetic::parse("core:8").unwrap();
        let req = PlanRequest {
            nproc: NProc::Count(2),
            roles: true,
            ..Default::default()
        };
        let p = plan(&t, &req, &Facts::default()).unwrap();
        for r in &p.ranks {
            let l = r.roles.as_ref().unwrap();
            assert_eq!(l.service.len(), 1);
            assert_eq!(l.team.len(), 3);
            assert_eq!(l.service.union(&l.team), r.cpus);
            assert_eq!(r.env["THREADWISE_SERVICE_CPUS"], l.service.to_string());
            assert_eq!(r.env["THREADWISE_TEAM_CPUS"], l.team.to_string());
            assert!(
                r.reasons
                    .iter()
                    .any(|x| x.starts_with("roles: the main thread"))
            );
        }
        // Eight ranks of one core: too few, said, today's layout kept.
        let req = PlanRequest {
            nproc: NProc::Count(8),
            roles: true,
            ..Default::default()
        };
        let p = plan(&t, &req, &Facts::default()).unwrap();
        assert!(p.ranks.iter().all(|r| r.roles.is_none()));
        assert!(
            p.ranks[0]
                .reasons
                .iter()
                .any(|x| x.contains("kept the whole-rank layout"))
        );
        assert!(!p.ranks[0].env.contains_key("THREADWISE_SERVICE_CPUS"));
        // Not asked: nothing.
        let p = plan(&t, &PlanRequest::default(), &Facts::default()).unwrap();
        assert!(p.ranks.iter().all(|r| r.roles.is_none()));
    }
}
