//! The one place NVML is loaded (at run time: no link-time dependency, so the
//! binary runs where there is no driver). `THREADWISE_NVML_LIBRARY` names the
//! library to load instead of `libnvidia-ml.so.1`: the tests' stand-in
//! (tests/support/nvml-standin), or a driver installed outside the loader's
//! search path.

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

/// The variable naming the NVML library to load.
pub(crate) const LIBRARY_VAR: &str = "THREADWISE_NVML_LIBRARY";

/// NVML, or why it did not load, in words: the library that is missing or
/// the call that failed (nvml-wrapper's "a libloading error occurred: ..."
/// says the first without naming it).
pub(crate) fn open() -> Result<Nvml, String> {
    match std::env::var_os(LIBRARY_VAR) {
        Some(path) if !path.is_empty() => Nvml::builder()
            .lib_path(OsStr::new(&path))
            .init()
            .map_err(|e| format!("{} ({LIBRARY_VAR}={})", said(&e), path.to_string_lossy())),
        _ => Nvml::init().map_err(|e| said(&e)),
    }
}

fn said(e: &nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::LibloadingError(l) => {
            format!("the NVIDIA driver's library does not load ({l})")
        }
        e => e.to_string(),
    }
}

/// One GPU as NVML lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NvmlGpu {
    /// sysfs's spelling: `0000:3b:00.0`.
    pub bus_id: String,
    pub uuid: Option<String>,
    pub minor: Option<u32>,
    pub name: Option<String>,
    pub persistence: Option<bool>,
    /// MIG devices (UUIDs `MIG-...`) when MIG mode is on.
    pub mig: Vec<String>,
}

/// NVML's `00000000:3B:00.0` as sysfs writes it, `0000:3b:00.0`.
pub(crate) fn sysfs_bus_id(nvml: &str) -> String {
    let t = nvml.trim().to_ascii_lowercase();
    match t.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => {
            let d = dom.trim_start_matches('0');
            format!("{:0>4}:{rest}", d)
        }
        _ => t,
    }
}

/// Every GPU NVML lists (it lists only what this process may use).
pub(crate) fn inventory(n: &Nvml) -> Result<Vec<NvmlGpu>, String> {
    let count = n.device_count().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for i in 0..count {
        let d = n.device_by_index(i).map_err(|e| e.to_string())?;
        let Ok(pci) = d.pci_info() else { continue };
        let mut mig = Vec::new();
        if d.mig_mode().is_ok_and(|m| m.current == 1) {
            let max = d.mig_device_count().unwrap_or(0);
            for k in 0..max {
                if let Ok(m) = d.mig_device_by_index(k)
                    && let Ok(u) = m.uuid()
                {
                    mig.push(u);
                }
            }
        }
        out.push(NvmlGpu {
            bus_id: sysfs_bus_id(&pci.bus_id),
            uuid: d.uuid().ok(),
            minor: d.minor_number().ok(),
            name: d.name().ok(),
            persistence: d.is_in_persistent_mode().ok(),
            mig,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bus_ids_in_sysfs_spelling() {
        assert_eq!(super::sysfs_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(super::sysfs_bus_id("00000001:AF:00.0"), "0001:af:00.0");
        assert_eq!(super::sysfs_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }
}
