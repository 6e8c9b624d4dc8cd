//! NVML sampling in a background thread while a trial runs: mean utilisation
//! and peak memory over all visible GPUs. NVML is loaded at run time; when it
//! does not load (no driver, no GPU) there is no sampler and reports say n/a.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Nvml;

#[derive(Debug, Clone, Copy, Default)]
pub struct GpuSample {
    pub util_pct: Option<f64>,
    pub mem_mib: Option<f64>,
}

pub struct GpuSampler {
    nvml: Arc<Nvml>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<GpuSample>>,
}

impl GpuSampler {
    /// None when NVML cannot be loaded or sees no GPU.
    pub fn new() -> Option<GpuSampler> {
        let nvml = Nvml::init().ok()?;
        if nvml.device_count().ok()? == 0 {
            return None;
        }
        Some(GpuSampler {
            nvml: Arc::new(nvml),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        })
    }

    pub fn start(&mut self) {
        self.stop.store(false, Ordering::Relaxed);
        let (nvml, stop) = (self.nvml.clone(), self.stop.clone());
        self.thread = Some(std::thread::spawn(move || {
            let (mut sum, mut n, mut peak) = (0.0, 0u64, 0u64);
            let count = nvml.device_count().unwrap_or(0);
            while !stop.load(Ordering::Relaxed) {
                for i in 0..count {
                    if let Ok(d) = nvml.device_by_index(i) {
                        if let Ok(u) = d.utilization_rates() {
                            sum += u.gpu as f64;
                            n += 1;
                        }
                        if let Ok(m) = d.memory_info() {
                            peak = peak.max(m.used);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            GpuSample {
                util_pct: (n > 0).then(|| sum / n as f64),
                mem_mib: (peak > 0).then(|| peak as f64 / (1 << 20) as f64),
            }
        }));
    }

    pub fn stop(&mut self) -> GpuSample {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}
