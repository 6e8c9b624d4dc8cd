//! The stages of `decide`, each a method on one `Decision`: the GPUs still
//! usable after it, the ones chosen (in the job's order), the evidence lines
//! and the hidden GPUs with their reasons. Pure: the evidence was gathered.

use std::collections::{BTreeMap, BTreeSet};

use super::{GpuAccess, GpuEvidence, HiddenGpu, NodeState};
use crate::nvml::NvmlGpu;
use crate::topology::{PciDevice, TopologyError};

/// What the stages build.
pub(super) struct Decision<'a> {
    bus: &'a [PciDevice],
    ev: &'a GpuEvidence,
    /// NVML's list, when it loaded.
    nvml: Option<&'a [NvmlGpu]>,
    /// Left by the device nodes and NVML (stages 1 and 2).
    usable: Vec<PciDevice>,
    /// `usable` numbered as the job numbers them, per vendor, in PCI order.
    base: Vec<(usize, PciDevice)>,
    /// The job's GPUs (stage 3), cuda:0 first.
    chosen: Vec<PciDevice>,
    lines: Vec<String>,
    hidden: Vec<HiddenGpu>,
}

/// What one CUDA_VISIBLE_DEVICES item does.
enum Item {
    Take(PciDevice),
    /// CUDA stops reading the list here (said why).
    Stop(String),
}

fn list(v: &str) -> Vec<&str> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
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

impl<'a> Decision<'a> {
    pub(super) fn new(bus: &'a [PciDevice], ev: &'a GpuEvidence) -> Decision<'a> {
        let mut d = Decision {
            bus,
            ev,
            nvml: None,
            usable: vec![],
            base: vec![],
            chosen: vec![],
            lines: vec![],
            hidden: vec![],
        };
        match &ev.nvml {
            Some(Ok(l)) => d.nvml = Some(l),
            Some(Err(e)) => d.say(format!("NVML did not load: {e}")),
            None => {}
        }
        d
    }

    fn say(&mut self, line: String) {
        self.lines.push(line);
    }

    fn hide(&mut self, g: &PciDevice, why: String) {
        self.hidden.push(HiddenGpu {
            bus_id: g.bus_id.clone(),
            numa_node: g.numa_node,
            why,
        });
    }

    fn env(&self, k: &str) -> Option<&'a str> {
        self.ev.env.get(k).map(String::as_str)
    }

    /// The GPUs the job can open, NVIDIA's numbered among themselves.
    fn nvidia(&self) -> Vec<(usize, PciDevice)> {
        self.base
            .iter()
            .filter(|(_, g)| !g.is_amd())
            .cloned()
            .collect()
    }

    /// NVML's MIG slices of `g`.
    fn mig_of(&self, g: &PciDevice) -> Vec<String> {
        self.nvml
            .and_then(|l| l.iter().find(|n| n.bus_id == g.bus_id))
            .map(|n| n.mig.clone())
            .unwrap_or_default()
    }

    /// "did not load" or "was not consulted", for NVML's absence.
    fn nvml_absent(&self, dump_hint: &str) -> String {
        if self.ev.nvml.is_some() {
            "did not load".into()
        } else {
            format!("was not consulted{dump_hint}")
        }
    }

    /// Stage 1: the device nodes the job can open, told apart by the
    /// driver's table (else /dev/nvidia<N> as the N-th NVIDIA GPU).
    pub(super) fn device_nodes(&mut self) {
        let ev = self.ev;
        let nvidia_count = self.bus.iter().filter(|g| !g.is_amd()).count();
        if let Some(d) = &ev.nvidia_driver {
            let nodes = d
                .values()
                .filter(|g| g.minor.is_some_and(|m| ev.nvidia_nodes.contains_key(&m)))
                .count();
            self.say(format!(
                "/proc/driver/nvidia/gpus lists {} GPU(s); /dev holds {nodes} of their nodes",
                d.len()
            ));
        } else if nvidia_count > 0 && !ev.nvidia_nodes.is_empty() {
            self.say(
                "no /proc/driver/nvidia: /dev/nvidia<N> taken as the N-th NVIDIA GPU in PCI order"
                    .into(),
            );
        } else if nvidia_count > 0 {
            self.say("no NVIDIA driver table or device node to look at: every NVIDIA GPU on the PCI bus is taken as usable".into());
        }
        let mut k = 0u32;
        for g in self.bus {
            let opened = if g.is_amd() {
                self.amd_node(g)
            } else {
                self.nvidia_node(g, &mut k)
            };
            match opened {
                Ok(g) => self.usable.push(g),
                Err(why) => self.hide(g, why),
            }
        }
        if !self.hidden.is_empty() {
            let shown: Vec<&str> = self.usable.iter().map(|g| g.bus_id.as_str()).collect();
            let line = format!(
                "device nodes: {} of {} GPUs can be opened ({})",
                self.usable.len(),
                self.bus.len(),
                if shown.is_empty() {
                    "none".into()
                } else {
                    shown.join(", ")
                }
            );
            self.say(line);
        }
    }

    /// An AMD GPU with its render node (when the machine has any), or why not.
    fn amd_node(&self, g: &PciDevice) -> Result<PciDevice, String> {
        match self.ev.amd_nodes.as_ref() {
            Some(nodes) if !nodes.is_empty() => match nodes.get(&g.bus_id) {
                None => Err("no render node (/dev/dri/renderD*) for it".into()),
                Some(NodeState::Denied(e)) => Err(format!("its render node cannot be opened: {e}")),
                Some(_) => Ok(g.clone()),
            },
            _ => Ok(g.clone()),
        }
    }

    /// An NVIDIA GPU with its minor and UUID, or why the job cannot open it;
    /// `k` counts NVIDIA GPUs in PCI order (the minor without a driver table).
    fn nvidia_node(&self, g: &PciDevice, k: &mut u32) -> Result<PciDevice, String> {
        let ev = self.ev;
        let mut g = g.clone();
        let minor = match &ev.nvidia_driver {
            Some(d) => match d.get(&g.bus_id) {
                Some(info) => {
                    g.uuid = g.uuid.take().or_else(|| info.uuid.clone());
                    info.minor
                }
                None => return Err("the driver does not list it (/proc/driver/nvidia/gpus)".into()),
            },
            None if !ev.nvidia_nodes.is_empty() => Some(*k),
            None => None,
        };
        *k += 1;
        g.minor = minor;
        if let Some(m) = minor
            && (ev.nvidia_driver.is_some() || !ev.nvidia_nodes.is_empty())
            && ev.dev_seen
        {
            match ev.nvidia_nodes.get(&m) {
                None => return Err(format!("no /dev/nvidia{m}: not given to this job")),
                Some(NodeState::Denied(e)) => {
                    return Err(format!(
                        "/dev/nvidia{m} cannot be opened ({e}): a devices cgroup withholds it"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(g)
    }

    /// Stage 2: NVML lists only what the process may use.
    pub(super) fn nvml_list(&mut self) {
        let Some(list) = self.nvml else {
            return;
        };
        let by_bus: BTreeMap<&str, &NvmlGpu> =
            list.iter().map(|n| (n.bus_id.as_str(), n)).collect();
        let before = self.usable.len();
        for mut g in std::mem::take(&mut self.usable) {
            if g.is_amd() {
                self.usable.push(g);
                continue;
            }
            match by_bus.get(g.bus_id.as_str()) {
                Some(n) => {
                    g.uuid = n.uuid.clone().or(g.uuid);
                    g.minor = n.minor.or(g.minor);
                    self.usable.push(g);
                }
                None => self.hide(&g, "NVML does not list it".into()),
            }
        }
        let foreign: Vec<&str> = list
            .iter()
            .filter(|n| !self.bus.iter().any(|g| g.bus_id == n.bus_id))
            .map(|n| n.bus_id.as_str())
            .collect();
        let line = format!(
            "NVML lists {} GPU(s); {} of {before} left after it{}",
            list.len(),
            self.usable.len(),
            if foreign.is_empty() {
                String::new()
            } else {
                format!(" (not on this PCI bus, ignored: {})", foreign.join(", "))
            }
        );
        self.say(line);
    }

    /// Each GPU's place among those the job can open, per vendor, in PCI
    /// order: what CUDA_VISIBLE_DEVICES (HIP's) indices name inside this job.
    pub(super) fn number(&mut self) {
        let (mut nv, mut amd) = (0usize, 0usize);
        self.base = std::mem::take(&mut self.usable)
            .into_iter()
            .map(|g| {
                let c = if g.is_amd() { &mut amd } else { &mut nv };
                *c += 1;
                (*c - 1, g)
            })
            .collect();
    }

    /// The job sees fewer GPUs than the bus holds.
    fn narrowed(&self) -> bool {
        self.base.len() < self.bus.len()
    }

    /// CUDA_DEVICE_ORDER other than PCI_BUS_ID with mixed models: said.
    pub(super) fn cuda_device_order(&mut self) {
        let Some(order) = self.env("CUDA_DEVICE_ORDER").filter(|o| *o != "PCI_BUS_ID") else {
            return;
        };
        let models: BTreeSet<&str> = self
            .base
            .iter()
            .filter(|(_, g)| !g.is_amd())
            .map(|(_, g)| g.device.as_str())
            .collect();
        if models.len() > 1 {
            let line = format!(
                "CUDA_DEVICE_ORDER={order} with {} GPU models: CUDA numbers the fastest first, \
                 so indices are read in PCI bus order (the order threadwise gives ranks)",
                models.len()
            );
            self.say(line);
        }
    }

    /// Stage 3, NVIDIA: CUDA_VISIBLE_DEVICES read as CUDA reads it (indices
    /// among what the job can open, UUIDs by unique prefix, MIG slices,
    /// stopping at the first invalid entry).
    pub(super) fn cuda_visible_devices(&mut self, v: &str) -> Result<(), TopologyError> {
        let nvidia = self.nvidia();
        let mut by_uuid = false;
        for item in v.split(',').map(str::trim) {
            if item.is_empty() {
                break;
            }
            let step = if item.starts_with("MIG-") {
                self.mig_item(v, item, &nvidia)?
            } else if item.starts_with("GPU-") {
                by_uuid = true;
                self.uuid_item(v, item, &nvidia)?
            } else {
                self.index_item(v, item, &nvidia)?
            };
            match step {
                Item::Take(g) => self.chosen.push(g),
                Item::Stop(why) => {
                    self.say(format!("CUDA_VISIBLE_DEVICES: {why}; CUDA stops there"));
                    break;
                }
            }
        }
        let line = format!(
            "CUDA_VISIBLE_DEVICES={v} ({}): {} of the {} GPU(s) the job can open, in its order{}",
            self.ev.env_from,
            self.chosen.len(),
            nvidia.len(),
            if self.narrowed() && !by_uuid {
                ", its indices counted among those"
            } else {
                ""
            }
        );
        self.say(line);
        Ok(())
    }

    fn mig_item(
        &self,
        v: &str,
        item: &str,
        nvidia: &[(usize, PciDevice)],
    ) -> Result<Item, TopologyError> {
        let parent = nvidia
            .iter()
            .find(|(_, g)| self.mig_of(g).iter().any(|m| m == item));
        match parent {
            Some((_, g)) => {
                let mut s = g.clone();
                s.mig = Some(item.to_string());
                s.visible_as = Some(item.to_string());
                Ok(Item::Take(s))
            }
            None if self.nvml.is_none() => Err(TopologyError::VisibleDevices {
                value: v.to_string(),
                why: format!(
                    "{item} is a MIG device, and only NVML can say which GPU holds it, but NVML {}",
                    self.nvml_absent("")
                ),
            }),
            None => Ok(Item::Stop(format!(
                "{item} is no MIG device of this job's GPUs"
            ))),
        }
    }

    fn uuid_item(
        &self,
        v: &str,
        item: &str,
        nvidia: &[(usize, PciDevice)],
    ) -> Result<Item, TopologyError> {
        let hits: Vec<&PciDevice> = nvidia
            .iter()
            .map(|(_, g)| g)
            .filter(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with(item)))
            .collect();
        let known = nvidia.iter().all(|(_, g)| g.uuid.is_some());
        match hits.as_slice() {
            [g] => {
                let mut s = (*g).clone();
                s.visible_as = s.uuid.clone();
                Ok(Item::Take(s))
            }
            [] if !known => Err(TopologyError::VisibleDevices {
                value: v.to_string(),
                why: format!(
                    "{item} is a UUID, and neither /proc/driver/nvidia nor NVML gave every GPU's UUID"
                ),
            }),
            [] => Ok(Item::Stop(format!("no GPU of this job has UUID {item}"))),
            _ => Ok(Item::Stop(format!("{item} is the prefix of several UUIDs"))),
        }
    }

    fn index_item(
        &self,
        v: &str,
        item: &str,
        nvidia: &[(usize, PciDevice)],
    ) -> Result<Item, TopologyError> {
        let err = |why: String| TopologyError::VisibleDevices {
            value: v.to_string(),
            why,
        };
        match item.parse::<usize>() {
            Ok(i) if i < nvidia.len() => {
                let g = &nvidia[i].1;
                if self
                    .chosen
                    .iter()
                    .any(|c| c.bus_id == g.bus_id && c.mig.is_none())
                {
                    return Err(err(format!("GPU {i} is listed twice")));
                }
                let mut s = g.clone();
                s.visible_as = Some(i.to_string());
                Ok(Item::Take(s))
            }
            Ok(i) => Ok(Item::Stop(format!(
                "index {i}, but the job can open {} GPU(s)",
                nvidia.len()
            ))),
            Err(_)
                if self.chosen.is_empty()
                    && !item.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                Err(err(format!("{item:?} is neither a GPU index nor a UUID")))
            }
            Err(_) => Ok(Item::Stop(format!(
                "{item:?} is neither an index nor a UUID"
            ))),
        }
    }

    /// Stage 3, NVIDIA without CUDA_VISIBLE_DEVICES: every GPU the job can
    /// open, a GPU in MIG mode as its slices.
    pub(super) fn every_nvidia_gpu(&mut self) {
        for (i, g) in self.nvidia() {
            let migs = self.mig_of(&g);
            if migs.is_empty()
                && self.nvml.is_none()
                && g.minor.is_some_and(|m| self.ev.mig_minors.contains(&m))
            {
                let line = format!(
                    "{} is in MIG mode (/proc/driver/nvidia/capabilities shows GPU instances), \
                     but only NVML lists its slices and NVML {}: planned as one whole GPU",
                    g.bus_id,
                    self.nvml_absent(" (a dump: set THREADWISE_NVML_LIBRARY)")
                );
                self.say(line);
            }
            if migs.is_empty() {
                let mut s = g.clone();
                s.visible_as = self.narrowed().then(|| i.to_string());
                self.chosen.push(s);
                continue;
            }
            self.say(format!(
                "{} is in MIG mode: its {} slice(s) are the job's devices, one per rank \
                 (a CUDA process enumerates one MIG device)",
                g.bus_id,
                migs.len()
            ));
            for m in migs {
                let mut s = g.clone();
                s.visible_as = Some(m.clone());
                s.mig = Some(m);
                self.chosen.push(s);
            }
        }
    }

    /// Stage 3, AMD: ROCR_VISIBLE_DEVICES first, then HIP_VISIBLE_DEVICES
    /// among those (a rank inherits ROCR_VISIBLE_DEVICES).
    pub(super) fn amd_visible_devices(&mut self) {
        let mut amds: Vec<(usize, PciDevice)> = self
            .base
            .iter()
            .filter(|(_, g)| g.is_amd())
            .cloned()
            .collect();
        let amd_on_bus = self.bus.iter().filter(|g| g.is_amd()).count();
        for var in ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"] {
            let Some(v) = self.env(var) else { continue };
            let mut keep = vec![];
            for item in list(v) {
                match item.parse::<usize>() {
                    Ok(i) if i < amds.len() => keep.push(amds[i].clone()),
                    _ => break,
                }
            }
            self.say(format!(
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
        let amd_narrowed = amds.len() < amd_on_bus;
        for (i, mut g) in amds {
            g.visible_as = amd_narrowed.then(|| i.to_string());
            self.chosen.push(g);
        }
    }

    /// Stage 4: Slurm's GPU list compared with the device nodes; never acted on.
    pub(super) fn slurm_gpus(&mut self) {
        let Some((var, v)) = ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"]
            .into_iter()
            .find_map(|k| Some((k, self.env(k)?)))
        else {
            return;
        };
        let named: Vec<u32> = list(v).iter().filter_map(|s| s.parse().ok()).collect();
        let minors: Vec<u32> = self.nvidia().iter().filter_map(|(_, g)| g.minor).collect();
        let agrees = named.iter().all(|m| minors.contains(m)) && !named.is_empty();
        let verdict = if agrees {
            format!(
                "agrees with the device nodes the job can open (/dev/nvidia{})",
                join(&minors)
            )
        } else {
            format!(
                "differs from the device nodes the job can open ({}): not acted on",
                if minors.is_empty() {
                    "none known".into()
                } else {
                    format!("/dev/nvidia{}", join(&minors))
                }
            )
        };
        self.say(format!("{var}={v}: {verdict}"));
    }

    /// Stage 4: the container runtime's NVIDIA_VISIBLE_DEVICES, compared.
    pub(super) fn nvidia_visible_devices(&mut self) {
        let Some(v) = self.env("NVIDIA_VISIBLE_DEVICES") else {
            return;
        };
        let nvidia = self.nvidia();
        let verdict = match v.trim() {
            "all" => "every GPU of the host was given",
            "" | "none" | "void" => "the container runtime gave no GPU",
            _ => {
                let ok = list(v).iter().all(|i| {
                    self.chosen.iter().any(|c| c.mig.as_deref() == Some(*i))
                        || nvidia.iter().any(|(_, g)| {
                            g.uuid.as_deref() == Some(*i)
                                || i.parse::<u32>().ok().is_some_and(|m| g.minor == Some(m))
                        })
                });
                if ok {
                    "agrees with the device nodes"
                } else {
                    "differs from the device nodes: not acted on"
                }
            }
        };
        self.say(format!("NVIDIA_VISIBLE_DEVICES={v}: {verdict}"));
    }

    /// The job's GPUs and how they were told. A GPU on the bus that
    /// CUDA_VISIBLE_DEVICES leaves out is the job's choice, not hidden from it.
    pub(super) fn finish(self) -> (Vec<PciDevice>, GpuAccess) {
        let acc = GpuAccess {
            on_bus: self.bus.len(),
            usable: self.chosen.len(),
            evidence: self.lines,
            hidden: self.hidden,
        };
        (self.chosen, acc)
    }
}
