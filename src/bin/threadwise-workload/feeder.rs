//! The feeder: a latency-critical loop like a training script's kernel-launch
//! loop (the thread that must wake on time to hand the GPU its next work). It
//! sleeps to a deadline every period and records how late each wake-up came:
//! what a compute team spinning on the same cores (or a role layout keeping
//! them off its core) does to the thread that feeds the device. Named
//! `tw_feeder` (threadwise reads it as a main-thread role: it belongs with
//! the service threads).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// At most this many wake-ups are kept (a 1 ms feeder over 10 minutes).
const MAX_SAMPLES: usize = 600_000;

pub(crate) struct Feeder {
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<u32>>,
}

impl Feeder {
    /// Start a feeder waking every `period`; nothing is recorded until
    /// `measure`.
    pub(crate) fn start(period: Duration) -> std::io::Result<Feeder> {
        let (measuring, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (m, s) = (measuring.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tw_feeder".into())
            .spawn(move || {
                let mut late = Vec::new();
                let mut next = Instant::now() + period;
                while !s.load(Ordering::Relaxed) {
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    let now = Instant::now();
                    if m.load(Ordering::Relaxed) && late.len() < MAX_SAMPLES {
                        late.push(now.saturating_duration_since(next).as_micros() as u32);
                    }
                    // The next deadline on the period's grid; one missed
                    // entirely is skipped, not run back to back.
                    next += period;
                    while next <= now {
                        next += period;
                    }
                }
                late
            })?;
        Ok(Feeder {
            measuring,
            stop,
            thread,
        })
    }

    /// Record from now on (after the warm-up steps).
    pub(crate) fn measure(&self) {
        self.measuring.store(true, Ordering::Relaxed);
    }

    /// Stop it: its wake-up delays in microseconds, sorted.
    pub(crate) fn finish(self) -> Vec<u32> {
        self.stop.store(true, Ordering::Relaxed);
        let mut v = self.thread.join().unwrap_or_default();
        v.sort_unstable();
        v
    }
}

/// The `q` quantile (0-1) of sorted `v`, nearest rank.
pub(crate) fn quantile(v: &[u32], q: f64) -> Option<u32> {
    if v.is_empty() {
        return None;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_feeder_records_only_while_measuring() {
        let f = Feeder::start(Duration::from_millis(1)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        f.measure();
        std::thread::sleep(Duration::from_millis(50));
        let v = f.finish();
        assert!((10..=60).contains(&v.len()), "{}", v.len());
    }
}
