//! `decide` on made-up buses and evidence.

use super::gather::parse_information;
use super::*;

fn bus(n: usize, amd: bool) -> Vec<PciDevice> {
    (0..n)
        .map(|i| PciDevice {
            index: i,
            bus_id: format!("0000:{:02x}:00.0", i + 1),
            vendor: if amd { "0x1002" } else { "0x10de" }.into(),
            numa_node: Some(i / 2),
            ..Default::default()
        })
        .collect()
}

/// A driver table for `n` GPUs (minor i, UUID GPU-i...), nodes for `open`.
fn ev(n: usize, open: &[u32], denied: &[u32], env: &[(&str, &str)]) -> GpuEvidence {
    GpuEvidence {
        nvidia_driver: Some(
            (0..n)
                .map(|i| {
                    (
                        format!("0000:{:02x}:00.0", i + 1),
                        DriverGpu {
                            minor: Some(i as u32),
                            uuid: Some(format!("GPU-{i}aaa-{i}")),
                            model: None,
                        },
                    )
                })
                .collect(),
        ),
        dev_seen: true,
        nvidia_nodes: open
            .iter()
            .map(|m| (*m, NodeState::Present))
            .chain(
                denied
                    .iter()
                    .map(|m| (*m, NodeState::Denied("EPERM".into()))),
            )
            .collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        env_from: "test".into(),
        ..Default::default()
    }
}

fn ids(v: &[PciDevice]) -> Vec<usize> {
    v.iter().map(|g| g.index).collect()
}

#[test]
fn device_nodes_then_cuda_visible_devices_in_the_jobs_numbering() {
    let b = bus(8, false);
    let (g, a) = decide(&b, &ev(8, &[3, 5], &[0, 1, 2, 4, 6, 7], &[])).unwrap();
    assert_eq!(ids(&g), vec![3, 5]);
    assert_eq!(a.hidden.len(), 6);
    assert!(a.hidden[0].why.contains("devices cgroup"), "{:?}", a.hidden);
    assert_eq!(g[1].visible_as.as_deref(), Some("1"));
    // Indices count among the openable GPUs: 1 is GPU 5.
    let (g, _) = decide(&b, &ev(8, &[3, 5], &[], &[("CUDA_VISIBLE_DEVICES", "1")])).unwrap();
    assert_eq!(ids(&g), vec![5]);
    // CUDA stops at the first index it cannot use, and at junk.
    let (g, _) = decide(
        &b,
        &ev(8, &[3, 5], &[], &[("CUDA_VISIBLE_DEVICES", "1,2,0")]),
    )
    .unwrap();
    assert_eq!(ids(&g), vec![5]);
    let (g, _) = decide(
        &b,
        &ev(8, &[3, 5], &[], &[("CUDA_VISIBLE_DEVICES", "0,x,1")]),
    )
    .unwrap();
    assert_eq!(ids(&g), vec![3]);
    assert!(decide(&b, &ev(8, &[3, 5], &[], &[("CUDA_VISIBLE_DEVICES", "0,0")])).is_err());
    // The whole machine, nothing narrowed: no re-indexing to write.
    let all: Vec<u32> = (0..8).collect();
    let (g, a) = decide(&b, &ev(8, &all, &[], &[])).unwrap();
    assert_eq!((g.len(), a.hidden.len()), (8, 0));
    assert!(g.iter().all(|x| x.visible_as.is_none()));
    // Empty: no GPU, as CUDA.
    let (g, _) = decide(&b, &ev(8, &all, &[], &[("CUDA_VISIBLE_DEVICES", "")])).unwrap();
    assert!(g.is_empty());
}

#[test]
fn uuids_by_prefix_in_their_order_and_unknown_ones() {
    let b = bus(4, false);
    let e = ev(
        4,
        &[0, 1, 2, 3],
        &[],
        &[("CUDA_VISIBLE_DEVICES", "GPU-2aaa,GPU-0")],
    );
    let (g, _) = decide(&b, &e).unwrap();
    assert_eq!(ids(&g), vec![2, 0]);
    assert_eq!(g[0].visible_as.as_deref(), Some("GPU-2aaa-2"));
    // A UUID no GPU has: CUDA stops there.
    let e = ev(
        4,
        &[0, 1, 2, 3],
        &[],
        &[("CUDA_VISIBLE_DEVICES", "GPU-1,GPU-9")],
    );
    assert_eq!(ids(&decide(&b, &e).unwrap().0), vec![1]);
    // Nothing to resolve UUIDs with: an error naming the variable.
    let mut e = ev(4, &[0, 1, 2, 3], &[], &[("CUDA_VISIBLE_DEVICES", "GPU-1")]);
    e.nvidia_driver = None;
    let err = decide(&b, &e).unwrap_err().to_string();
    assert!(
        err.contains("CUDA_VISIBLE_DEVICES") && err.contains("UUID"),
        "{err}"
    );
}

#[test]
fn nvml_narrows_and_names_mig_slices() {
    let b = bus(2, false);
    let mut e = ev(2, &[0, 1], &[], &[]);
    e.nvml = Some(Ok(vec![NvmlGpu {
        bus_id: "0000:02:00.0".into(),
        uuid: Some("GPU-x".into()),
        minor: Some(1),
        name: None,
        persistence: None,
        mig: vec!["MIG-a".into(), "MIG-b".into()],
    }]));
    let (g, a) = decide(&b, &e).unwrap();
    assert_eq!(a.hidden[0].why, "NVML does not list it");
    let slices: Vec<_> = g.iter().map(|x| x.mig.clone().unwrap()).collect();
    assert_eq!(slices, vec!["MIG-a", "MIG-b"]);
    e.env.insert("CUDA_VISIBLE_DEVICES".into(), "MIG-b".into());
    let (g, _) = decide(&b, &e).unwrap();
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].visible_as.as_deref(), Some("MIG-b"));
}

#[test]
fn slurm_and_container_variables_are_only_compared() {
    let b = bus(8, false);
    let e = ev(
        8,
        &[4, 5],
        &[],
        &[("SLURM_STEP_GPUS", "4,5"), ("CUDA_VISIBLE_DEVICES", "0,1")],
    );
    let (g, a) = decide(&b, &e).unwrap();
    assert_eq!(ids(&g), vec![4, 5]);
    assert!(
        a.evidence.iter().any(|l| l.contains("agrees")),
        "{:?}",
        a.evidence
    );
    // Slurm says 0,1 but the nodes say 4,5: the nodes win, the line says so.
    let e = ev(
        8,
        &[4, 5],
        &[],
        &[("SLURM_JOB_GPUS", "0,1"), ("NVIDIA_VISIBLE_DEVICES", "2")],
    );
    let (g, a) = decide(&b, &e).unwrap();
    assert_eq!(ids(&g), vec![4, 5]);
    assert_eq!(
        a.evidence
            .iter()
            .filter(|l| l.contains("not acted on"))
            .count(),
        2,
        "{:?}",
        a.evidence
    );
}

#[test]
fn amd_rocr_then_hip() {
    let b = bus(6, true);
    let mut e = GpuEvidence {
        amd_nodes: Some(
            b.iter()
                .filter(|g| g.index != 5)
                .map(|g| (g.bus_id.clone(), NodeState::Present))
                .collect(),
        ),
        ..Default::default()
    };
    let (g, a) = decide(&b, &e).unwrap();
    assert_eq!((g.len(), a.hidden.len()), (5, 1));
    e.env.insert("ROCR_VISIBLE_DEVICES".into(), "1,3,4".into());
    e.env.insert("HIP_VISIBLE_DEVICES".into(), "2".into());
    let (g, _) = decide(&b, &e).unwrap();
    assert_eq!(ids(&g), vec![4]);
    // Inside ROCR's three, it is the third: HIP calls it 2.
    assert_eq!(g[0].visible_as.as_deref(), Some("2"));
}

#[test]
fn information_file_fields() {
    let d = parse_information(
        "Model: \t\t Tesla V100\nGPU UUID: \t GPU-12ab\nBus Location: \t 0000:06:00.0\nDevice Minor: \t 3\n",
    );
    assert_eq!(d.minor, Some(3));
    assert_eq!(d.uuid.as_deref(), Some("GPU-12ab"));
    assert_eq!(d.model.as_deref(), Some("Tesla V100"));
}

// Each stage on its own, through the one `Decision` value.

#[test]
fn stage_1_device_nodes_hide_what_the_job_cannot_open_with_the_reason() {
    let b = bus(4, false);
    let e = ev(3, &[0, 2], &[1], &[]);
    let mut d = Decision::new(&b, &e);
    d.device_nodes();
    let (chosen, acc) = {
        d.number();
        d.every_nvidia_gpu();
        d.finish()
    };
    assert_eq!(ids(&chosen), vec![0, 2]);
    let why: Vec<(&str, &str)> = acc
        .hidden
        .iter()
        .map(|h| (h.bus_id.as_str(), h.why.as_str()))
        .collect();
    assert_eq!(why[0].0, "0000:02:00.0");
    assert!(
        why[0].1.contains("/dev/nvidia1 cannot be opened (EPERM)"),
        "{why:?}"
    );
    assert_eq!(why[1].0, "0000:04:00.0");
    assert!(why[1].1.contains("the driver does not list it"), "{why:?}");
    assert!(acc.evidence[1].starts_with("device nodes: 2 of 4 GPUs can be opened"));
}

#[test]
fn stage_1_without_a_driver_table_numbers_device_nodes_in_pci_order() {
    let b = bus(3, false);
    let mut e = ev(0, &[0, 2], &[], &[]);
    e.nvidia_driver = None;
    let mut d = Decision::new(&b, &e);
    d.device_nodes();
    d.number();
    d.every_nvidia_gpu();
    let (chosen, acc) = d.finish();
    assert_eq!(ids(&chosen), vec![0, 2]);
    assert_eq!(chosen[1].minor, Some(2));
    assert!(acc.evidence[0].contains("taken as the N-th NVIDIA GPU"));
}

#[test]
fn stage_2_nvml_keeps_only_what_it_lists_and_fills_uuids() {
    let b = bus(2, false);
    let mut e = ev(2, &[0, 1], &[], &[]);
    e.nvml = Some(Ok(vec![crate::nvml::NvmlGpu {
        bus_id: "0000:02:00.0".into(),
        uuid: Some("GPU-nvml".into()),
        minor: Some(1),
        name: None,
        persistence: None,
        mig: vec![],
    }]));
    let mut d = Decision::new(&b, &e);
    d.device_nodes();
    d.nvml_list();
    d.number();
    d.every_nvidia_gpu();
    let (chosen, acc) = d.finish();
    assert_eq!(ids(&chosen), vec![1]);
    assert_eq!(chosen[0].uuid.as_deref(), Some("GPU-nvml"));
    assert_eq!(acc.hidden[0].why, "NVML does not list it");
    assert!(
        acc.evidence
            .iter()
            .any(|l| l == "NVML lists 1 GPU(s); 1 of 2 left after it")
    );
}

#[test]
fn stage_3_cuda_stops_at_the_first_invalid_entry_and_rejects_a_repeat() {
    let b = bus(4, false);
    let e = ev(4, &[0, 1, 2, 3], &[], &[]);
    let run = |v: &str| {
        let mut d = Decision::new(&b, &e);
        d.device_nodes();
        d.number();
        d.cuda_visible_devices(v).map(|()| d.finish())
    };
    let (chosen, acc) = run("3,1,7,0").unwrap();
    assert_eq!(ids(&chosen), vec![3, 1]);
    assert!(
        acc.evidence
            .iter()
            .any(|l| l.contains("index 7, but the job can open 4 GPU(s); CUDA stops there"))
    );
    assert!(matches!(
        run("2,2"),
        Err(TopologyError::VisibleDevices { why, .. }) if why == "GPU 2 is listed twice"
    ));
    assert!(matches!(
        run("x y"),
        Err(TopologyError::VisibleDevices { .. })
    ));
    let (chosen, _) = run("").unwrap();
    assert!(chosen.is_empty());
}

#[test]
fn stage_4_compares_and_never_changes_the_choice() {
    let b = bus(2, false);
    let e = ev(
        2,
        &[0, 1],
        &[],
        &[("SLURM_STEP_GPUS", "5"), ("NVIDIA_VISIBLE_DEVICES", "void")],
    );
    let mut d = Decision::new(&b, &e);
    d.device_nodes();
    d.number();
    d.every_nvidia_gpu();
    d.slurm_gpus();
    d.nvidia_visible_devices();
    let (chosen, acc) = d.finish();
    assert_eq!(ids(&chosen), vec![0, 1]);
    let last: Vec<&String> = acc.evidence.iter().rev().take(2).collect();
    assert_eq!(
        last[0],
        "NVIDIA_VISIBLE_DEVICES=void: the container runtime gave no GPU"
    );
    assert!(
        last[1].starts_with(
            "SLURM_STEP_GPUS=5: differs from the device nodes the job can open (/dev/nvidia{0,1})"
        ),
        "{}",
        last[1]
    );
}
