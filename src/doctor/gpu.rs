//! GPU checks: CUDA_VISIBLE_DEVICES, the driver (NVML), ranks per GPU,
//! persistence mode, and each GPU's PCIe link against what it can do.

use super::sys::Sys;
use super::{Area, Finding, Request, Severity};
use crate::topology::Topology;

pub(super) fn gpu(sys: &dyn Sys, topo: &Topology, req: &Request, out: &mut Vec<Finding>) {
    let pci = topo.gpus.len();
    out.extend(visible_devices(sys, topo));
    let nvml = sys.nvml();
    if pci == 0 && !nvml.loaded {
        out.push(
            Finding::new(
                "gpu.none",
                Area::Gpu,
                Severity::Info,
                "no GPU on this machine",
            )
            .evidence(
                nvml.error
                    .map_or_else(String::new, |e| format!("NVML: {e}")),
            ),
        );
        return;
    }
    if pci > 0 && !nvml.loaded {
        out.push(
            Finding::new(
                "gpu.driver",
                Area::Gpu,
                Severity::Warn,
                format!(
                    "{pci} GPU(s) on the PCI bus, but NVML does not load: is the driver loaded?"
                ),
            )
            .evidence(format!("NVML: {}", nvml.error.unwrap_or_default()))
            .fix("nvidia-smi   # should list the GPUs; else install or load the NVIDIA driver"),
        );
    }
    if let Some(n) = req.nproc
        && pci > 0
        && n > pci
    {
        out.push(
            Finding::new(
                "gpu.count",
                Area::Gpu,
                Severity::Warn,
                format!("{n} ranks for {pci} GPU(s): ranks share GPUs"),
            )
            .fix(format!("-n {pci}   # one rank per GPU")),
        );
    }
    pcie_links(sys, topo, out);
    if !nvml.persistence_off.is_empty() {
        out.push(
            Finding::new(
                "gpu.persistence",
                Area::Gpu,
                Severity::Info,
                "persistence mode is off: every process start re-initialises the GPUs (seconds per launch)",
            )
            .evidence(format!("GPUs {:?}", nvml.persistence_off))
            .fix("nvidia-smi -pm 1"),
        );
    }
}

/// CUDA_VISIBLE_DEVICES read as CUDA reads it: its indices count among the
/// GPUs the job can open.
fn visible_devices(sys: &dyn Sys, topo: &Topology) -> Option<Finding> {
    let v = sys.env("CUDA_VISIBLE_DEVICES")?;
    let openable = topo
        .gpu_access
        .as_ref()
        .map_or(topo.gpus.len(), |a| a.on_bus - a.hidden.len());
    let items: Vec<&str> = v.split(',').map(str::trim).collect();
    let f = if v.trim().is_empty() {
        Finding::new(
            "gpu.visible",
            Area::Gpu,
            Severity::Warn,
            "CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU and training falls back to CPU",
        )
        .fix("unset CUDA_VISIBLE_DEVICES")
    } else if items
        .iter()
        .all(|i| i.starts_with("GPU-") || i.starts_with("MIG-"))
    {
        Finding::new(
            "gpu.visible",
            Area::Gpu,
            Severity::Ok,
            "CUDA_VISIBLE_DEVICES names GPUs by UUID: resolved through /proc/driver/nvidia or NVML (threadwise topo shows each GPU's UUID)",
        )
    } else if let Some(bad) = items.iter().find(|i| i.parse::<usize>().is_err()) {
        Finding::new(
            "gpu.visible",
            Area::Gpu,
            Severity::Fail,
            format!(
                "CUDA_VISIBLE_DEVICES holds {bad:?}: CUDA stops at it and hides every GPU after it"
            ),
        )
        .fix("export CUDA_VISIBLE_DEVICES=0,1   # indices or UUIDs, comma-separated")
    } else if let Some(big) = items
        .iter()
        .filter_map(|i| i.parse::<usize>().ok())
        .find(|i| *i >= openable && openable > 0)
    {
        Finding::new(
            "gpu.visible",
            Area::Gpu,
            Severity::Fail,
            format!(
                "CUDA_VISIBLE_DEVICES names GPU {big}, but the job can open {openable}: CUDA stops there"
            ),
        )
        .fix("threadwise topo   # lists the GPUs this job can open, with the index each has inside it")
    } else {
        Finding::new(
            "gpu.visible",
            Area::Gpu,
            Severity::Ok,
            "CUDA_VISIBLE_DEVICES lists GPU indices",
        )
    };
    Some(f.evidence(format!("CUDA_VISIBLE_DEVICES={v:?}")))
}

/// A link's width (`16`) or speed (`16.0 GT/s PCIe`, older kernels `8 GT/s`):
/// its leading number.
fn link_value(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Each GPU's PCIe link from sysfs against its maximum. A narrower link than
/// the card and slot can do (x8 of x16: a riser, a BIOS lane split, a badly
/// seated card) halves host-device bandwidth with no error anywhere: a warning.
/// A slower one alone is what NVIDIA GPUs do when idle (they drop the link's
/// generation to save power), so it is only said, with how to check it under
/// load.
fn pcie_links(sys: &dyn Sys, topo: &Topology, out: &mut Vec<Finding>) {
    let (mut narrow, mut slow, mut read) = (vec![], vec![], 0);
    for g in &topo.gpus {
        let get = |name: &str| {
            sys.read(&format!("/sys/bus/pci/devices/{}/{name}", g.bus_id))
                .as_deref()
                .and_then(link_value)
        };
        let (Some(cw), Some(mw), Some(cs), Some(ms)) = (
            get("current_link_width"),
            get("max_link_width"),
            get("current_link_speed"),
            get("max_link_speed"),
        ) else {
            continue;
        };
        read += 1;
        let shown = format!(
            "{}: x{cw} at {cs} GT/s, can do x{mw} at {ms} GT/s",
            g.bus_id
        );
        if cw < mw {
            narrow.push(shown);
        } else if cs < ms {
            slow.push(shown);
        }
    }
    let f = if !narrow.is_empty() {
        Finding::new(
            "gpu.pcie-link",
            Area::Gpu,
            Severity::Warn,
            format!(
                "{} GPU(s) run a narrower PCIe link than they can: host-device copies slow down silently",
                narrow.len()
            ),
        )
        .evidence(narrow.join("; "))
        .fix("reseat the card or move it to a full-width slot; check risers and the BIOS's lane split (lspci -vv: LnkSta against LnkCap)")
    } else if !slow.is_empty() {
        Finding::new(
            "gpu.pcie-link",
            Area::Gpu,
            Severity::Info,
            format!(
                "{} GPU(s) run their PCIe link below its top speed: normal at idle (power saving), a problem under load",
                slow.len()
            ),
        )
        .evidence(slow.join("; "))
        .fix("nvidia-smi -q -d PCI   # during training: Link Gen Current should equal Max")
    } else if read > 0 {
        Finding::new(
            "gpu.pcie-link",
            Area::Gpu,
            Severity::Ok,
            "every GPU's PCIe link runs at its full width and speed",
        )
    } else {
        return;
    };
    out.push(f);
}
