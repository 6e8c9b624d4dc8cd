use proptest::prelude::*;

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
    assert_eq!(p.ranks[1].env["THREADWISE_CPUS"], "1");
}

#[test]
fn quota_caps_threads() {
    let t = synthetic::parse("core:8 quota:2").unwrap();
    let p = plan(&t, &req(2), &Facts::default()).unwrap();
    assert_eq!(p.ranks[0].cores, 4);
    assert_eq!(p.ranks[0].threads, 1, "2 CPUs of quota over 2 ranks");
    assert!(
        p.ranks[0]
            .reasons
            .iter()
            .any(|r| r.contains("the cgroup CPU quota of 2.00 CPUs over 2 rank(s) allows 1")),
        "{:?}",
        p.ranks[0].reasons
    );
}

/// Fewer CPUs than ranks with no quota: the reason names the allowed CPUs,
/// not a quota the machine does not have.
#[test]
fn a_cpuset_budget_is_not_called_a_quota() {
    let t = synthetic::parse("core:2").unwrap();
    let r = PlanRequest {
        oversubscribe: true,
        ..req(4)
    };
    let p = plan(&t, &r, &Facts::default()).unwrap();
    let said = p.ranks[0].reasons.join("\n");
    assert!(
        said.contains("the 2 allowed CPU(s) give each of 4 rank(s) 0.50 CPU"),
        "{said}"
    );
    assert!(!said.contains("quota"), "{said}");
}

#[test]
fn seed_profile_is_the_guides_formula() {
    // 16 CPUs, 2 ranks per node, 4 nodes: world 8 -> threads min(4, 16 // 8) = 2,
    // workers min(4, max(1, 16 // 8 - 1)) = 1.
    let t = synthetic::parse("core:16").unwrap();
    let r = PlanRequest {
        profile: Profile::Seed,
        nnodes: 4,
        ..req(2)
    };
    let p = plan(&t, &r, &Facts::default()).unwrap();
    assert_eq!((p.ranks[0].threads, p.ranks[0].workers), (2, 1));
    let amp = PlanRequest {
        amp: true,
        nnodes: 1,
        ..r
    };
    let p = plan(&t, &amp, &Facts::default()).unwrap();
    assert_eq!((p.ranks[0].threads, p.ranks[0].workers), (2, 4));
    // Under a cgroup it still counts every online CPU, and says so.
    let t = synthetic::parse("core:16 allowed:0-3").unwrap();
    let p = plan(
        &t,
        &PlanRequest {
            profile: Profile::Seed,
            ..req(2)
        },
        &Facts::default(),
    )
    .unwrap();
    assert_eq!(p.ranks[0].threads, 4);
    assert!(
        p.ranks[0]
            .reasons
            .iter()
            .any(|r| r.contains("os.cpu_count() = 16"))
    );
}

#[test]
fn allocator_choice() {
    let t = synthetic::parse("core:2").unwrap();
    let je = Allocator {
        kind: AllocatorKind::Jemalloc,
        path: "/x/libjemalloc.so.2".into(),
    };
    let facts = Facts {
        allocators: vec![je.clone()],
        ..Default::default()
    };
    let auto = PlanRequest {
        allocator: AllocatorChoice::Auto,
        ..req(1)
    };
    let p = plan(&t, &auto, &facts).unwrap();
    assert_eq!(p.ranks[0].env["LD_PRELOAD"], "/x/libjemalloc.so.2");
    let p = plan(&t, &auto, &Facts::default()).unwrap();
    assert!(!p.ranks[0].env.contains_key("LD_PRELOAD"));
    let tc = PlanRequest {
        allocator: AllocatorChoice::Tcmalloc,
        ..req(1)
    };
    assert!(matches!(
        plan(&t, &tc, &facts),
        Err(PlanError::AllocatorMissing { .. })
    ));
}

#[test]
fn gpu_list_sets_visible_devices_and_ordinals() {
    let t = synthetic::parse("package:2 core:4 gpu:4").unwrap();
    let r = PlanRequest {
        gpus: GpuSelect::List(vec![3, 1]),
        ..Default::default()
    };
    let p = plan(&t, &r, &Facts::default()).unwrap();
    assert_eq!(p.nproc, 2);
    assert_eq!(p.ranks[0].gpu.as_deref(), Some("0000:04:00.0"));
    assert_eq!(p.ranks[0].gpu_ordinal, Some(0));
    assert_eq!(p.ranks[0].env["CUDA_VISIBLE_DEVICES"], "3,1");
    assert_eq!(p.ranks[0].mem_nodes, vec![1]);
}

#[test]
fn gpu_on_a_cpuless_or_disallowed_node_goes_to_the_nearest() {
    // Node 1 is outside the allowed set: its GPU's rank goes to node 0.
    let t = synthetic::parse("package:2 core:4 gpu:2 allowed:0-3").unwrap();
    let p = plan(&t, &req(2), &Facts::default()).unwrap();
    assert_eq!(p.ranks[0].cpus.to_string(), "0-1");
    assert_eq!(p.ranks[1].cpus.to_string(), "2-3");
    assert!(
        p.ranks[1]
            .reasons
            .iter()
            .any(|r| r.contains("too few allowed CPUs"))
    );
}

#[test]
fn omp_bind_only_when_asked() {
    let t = synthetic::parse("core:2").unwrap();
    let p = plan(&t, &req(1), &Facts::default()).unwrap();
    assert!(
        !p.ranks[0]
            .env
            .keys()
            .any(|k| k.starts_with("KMP_") || k.starts_with("OMP_PROC"))
    );
    let p = plan(
        &t,
        &PlanRequest {
            omp_bind: true,
            ..req(1)
        },
        &Facts::default(),
    )
    .unwrap();
    assert_eq!(p.ranks[0].env["OMP_PROC_BIND"], "close");
}

#[test]
fn hybrid_cpus_share_each_kind_and_compute_on_performance_cores() {
    // 6 two-thread performance cores (0-11) and 8 efficiency cores (12-19).
    let mut t = synthetic::parse("core:14 numbering:compact").unwrap();
    t.cores = (0..14)
        .map(|i| crate::topology::Core {
            id: i,
            package: 0,
            cpus: if i < 6 {
                [2 * i, 2 * i + 1].into_iter().collect()
            } else {
                std::iter::once(i + 6).collect()
            },
            kind: Some(if i < 6 {
                crate::topology::CoreKind::Performance
            } else {
                crate::topology::CoreKind::Efficiency
            }),
            capacity: None,
        })
        .collect();
    t.online_cpus = CpuSet::first_n(20);
    t.numa_nodes[0].cpus = CpuSet::first_n(20);
    t.l3_groups.clear();
    t.apply_limits();
    let p = plan(&t, &req(2), &Facts::default()).unwrap();
    assert_eq!(p.ranks[0].cpus.to_string(), "0-5,12-15");
    assert_eq!(p.ranks[1].cpus.to_string(), "6-11,16-19");
    assert_eq!(p.ranks[0].threads, 3, "performance cores only");
    assert_eq!(p.ranks[0].workers, 4);
    assert_eq!(p.ranks[0].worker_cpus.to_string(), "12-15");
    let p = plan(&t, &req(8), &Facts::default()).unwrap();
    assert!(
        p.ranks[0]
            .reasons
            .iter()
            .any(|r| r.contains("efficiency cores only"))
    );
}

/// A random machine: description, GPU count.
fn machine() -> impl Strategy<Value = (String, usize)> {
    (
        1usize..=2,
        1usize..=4,
        1usize..=3,
        1usize..=6,
        1usize..=2,
        0usize..=8,
        any::<u64>(),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(pk, numa, l3, core, pu, gpus, seed, allowed_seed)| {
            let nodes = pk * numa;
            let mut d = format!("package:{pk} numa:{numa} l3:{l3} core:{core} pu:{pu}");
            if gpus > 0 {
                let list: Vec<String> = (0..gpus)
                    .map(|i| ((seed >> (i * 3)) as usize % nodes).to_string())
                    .collect();
                d.push_str(&format!(" gpu-nodes:{}", list.join(",")));
            }
            if let Some(s) = allowed_seed {
                let total = pk * numa * l3 * core * pu;
                let allowed: Vec<String> = (0..total)
                    .filter(|i| (s >> (i % 64)) & 1 == 1 || *i == 0)
                    .map(|i| i.to_string())
                    .collect();
                d.push_str(&format!(" allowed:{}", allowed.join(",")));
            }
            (d, gpus)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn exclusive_invariants((desc, gpus) in machine(), n in 1usize..=12, use_gpus in any::<bool>()) {
        let t = synthetic::parse(&desc).unwrap();
        let gsel = if use_gpus && gpus > 0 { GpuSelect::Auto } else { GpuSelect::None };
        let n = if gsel == GpuSelect::Auto { n.min(gpus) } else { n };
        let r = PlanRequest { gpus: gsel.clone(), ..req(n) };
        let cores: Vec<CpuSet> = t.cores.iter().map(|c| c.cpus.intersection(&t.allowed_cpus)).filter(|c| !c.is_empty()).collect();
        let p = match plan(&t, &r, &Facts::default()) {
            Ok(p) => p,
            Err(PlanError::TooFewCpus { .. }) => {
                prop_assert!(n > cores.len());
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("{desc}: {e}"))),
        };
        prop_assert_eq!(p.ranks.len(), n);
        for (i, a) in p.ranks.iter().enumerate() {
            prop_assert!(!a.cpus.is_empty());
            prop_assert!(a.cpus.is_subset(&t.allowed_cpus), "rank {} {} outside allowed {}", i, a.cpus, t.allowed_cpus);
            prop_assert!(a.threads >= 1 && a.threads <= a.cores, "threads {} cores {}", a.threads, a.cores);
            // SMT siblings stay with their core.
            for c in &cores {
                prop_assert!(!c.intersects(&a.cpus) || c.is_subset(&a.cpus));
            }
            for b in &p.ranks[i + 1..] {
                prop_assert!(!a.cpus.intersects(&b.cpus), "ranks overlap: {} {}", a.cpus, b.cpus);
            }
        }
        let sizes: Vec<usize> = p.ranks.iter().map(|r| r.cores).collect();
        let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        prop_assert!(hi - lo <= 1, "unbalanced: {:?}", sizes);
        if gsel == GpuSelect::Auto {
            // Every allowed core is in exactly one rank's set (its CPUs and
            // its worker CPUs together).
            for c in &cores {
                let owners = p.ranks.iter().filter(|r| c.is_subset(&r.cpus.union(&r.worker_cpus))).count();
                prop_assert_eq!(owners, 1, "core {} in {} ranks' sets ({})", c, owners, desc);
            }
            // Worker-only cores go to the nearest GPU ranks: same package
            // first, then NUMA distance.
            use super::place::{distance, package_of};
            let node_of = |cpu: usize| t.numa_nodes.iter().find(|x| x.cpus.contains(cpu)).map(|x| x.id);
            let home: Vec<Option<usize>> = (0..n).map(|i| t.gpus[i].numa_node).collect();
            for (i, rank) in p.ranks.iter().enumerate() {
                for cpu in rank.worker_cpus.difference(&rank.cpus).iter() {
                    let m = node_of(cpu);
                    let key = |r: usize| (package_of(&t, home[r]) != package_of(&t, m), distance(&t, home[r], m));
                    let best = (0..n).map(key).min().unwrap();
                    prop_assert_eq!(key(i), best, "rank {} got CPU {} of node {:?} ({})", i, cpu, m, desc);
                }
            }
            // On its GPU's node whenever that node has a core for each of its ranks.
            for (i, rank) in p.ranks.iter().enumerate() {
                let node = t.gpus[i].numa_node.unwrap();
                let on_node = t.gpus[..n].iter().filter(|g| g.numa_node == Some(node)).count();
                let node_cpus = &t.numa_nodes.iter().find(|x| x.id == node).unwrap().cpus;
                let free = cores.iter().filter(|c| c.is_subset(node_cpus)).count();
                if free >= on_node {
                    prop_assert!(rank.cpus.is_subset(node_cpus), "rank {} {} not on node {}", i, rank.cpus, node);
                }
            }
        }
    }

    #[test]
    fn every_policy_stays_inside_the_allowed_set((desc, _g) in machine(), n in 1usize..=6, pol in 0usize..6, quota in proptest::option::of(1u32..8)) {
        let desc = match quota { Some(q) => format!("{desc} quota:{q}"), None => desc };
        let t = synthetic::parse(&desc).unwrap();
        let policy = [Policy::Exclusive, Policy::Node, Policy::Socket, Policy::L3, Policy::Single, Policy::None][pol];
        let r = PlanRequest { policy, oversubscribe: true, ..req(n) };
        let p = plan(&t, &r, &Facts::default()).unwrap();
        let cap = ((t.cpu_budget / n as f64).floor() as usize).max(1);
        for rank in &p.ranks {
            prop_assert!(!rank.cpus.is_empty());
            prop_assert!(rank.cpus.is_subset(&t.allowed_cpus));
            prop_assert!(rank.threads >= 1 && rank.threads <= cap.max(1), "threads {} > budget cap {}", rank.threads, cap);
            prop_assert!(rank.worker_cpus.is_subset(&t.allowed_cpus));
            if !rank.bind {
                prop_assert!(rank.worker_cpus.is_subset(&rank.cpus));
            }
            prop_assert_eq!(&rank.env["OMP_NUM_THREADS"], &rank.threads.to_string());
        }
    }
}

#[test]
fn a_budget_below_one_cpu_per_rank_is_said() {
    let t = crate::topology::synthetic::parse("core:4 quota:0.5").unwrap();
    let p = plan(&t, &req(2), &Facts::default()).unwrap();
    assert!(
        p.ranks[0]
            .reasons
            .iter()
            .any(|r| r.contains("less than one")),
        "{:?}",
        p.ranks[0].reasons
    );
}

/// Plan files as a user may hand-edit them: any field replaced by any JSON
/// value. Reading and validating never panics, and a plan that passes holds
/// the invariants `run --plan` relies on.
mod plan_files {
    use proptest::prelude::*;

    use super::*;

    fn value() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            Just(serde_json::json!(1e300)),
            "[a-z=\n0-9,-]{0,12}".prop_map(serde_json::Value::from),
            Just(serde_json::json!([0, 1_000_000_000_000u64])),
            Just(serde_json::json!({"A=B": "x"})),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn mangled_plans_never_panic(field in 0usize..12, rank_field in any::<bool>(), v in value()) {
            let t = crate::topology::synthetic::parse("core:4").unwrap();
            let p = plan(&t, &req(2), &Facts::default()).unwrap();
            let mut j = serde_json::to_value(&p).unwrap();
            let target = if rank_field { &mut j["ranks"][0] } else { &mut j };
            let keys: Vec<String> = target.as_object().unwrap().keys().cloned().collect();
            let k = keys[field % keys.len()].clone();
            target[k.as_str()] = v;
            if let Ok(back) = serde_json::from_value::<Plan>(j)
                && back.validate().is_ok()
            {
                prop_assert_eq!(back.ranks.len(), back.nproc);
                prop_assert!(back.ranks.iter().enumerate().all(|(i, r)| r.local_rank == i));
                prop_assert!(back.ranks.iter().all(|r| r.mem_nodes.iter().all(|n| *n < crate::topology::MAX_NODES)));
            }
        }
    }
}

#[test]
fn reserve_keeps_cores_out_of_every_rank() {
    let dgx = crate::topology::synthetic::parse(
        "package:2 numa:4 l3:4 core:4 pu:2 gpu-nodes:3,3,1,1,7,7,5,5",
    )
    .unwrap();
    let r = PlanRequest {
        reserve: Reserve::PerNode(1),
        ..Default::default()
    };
    let p = plan(&dgx, &r, &Facts::default()).unwrap();
    // The first core of each of the 8 nodes, with its sibling: 16 CPUs.
    let kept = reserved(&dgx, &r.reserve);
    assert_eq!(kept.len(), 16, "{kept}");
    for rank in &p.ranks {
        assert!(
            !rank.cpus.intersects(&kept),
            "rank {} has {}",
            rank.local_rank,
            rank.cpus
        );
        assert!(!rank.worker_cpus.intersects(&kept));
    }
    assert!(
        p.reasons.iter().any(|x| x.contains("--reserve 1")),
        "{:?}",
        p.reasons
    );
    let small = crate::topology::synthetic::parse("core:4").unwrap();
    let list = PlanRequest {
        reserve: Reserve::Cpus(CpuSet::parse_list("0").unwrap()),
        ..req(1)
    };
    assert_eq!(
        plan(&small, &list, &Facts::default()).unwrap().ranks[0]
            .cpus
            .to_string(),
        "1-3"
    );
    let all = PlanRequest {
        reserve: Reserve::PerNode(4),
        ..req(1)
    };
    assert!(matches!(
        plan(&small, &all, &Facts::default()),
        Err(PlanError::ReservedAll { .. })
    ));
}

/// docs/plan.md's worker formula for CPU ranks, clamp(cores/4, 2, 4), and
/// its figures: 2 up to 11 cores, 3 for 12-15, 4 from 16.
#[test]
fn cpu_rank_workers_follow_the_documented_formula() {
    for (cores, want) in [
        (2, 2),
        (4, 2),
        (8, 2),
        (11, 2),
        (12, 3),
        (15, 3),
        (16, 4),
        (32, 4),
    ] {
        let t = synthetic::parse(&format!("core:{cores}")).unwrap();
        let p = plan(&t, &req(1), &Facts::default()).unwrap();
        assert_eq!(p.ranks[0].workers, want, "{cores} cores");
    }
}
