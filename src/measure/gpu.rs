//! NVML readings of the job's own GPUs, by bus id, shared by tune (a
//! background sampler over a trial) and top (one reading per refresh).
//! NVML is loaded at run time (crate::nvml); when it does not load there is
//! no sampler and reports say n/a.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Nvml;

/// One GPU now.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuNow {
    pub bus_id: String,
    pub util_pct: Option<f64>,
    /// Memory in use on the GPU, every process's.
    pub mem_used_mib: Option<f64>,
    /// Processes with a compute context: (pid, MiB).
    pub processes: Vec<(u32, f64)>,
}

const MIB: f64 = (1u64 << 20) as f64;

/// Read the GPUs with these bus ids (sysfs spelling) that NVML lists, or
/// every GPU it lists.
pub(crate) fn read(nvml: &Nvml, bus_ids: Option<&[String]>) -> Vec<GpuNow> {
    let mut out = Vec::new();
    let count = nvml.device_count().unwrap_or(0);
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        let Ok(pci) = d.pci_info() else { continue };
        let bus_id = crate::nvml::sysfs_bus_id(&pci.bus_id);
        if bus_ids.is_some_and(|b| !b.contains(&bus_id)) {
            continue;
        }
        out.push(GpuNow {
            util_pct: d.utilization_rates().ok().map(|u| u.gpu as f64),
            mem_used_mib: d.memory_info().ok().map(|m| m.used as f64 / MIB),
            processes: d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    let mib = match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b as f64 / MIB,
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0.0,
                    };
                    (p.pid, mib)
                })
                .collect(),
            bus_id,
        });
    }
    out
}

/// Which of `roots` `pid` is, or descends from (ranks start shells, shells
/// start Python): at most 64 steps up the tree.
pub(crate) fn owner(pid: u32, roots: &[i32]) -> Option<i32> {
    let mut p = pid as i32;
    for _ in 0..64 {
        if roots.contains(&p) {
            return Some(p);
        }
        match crate::measure::process::parent(p) {
            Some(q) if q > 0 && q != p => p = q,
            _ => return None,
        }
    }
    None
}

/// What a trial's samples add up to.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuSample {
    /// Mean utilisation of the job's GPUs over the trial.
    pub util_pct: Option<f64>,
    /// Peak memory in use on the job's GPUs (summed over them; every process's).
    pub mem_mib: Option<f64>,
    /// Peak memory the job's own processes held (summed over its GPUs).
    pub job_mem_mib: Option<f64>,
    /// Other processes seen on the job's GPUs: "pid 4242 on 0000:07:00.0 (1000 MiB)".
    pub others: Vec<String>,
}

/// Samples accumulated over a trial.
#[derive(Debug, Default)]
struct Acc {
    util_sum: f64,
    util_n: u64,
    mem_peak: Option<f64>,
    job_peak: Option<f64>,
    others: BTreeMap<(u32, String), f64>,
}

impl Acc {
    fn add(&mut self, now: &[GpuNow], job: &[i32]) {
        let utils: Vec<f64> = now.iter().filter_map(|g| g.util_pct).collect();
        if !utils.is_empty() {
            self.util_sum += utils.iter().sum::<f64>() / utils.len() as f64;
            self.util_n += 1;
        }
        let mems: Vec<f64> = now.iter().filter_map(|g| g.mem_used_mib).collect();
        if !mems.is_empty() {
            let m: f64 = mems.iter().sum();
            self.mem_peak = Some(self.mem_peak.map_or(m, |p| p.max(m)));
        }
        let mut own = 0.0;
        for g in now {
            for &(pid, mib) in &g.processes {
                if owner(pid, job).is_some() {
                    own += mib;
                } else {
                    let e = self.others.entry((pid, g.bus_id.clone())).or_default();
                    *e = e.max(mib);
                }
            }
        }
        if !job.is_empty() {
            self.job_peak = Some(self.job_peak.map_or(own, |p| p.max(own)));
        }
    }
    fn finish(self) -> GpuSample {
        GpuSample {
            util_pct: (self.util_n > 0).then(|| self.util_sum / self.util_n as f64),
            mem_mib: self.mem_peak,
            job_mem_mib: self.job_peak,
            others: self
                .others
                .into_iter()
                .map(|((pid, bus), mib)| format!("pid {pid} on {bus} ({mib:.0} MiB)"))
                .collect(),
        }
    }
}

/// The ranks' pids, filled in once they have started.
pub(crate) type JobPids = Arc<Mutex<Vec<i32>>>;

pub(crate) struct GpuSampler {
    nvml: Arc<Nvml>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<GpuSample>>,
}

impl GpuSampler {
    /// None when NVML cannot be loaded or sees no GPU.
    pub(crate) fn new() -> Option<GpuSampler> {
        let nvml = crate::nvml::open().ok()?;
        if nvml.device_count().ok()? == 0 {
            return None;
        }
        Some(GpuSampler {
            nvml: Arc::new(nvml),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        })
    }

    /// Sample `gpus` (bus ids) every 100 ms until `stop`; `job` holds the
    /// ranks' pids once they run. No GPUs: nothing is sampled.
    pub(crate) fn start(&mut self, gpus: Vec<String>, job: JobPids) {
        self.stop.store(false, Ordering::Relaxed);
        if gpus.is_empty() {
            self.thread = None;
            return;
        }
        let (nvml, stop) = (self.nvml.clone(), self.stop.clone());
        self.thread = Some(std::thread::spawn(move || {
            let mut acc = Acc::default();
            while !stop.load(Ordering::Relaxed) {
                let now = read(&nvml, Some(&gpus));
                let pids = job.lock().map(|p| p.clone()).unwrap_or_default();
                acc.add(&now, &pids);
                std::thread::sleep(Duration::from_millis(100));
            }
            acc.finish()
        }));
    }

    pub(crate) fn stop(&mut self) -> GpuSample {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_and_other_processes_are_told_apart() {
        let me = std::process::id();
        let now = vec![
            GpuNow {
                bus_id: "0000:07:00.0".into(),
                util_pct: Some(60.0),
                mem_used_mib: Some(4000.0),
                processes: vec![(me, 3000.0), (u32::MAX - 1, 1000.0)],
            },
            GpuNow {
                bus_id: "0000:0f:00.0".into(),
                util_pct: Some(20.0),
                mem_used_mib: Some(1000.0),
                processes: vec![],
            },
        ];
        let mut acc = Acc::default();
        // This test's own process descends from its parent: a job root.
        let parent = crate::measure::process::parent(me as i32).unwrap();
        acc.add(&now, &[parent]);
        let s = acc.finish();
        assert_eq!(s.util_pct, Some(40.0));
        assert_eq!(s.mem_mib, Some(5000.0));
        assert_eq!(s.job_mem_mib, Some(3000.0));
        assert_eq!(
            s.others,
            vec![format!("pid {} on 0000:07:00.0 (1000 MiB)", u32::MAX - 1)]
        );
    }
}
