//! Which GPUs this job may use, decided from evidence rather than from the
//! PCI bus alone: a container (`docker run --gpus 2`, a Kubernetes pod) or a
//! Slurm step with `ConstrainDevices=yes` shows every GPU of the server on the
//! bus but lets the job open only some.
//!
//! The evidence, in the order it is applied:
//! 1. the device nodes the process can open: `/dev/nvidia<minor>` (the minor
//!    maps to a bus id through `/proc/driver/nvidia/gpus/<bus id>/information`),
//!    `/dev/dri/renderD*` for AMD (`/sys/class/drm/renderD*/device`); a node
//!    that exists but cannot be opened (a devices cgroup) does not count;
//! 2. NVML, when consulted: it lists only what the process may use;
//! 3. `CUDA_VISIBLE_DEVICES` (indices into what is left, as CUDA numbers them,
//!    UUIDs `GPU-...` and `MIG-...`), `ROCR_VISIBLE_DEVICES` then
//!    `HIP_VISIBLE_DEVICES` on AMD;
//! 4. Slurm's `SLURM_STEP_GPUS`/`SLURM_JOB_GPUS` and `NVIDIA_VISIBLE_DEVICES`,
//!    compared with the result and reported, never acted on.
//!
//! `gather` reads (the OS edge); `decide` is pure.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{PciDevice, TopologyError, fsread};
use crate::nvml::NvmlGpu;

/// How the job's GPUs were told from the machine's, for `topo` and `plan`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuAccess {
    /// GPUs on the PCI bus: the whole machine.
    pub on_bus: usize,
    /// GPUs (or MIG slices) this job may use: `gpus` of the topology.
    pub usable: usize,
    /// What was read and what it decided, in order.
    pub evidence: Vec<String>,
    /// GPUs on the bus this job cannot use, and why.
    pub hidden: Vec<HiddenGpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HiddenGpu {
    pub bus_id: String,
    pub numa_node: Option<usize>,
    pub why: String,
}

/// A device node, as far as the job can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// Opened (a live device node the job may use).
    Opened,
    /// A file in a dump, or a node whose driver did not answer (no driver):
    /// it exists and nothing forbids it.
    Present,
    /// It exists but the job may not open it (a devices cgroup: EPERM).
    Denied(String),
}

/// One GPU in `/proc/driver/nvidia/gpus/<bus id>/information`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DriverGpu {
    pub minor: Option<u32>,
    pub uuid: Option<String>,
    pub model: Option<String>,
}

/// Everything `decide` looks at.
#[derive(Debug, Clone, Default)]
pub struct GpuEvidence {
    /// `/proc/driver/nvidia/gpus`, by bus id; None when there is no such
    /// directory (no NVIDIA driver, or a dump without it).
    pub nvidia_driver: Option<BTreeMap<String, DriverGpu>>,
    /// Whether a `dev/` directory was there to look at.
    pub dev_seen: bool,
    /// `/dev/nvidia<minor>` nodes.
    pub nvidia_nodes: BTreeMap<u32, NodeState>,
    /// AMD render nodes by the bus id their sysfs link names; None when
    /// there is no `/sys/class/drm`.
    pub amd_nodes: Option<BTreeMap<String, NodeState>>,
    /// GPU minors whose driver capabilities show MIG GPU instances.
    pub mig_minors: Vec<u32>,
    /// NVML's list, or why it did not load; None when not consulted.
    pub nvml: Option<Result<Vec<NvmlGpu>, String>>,
    /// The job's environment (the variables below only).
    pub env: BTreeMap<String, String>,
    /// Where the environment came from, for the evidence lines.
    pub env_from: String,
}

/// The variables that bear on which GPUs a job has.
pub const ENV_VARS: [&str; 7] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
];

/// When to load NVML while gathering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlUse {
    /// `topo`: always (it is the command that shows everything).
    Always,
    /// Planning: only when the files cannot answer (UUIDs to resolve, MIG,
    /// device nodes with no driver table): NVML's start-up costs up to seconds
    /// when persistence mode is off, once per `bind`.
    IfNeeded,
    Never,
}

/// The `information` file's `Key:  value` lines.
pub fn parse_information(text: &str) -> DriverGpu {
    let mut d = DriverGpu::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "Device Minor" => d.minor = v.parse().ok(),
            "GPU UUID" if v.starts_with("GPU-") => d.uuid = Some(v.to_string()),
            "Model" => d.model = Some(v.to_string()),
            _ => {}
        }
    }
    d
}

/// A device node's state: dumps hold plain files; a real node is opened
/// (read-write, as CUDA does) and closed at once.
fn node_state(path: &Path) -> Option<NodeState> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_char_device() {
        return Some(NodeState::Present);
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(_) => Some(NodeState::Opened),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
            Some(NodeState::Denied(e.to_string()))
        }
        // ENXIO/ENODEV: the node exists but no driver answers (a dump made
        // of real nodes, a machine whose driver is not loaded).
        Err(_) => Some(NodeState::Present),
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The job's environment: this process's on the live machine, the dump's
/// `proc/self/environ` otherwise (empty when the dump has none).
fn job_env(root: &Path, live: bool) -> (BTreeMap<String, String>, String) {
    let keep = |k: &str| ENV_VARS.contains(&k);
    if live {
        let env = std::env::vars().filter(|(k, _)| keep(k)).collect();
        return (env, "threadwise's environment".into());
    }
    let path = root.join("proc/self/environ");
    let Ok(raw) = std::fs::read(&path) else {
        return (
            BTreeMap::new(),
            "no environment (the dump has no proc/self/environ)".into(),
        );
    };
    let env = raw
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('='))
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (env, format!("{}", path.display()))
}

/// Read the evidence below `root`.
pub fn gather(root: &Path, live: bool, nvml: NvmlUse) -> GpuEvidence {
    let mut ev = GpuEvidence::default();
    let driver_dir = root.join("proc/driver/nvidia/gpus");
    if driver_dir.is_dir() {
        let mut map = BTreeMap::new();
        for bus in names(&driver_dir).into_iter().take(super::MAX_DEVICES) {
            let text =
                fsread::read_under(root, &format!("proc/driver/nvidia/gpus/{bus}/information"))
                    .unwrap_or_default();
            map.insert(bus.to_ascii_lowercase(), parse_information(&text));
        }
        ev.nvidia_driver = Some(map);
    }
    let dev = root.join("dev");
    ev.dev_seen = dev.is_dir();
    for name in names(&dev) {
        if let Some(m) = name
            .strip_prefix("nvidia")
            .and_then(|m| m.parse::<u32>().ok())
            && let Some(s) = node_state(&dev.join(&name))
        {
            ev.nvidia_nodes.insert(m, s);
        }
    }
    let drm = root.join("sys/class/drm");
    if drm.is_dir() {
        let mut map = BTreeMap::new();
        for name in names(&drm).into_iter().filter(|n| n.starts_with("renderD")) {
            let Ok(link) = std::fs::read_link(drm.join(&name).join("device")) else {
                continue;
            };
            let Some(bus) = link.file_name().and_then(|b| b.to_str()) else {
                continue;
            };
            let state = node_state(&dev.join("dri").join(&name));
            if let Some(s) = state {
                map.insert(bus.to_ascii_lowercase(), s);
            }
        }
        ev.amd_nodes = Some(map);
    }
    let caps = root.join("proc/driver/nvidia/capabilities");
    for name in names(&caps) {
        if let Some(m) = name.strip_prefix("gpu").and_then(|m| m.parse::<u32>().ok())
            && names(&caps.join(&name).join("mig"))
                .iter()
                .any(|g| g.starts_with("gi"))
        {
            ev.mig_minors.push(m);
        }
    }
    (ev.env, ev.env_from) = job_env(root, live);
    let uuids = ev
        .env
        .get("CUDA_VISIBLE_DEVICES")
        .is_some_and(|v| v.contains("GPU-") || v.contains("MIG-"));
    let driver_has_uuids = ev
        .nvidia_driver
        .as_ref()
        .is_some_and(|d| !d.is_empty() && d.values().all(|g| g.uuid.is_some()));
    let needed = !ev.mig_minors.is_empty()
        || (uuids && !driver_has_uuids)
        || (ev.nvidia_driver.is_none() && !ev.nvidia_nodes.is_empty());
    // A dump is another machine: this machine's NVML would answer for the
    // wrong GPUs, unless a library was named on purpose (a recorded or
    // stand-in NVML).
    let allowed = live || std::env::var_os(crate::nvml::LIBRARY_VAR).is_some();
    let consult = allowed
        && match nvml {
            NvmlUse::Always => true,
            NvmlUse::IfNeeded => needed,
            NvmlUse::Never => false,
        };
    if consult {
        ev.nvml = Some(crate::nvml::open().and_then(|n| crate::nvml::inventory(&n)));
    }
    ev
}

fn list(v: &str) -> Vec<&str> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Decide the job's GPUs from the machine's (`bus`, PCI order, `index` set).
/// Returns them in the order the job numbers them (cuda:0 first).
pub fn decide(
    bus: &[PciDevice],
    ev: &GpuEvidence,
) -> Result<(Vec<PciDevice>, GpuAccess), TopologyError> {
    let mut acc = GpuAccess {
        on_bus: bus.len(),
        ..Default::default()
    };
    let mut lines: Vec<String> = vec![];
    let mut hidden: Vec<HiddenGpu> = vec![];
    macro_rules! say {
        ($e:expr) => {
            lines.push($e)
        };
    }
    macro_rules! hide {
        ($g:expr, $why:expr) => {
            hidden.push(HiddenGpu {
                bus_id: $g.bus_id.clone(),
                numa_node: $g.numa_node,
                why: $why,
            })
        };
    }
    let nvml_list = match &ev.nvml {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            say!(format!("NVML did not load: {e}"));
            None
        }
        None => None,
    };
    // 1. Device nodes.
    let nvidia_count = bus.iter().filter(|g| !g.is_amd()).count();
    let mut usable: Vec<PciDevice> = vec![];
    let driver = ev.nvidia_driver.as_ref();
    if let Some(d) = driver {
        say!(format!(
            "/proc/driver/nvidia/gpus lists {} GPU(s); /dev holds {} of their nodes",
            d.len(),
            d.values()
                .filter(|g| g.minor.is_some_and(|m| ev.nvidia_nodes.contains_key(&m)))
                .count()
        ));
    } else if nvidia_count > 0 && !ev.nvidia_nodes.is_empty() {
        say!(
            "no /proc/driver/nvidia: /dev/nvidia<N> taken as the N-th NVIDIA GPU in PCI order"
                .into()
        );
    } else if nvidia_count > 0 {
        say!("no NVIDIA driver table or device node to look at: every NVIDIA GPU on the PCI bus is taken as usable".into());
    }
    let mut k = 0u32;
    for g in bus {
        let mut g = g.clone();
        if g.is_amd() {
            match ev.amd_nodes.as_ref() {
                Some(nodes) if !nodes.is_empty() => match nodes.get(&g.bus_id) {
                    None => {
                        hide!(g, "no render node (/dev/dri/renderD*) for it".into());
                        continue;
                    }
                    Some(NodeState::Denied(e)) => {
                        hide!(g, format!("its render node cannot be opened: {e}"));
                        continue;
                    }
                    Some(_) => {}
                },
                _ => {}
            }
            usable.push(g);
            continue;
        }
        let minor = match driver {
            Some(d) => match d.get(&g.bus_id) {
                Some(info) => {
                    g.uuid = g.uuid.take().or_else(|| info.uuid.clone());
                    info.minor
                }
                None => {
                    hide!(
                        g,
                        "the driver does not list it (/proc/driver/nvidia/gpus)".into()
                    );
                    continue;
                }
            },
            None if !ev.nvidia_nodes.is_empty() => Some(k),
            None => None,
        };
        k += 1;
        g.minor = minor;
        if let Some(m) = minor
            && (driver.is_some() || !ev.nvidia_nodes.is_empty())
            && ev.dev_seen
        {
            match ev.nvidia_nodes.get(&m) {
                None => {
                    hide!(g, format!("no /dev/nvidia{m}: not given to this job"));
                    continue;
                }
                Some(NodeState::Denied(e)) => {
                    hide!(
                        g,
                        format!(
                            "/dev/nvidia{m} cannot be opened ({e}): a devices cgroup withholds it"
                        )
                    );
                    continue;
                }
                Some(_) => {}
            }
        }
        usable.push(g);
    }
    if !hidden.is_empty() {
        let shown: Vec<&str> = usable.iter().map(|g| g.bus_id.as_str()).collect();
        say!(format!(
            "device nodes: {} of {} GPUs can be opened ({})",
            usable.len(),
            bus.len(),
            if shown.is_empty() {
                "none".into()
            } else {
                shown.join(", ")
            }
        ));
    }
    // 2. NVML.
    if let Some(list) = nvml_list {
        let by_bus: BTreeMap<&str, &NvmlGpu> =
            list.iter().map(|n| (n.bus_id.as_str(), n)).collect();
        let before = usable.len();
        let mut keep = vec![];
        for mut g in usable {
            if g.is_amd() {
                keep.push(g);
                continue;
            }
            match by_bus.get(g.bus_id.as_str()) {
                Some(n) => {
                    g.uuid = n.uuid.clone().or(g.uuid);
                    g.minor = n.minor.or(g.minor);
                    keep.push(g);
                }
                None => hide!(g, "NVML does not list it".into()),
            }
        }
        usable = keep;
        let foreign: Vec<&str> = list
            .iter()
            .filter(|n| !bus.iter().any(|g| g.bus_id == n.bus_id))
            .map(|n| n.bus_id.as_str())
            .collect();
        say!(format!(
            "NVML lists {} GPU(s); {} of {} left after it{}",
            list.len(),
            usable.len(),
            before,
            if foreign.is_empty() {
                String::new()
            } else {
                format!(" (not on this PCI bus, ignored: {})", foreign.join(", "))
            }
        ));
    }
    // Each GPU's place among those the job can open, per vendor, in PCI order:
    // what CUDA_VISIBLE_DEVICES (HIP's) indices name inside this job.
    let (mut nv, mut amd) = (0usize, 0usize);
    let base: Vec<(usize, PciDevice)> = usable
        .into_iter()
        .map(|g| {
            let c = if g.is_amd() { &mut amd } else { &mut nv };
            *c += 1;
            (*c - 1, g)
        })
        .collect();
    let narrowed = base.len() < bus.len();
    let mig_of = |g: &PciDevice| -> Vec<String> {
        nvml_list
            .and_then(|l| l.iter().find(|n| n.bus_id == g.bus_id))
            .map(|n| n.mig.clone())
            .unwrap_or_default()
    };
    // 3. The job's own variables.
    let env = |k: &str| ev.env.get(k).map(String::as_str);
    if let Some(order) = env("CUDA_DEVICE_ORDER")
        && order != "PCI_BUS_ID"
    {
        let models: std::collections::BTreeSet<&str> = base
            .iter()
            .filter(|(_, g)| !g.is_amd())
            .map(|(_, g)| g.device.as_str())
            .collect();
        if models.len() > 1 {
            say!(format!(
                "CUDA_DEVICE_ORDER={order} with {} GPU models: CUDA numbers the fastest first, \
                 so indices are read in PCI bus order (the order threadwise gives ranks)",
                models.len()
            ));
        }
    }
    let mut chosen: Vec<PciDevice> = vec![];
    let mut by_uuid = false;
    let cvd = env("CUDA_VISIBLE_DEVICES");
    let nvidia: Vec<&(usize, PciDevice)> = base.iter().filter(|(_, g)| !g.is_amd()).collect();
    if let Some(v) = cvd {
        let err = |why: String| TopologyError::VisibleDevices {
            value: v.to_string(),
            why,
        };
        for item in v.split(',').map(str::trim) {
            if item.is_empty() {
                break;
            }
            if item.starts_with("MIG-") {
                let parent = nvidia
                    .iter()
                    .find(|(_, g)| mig_of(g).iter().any(|m| m == item));
                match parent {
                    Some((_, g)) => {
                        let mut s = g.clone();
                        s.mig = Some(item.to_string());
                        s.visible_as = Some(item.to_string());
                        chosen.push(s);
                        continue;
                    }
                    None if nvml_list.is_none() => {
                        return Err(err(format!(
                            "{item} is a MIG device, and only NVML can say which GPU holds it, but NVML {}",
                            if ev.nvml.is_some() {
                                "did not load"
                            } else {
                                "was not consulted"
                            }
                        )));
                    }
                    None => {
                        say!(format!(
                            "CUDA_VISIBLE_DEVICES: {item} is no MIG device of this job's GPUs; CUDA stops there"
                        ));
                        break;
                    }
                }
            }
            if item.starts_with("GPU-") {
                by_uuid = true;
                let hits: Vec<&&(usize, PciDevice)> = nvidia
                    .iter()
                    .filter(|(_, g)| g.uuid.as_deref().is_some_and(|u| u.starts_with(item)))
                    .collect();
                let known = nvidia.iter().all(|(_, g)| g.uuid.is_some());
                match hits.as_slice() {
                    [(_, g)] => {
                        let mut s = g.clone();
                        s.visible_as = s.uuid.clone();
                        chosen.push(s);
                        continue;
                    }
                    [] if !known => {
                        return Err(err(format!(
                            "{item} is a UUID, and neither /proc/driver/nvidia nor NVML gave every GPU's UUID"
                        )));
                    }
                    [] => {
                        say!(format!(
                            "CUDA_VISIBLE_DEVICES: no GPU of this job has UUID {item}; CUDA stops there"
                        ));
                        break;
                    }
                    _ => {
                        say!(format!(
                            "CUDA_VISIBLE_DEVICES: {item} is the prefix of several UUIDs; CUDA stops there"
                        ));
                        break;
                    }
                }
            }
            match item.parse::<usize>() {
                Ok(i) if i < nvidia.len() => {
                    let g = &nvidia[i].1;
                    if chosen
                        .iter()
                        .any(|c| c.bus_id == g.bus_id && c.mig.is_none())
                    {
                        return Err(err(format!("GPU {i} is listed twice")));
                    }
                    let mut s = g.clone();
                    s.visible_as = Some(i.to_string());
                    chosen.push(s);
                }
                Ok(i) => {
                    say!(format!(
                        "CUDA_VISIBLE_DEVICES: index {i}, but the job can open {} GPU(s); CUDA stops there",
                        nvidia.len()
                    ));
                    break;
                }
                Err(_) => {
                    if chosen.is_empty()
                        && !item.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    {
                        return Err(err(format!("{item:?} is neither a GPU index nor a UUID")));
                    }
                    say!(format!(
                        "CUDA_VISIBLE_DEVICES: {item:?} is neither an index nor a UUID; CUDA stops there"
                    ));
                    break;
                }
            }
        }
        say!(format!(
            "CUDA_VISIBLE_DEVICES={v} ({}): {} of the {} GPU(s) the job can open, in its order{}",
            ev.env_from,
            chosen.len(),
            nvidia.len(),
            if narrowed && !by_uuid {
                ", its indices counted among those"
            } else {
                ""
            }
        ));
    } else {
        for (i, g) in &nvidia {
            let migs = mig_of(g);
            if migs.is_empty()
                && nvml_list.is_none()
                && g.minor.is_some_and(|m| ev.mig_minors.contains(&m))
            {
                say!(format!(
                    "{} is in MIG mode (/proc/driver/nvidia/capabilities shows GPU instances), \
                     but only NVML lists its slices and NVML {}: planned as one whole GPU",
                    g.bus_id,
                    if ev.nvml.is_some() {
                        "did not load"
                    } else {
                        "was not consulted (a dump: set THREADWISE_NVML_LIBRARY)"
                    }
                ));
            }
            if migs.is_empty() {
                let mut s = g.clone();
                s.visible_as = narrowed.then(|| i.to_string());
                chosen.push(s);
            } else {
                say!(format!(
                    "{} is in MIG mode: its {} slice(s) are the job's devices, one per rank \
                     (a CUDA process enumerates one MIG device)",
                    g.bus_id,
                    migs.len()
                ));
                for m in migs {
                    let mut s = g.clone();
                    s.visible_as = Some(m.clone());
                    s.mig = Some(m);
                    chosen.push(s);
                }
            }
        }
    }
    // AMD: ROCR_VISIBLE_DEVICES first, then HIP_VISIBLE_DEVICES among those.
    let mut amds: Vec<(usize, PciDevice)> =
        base.iter().filter(|(_, g)| g.is_amd()).cloned().collect();
    // A rank's HIP_VISIBLE_DEVICES counts among what ROCR left (the rank
    // inherits ROCR_VISIBLE_DEVICES).
    let amd_on_bus = bus.iter().filter(|g| g.is_amd()).count();
    for var in ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"] {
        if let Some(v) = env(var) {
            let mut keep = vec![];
            for item in list(v) {
                match item.parse::<usize>() {
                    Ok(i) if i < amds.len() => keep.push(amds[i].clone()),
                    _ => break,
                }
            }
            say!(format!(
                "{var}={v}: {} of {} AMD GPU(s)",
                keep.len(),
                amds.len()
            ));
            if var == "ROCR_VISIBLE_DEVICES" {
                keep = keep
                    .into_iter()
                    .enumerate()
                    .map(|(i, (_, g))| (i, g))
                    .collect();
            }
            amds = keep;
        }
    }
    let amd_narrowed = amds.len() < amd_on_bus;
    for (i, mut g) in amds {
        g.visible_as = amd_narrowed.then(|| i.to_string());
        chosen.push(g);
    }
    // 4. Corroboration only.
    for var in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(v) = env(var) {
            let named: Vec<u32> = list(v).iter().filter_map(|s| s.parse().ok()).collect();
            let base_minors: Vec<u32> = nvidia.iter().filter_map(|(_, g)| g.minor).collect();
            let agrees = named.iter().all(|m| base_minors.contains(m)) && !named.is_empty();
            say!(format!(
                "{var}={v}: {}",
                if agrees {
                    format!(
                        "agrees with the device nodes the job can open (/dev/nvidia{})",
                        join(&base_minors)
                    )
                } else {
                    format!(
                        "differs from the device nodes the job can open ({}): not acted on",
                        if base_minors.is_empty() {
                            "none known".into()
                        } else {
                            format!("/dev/nvidia{}", join(&base_minors))
                        }
                    )
                }
            ));
            break;
        }
    }
    if let Some(v) = env("NVIDIA_VISIBLE_DEVICES") {
        let items = list(v);
        let verdict = match v.trim() {
            "all" => "every GPU of the host was given".to_string(),
            "" | "none" | "void" => "the container runtime gave no GPU".to_string(),
            _ => {
                let ok = items.iter().all(|i| {
                    chosen.iter().any(|c| c.mig.as_deref() == Some(*i))
                        || nvidia.iter().any(|(_, g)| {
                            g.uuid.as_deref() == Some(*i)
                                || i.parse::<u32>().ok().is_some_and(|m| g.minor == Some(m))
                        })
                });
                if ok {
                    "agrees with the device nodes".to_string()
                } else {
                    "differs from the device nodes: not acted on".to_string()
                }
            }
        };
        say!(format!("NVIDIA_VISIBLE_DEVICES={v}: {verdict}"));
    }
    acc.evidence = lines;
    acc.hidden = hidden;
    acc.usable = chosen.len();
    // A GPU present on the bus and left out by CUDA_VISIBLE_DEVICES is the
    // job's choice, not hidden from it: it is not listed as hidden.
    Ok((chosen, acc))
}

fn join(v: &[u32]) -> String {
    if v.len() == 1 {
        return v[0].to_string();
    }
    format!(
        "{{{}}}",
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )
}

#[cfg(test)]
mod tests {
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
}
