//! Reading the evidence (the OS edge): the NVIDIA driver's table, the
//! device nodes the job can open, AMD's render nodes, MIG capabilities, the
//! job's variables, and NVML when it is needed.

use std::collections::BTreeMap;
use std::path::Path;

use super::{DriverGpu, ENV_VARS, GpuEvidence, NodeState, NvmlUse};
use crate::topology::fsread;

/// The `information` file's `Key:  value` lines.
pub(crate) fn parse_information(text: &str) -> DriverGpu {
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
pub(crate) fn gather(root: &Path, live: bool, nvml: NvmlUse) -> GpuEvidence {
    let mut ev = GpuEvidence::default();
    let driver_dir = root.join("proc/driver/nvidia/gpus");
    if driver_dir.is_dir() {
        let mut map = BTreeMap::new();
        for bus in names(&driver_dir)
            .into_iter()
            .take(crate::topology::MAX_DEVICES)
        {
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
        };
    if consult {
        ev.nvml = Some(crate::nvml::open().and_then(|n| crate::nvml::inventory(&n)));
    }
    ev
}
