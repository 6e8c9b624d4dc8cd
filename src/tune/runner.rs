//! The real trial runner: plan each configuration on this machine once, run
//! its ranks through the job's trial entry point (`job::trial`: output
//! captured, not shown; the pids and lines as events), and turn the ranks'
//! wait4 figures and the NVML samples into a `TrialOutcome`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::trial::Used;
use super::{LaunchKey, TrialOutcome, TuneConfig};
use crate::error::Hinted;
use crate::job::trial::{self, Trial};
use crate::job::{Event, Reporter};
use crate::measure::gpu::{GpuSampler, JobPids};
use crate::measure::proc::{ProcReader, ticks_per_second};
use crate::measure::throughput::{Hit, Metric};
use crate::plan::{Facts, Plan, plan};
use crate::topology::Topology;

pub(crate) struct Runner {
    pub topology: Topology,
    pub facts: Facts,
    pub argv: Vec<OsString>,
    pub timeout: Duration,
    pub grace: Duration,
    pub gpu: Option<GpuSampler>,
    /// Each configuration's plan, made once (by name: names are unique).
    plans: Mutex<HashMap<String, Result<Plan, String>>>,
}

impl Runner {
    pub(crate) fn new(
        topology: Topology,
        facts: Facts,
        argv: Vec<OsString>,
        timeout: Duration,
        grace: Duration,
        gpu: Option<GpuSampler>,
    ) -> Runner {
        Runner {
            topology,
            facts,
            argv,
            timeout,
            grace,
            gpu,
            plans: Mutex::default(),
        }
    }

    /// The configuration's plan, from the cache after the first time.
    fn plan_of(&self, c: &TuneConfig) -> Result<Plan, String> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans
            .entry(c.name.clone())
            .or_insert_with(|| {
                plan(&self.topology, &c.request, &self.facts)
                    .map_err(|e| format!("{e} ({})", e.hint()))
            })
            .clone()
    }
}

/// What a trial's runner hears of its ranks: their pids (for the GPU
/// sampler) and their lines, read by the metric as they arrive: nothing but
/// the last hit is kept, however much the ranks print.
struct Hears {
    metric: Metric,
    hit: Arc<Mutex<Option<Hit>>>,
    /// Global rank 0's figure lines, the last of each name.
    figures: Mutex<std::collections::BTreeMap<String, f64>>,
    pids: JobPids,
}

impl Reporter for Hears {
    fn event(&self, e: &Event<'_>) {
        match e {
            Event::Started { ranks, .. } => {
                if let Ok(mut v) = self.pids.lock() {
                    *v = ranks.iter().map(|(_, p)| *p).collect();
                }
            }
            Event::Line { rank, line } => {
                if let Some(found) = self.metric.scan(*rank, line) {
                    found.keep_in(&self.hit);
                }
                if let Some((name, v)) = crate::measure::rates::figure(line).filter(|_| *rank == 0)
                {
                    let mut f = self.figures.lock().unwrap_or_else(|e| e.into_inner());
                    // Bounded: a client printing ever new names keeps 64.
                    if f.len() < 64 || f.contains_key(name) {
                        f.insert(name.to_string(), v);
                    }
                }
            }
            _ => {}
        }
    }

    fn lines(&self) -> bool {
        true
    }
}

impl super::TrialRunner for Runner {
    fn launch_key(&self, c: &TuneConfig) -> Option<LaunchKey> {
        let p = self.plan_of(c).ok()?;
        Some(trial::launch_key(&p, &self.argv))
    }

    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let launches = match self
            .plan_of(c)
            .and_then(|p| trial::launches(&p, &self.argv))
        {
            Ok(l) => l,
            Err(e) => return TrialOutcome::not_started(e),
        };
        // The GPUs the configuration's ranks use, and their pids once started.
        let gpus = self.plan_of(c).map(|p| p.gpus()).unwrap_or_default();
        let job: JobPids = Arc::default();
        let hears = Arc::new(Hears {
            metric: metric.clone(),
            hit: Arc::default(),
            figures: Mutex::default(),
            pids: job.clone(),
        });
        let t = Trial {
            launches: &launches,
            grace: self.grace,
            timeout: self.timeout,
            move_workers: true,
            prefix: true,
        };
        if let Some(g) = &mut self.gpu {
            g.start(gpus, job);
        }
        let mut proc = ProcReader::new("/");
        let before = proc.system();
        let outcome = trial::run(&t, hears.clone());
        let after = proc.system();
        let gpu = self.gpu.as_mut().map(GpuSampler::stop);
        let o = match outcome {
            Ok(o) => o,
            Err(e) => return TrialOutcome::not_started(e.to_string()),
        };
        let hit = hears.hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut t = TrialOutcome::of(&o, hit, Used::of_ranks(&o));
        t.figures = std::mem::take(&mut *hears.figures.lock().unwrap_or_else(|e| e.into_inner()));
        // What else the machine did meanwhile: its busy time less the job's
        // own (ranks and their waited-for children; our supervisor's few ms
        // count as outside), and what the hypervisor stole.
        // /proc/stat counts in clock ticks: a trial shorter than 100 ticks of
        // the budget is too short to say what share went elsewhere.
        let ticks = o.wall.as_secs_f64() * ticks_per_second() * self.topology.cpu_budget;
        let (outside, steal) = match (before, after) {
            (Some(b), Some(a)) if ticks >= 100.0 => {
                let (busy, steal) = b.since(a);
                (
                    Some(Duration::from_secs_f64(
                        (busy - t.cpu.as_secs_f64()).max(0.0),
                    )),
                    Some(Duration::from_secs_f64(steal)),
                )
            }
            _ => (None, None),
        };
        t.gpu_util_pct = gpu.as_ref().and_then(|g| g.util_pct);
        t.gpu_mem_mib = gpu.as_ref().and_then(|g| g.mem_mib);
        t.gpu_job_mem_mib = gpu.as_ref().and_then(|g| g.job_mem_mib);
        t.gpu_others = gpu.map(|g| g.others).unwrap_or_default();
        t.outside_cpu = outside;
        t.steal = steal;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanRequest;
    use crate::topology::synthetic;
    use crate::tune::TrialRunner;
    use crate::tune::grid::expand;

    /// What each trial launches sizes every pool to the configuration's
    /// threads, and the "unset" baseline leaves them all to the runtimes.
    #[test]
    fn each_trials_launch_sizes_the_pools_to_its_threads() {
        let t = synthetic::parse("core:8").unwrap();
        let base = PlanRequest {
            nproc: crate::plan::NProc::Count(2),
            ..PlanRequest::default()
        };
        let configs = expand(&base, &["threads=1,2,4".into()]).unwrap();
        let r = Runner::new(
            t,
            Facts::default(),
            vec!["true".into()],
            Duration::from_secs(1),
            Duration::ZERO,
            None,
        );
        for c in &configs {
            let key = r.launch_key(c).unwrap();
            for l in &key {
                let get = |k: &str| l.env.get(k).map(String::as_str);
                match c.request.threads {
                    crate::plan::Amount::Fixed(n) => {
                        let n = n.to_string();
                        assert_eq!(get("OMP_NUM_THREADS"), Some(n.as_str()), "{}", c.name);
                        assert_eq!(
                            get("TORCHINDUCTOR_COMPILE_THREADS"),
                            Some(n.as_str()),
                            "{}",
                            c.name
                        );
                        assert_eq!(
                            get("THREADWISE_NUM_INTEROP_THREADS"),
                            Some(n.as_str()),
                            "{}",
                            c.name
                        );
                    }
                    crate::plan::Amount::Auto => {
                        assert_eq!(c.name, "unset");
                        for k in [
                            "OMP_NUM_THREADS",
                            "TORCHINDUCTOR_COMPILE_THREADS",
                            "THREADWISE_NUM_INTEROP_THREADS",
                        ] {
                            assert_eq!(get(k), None, "{k}");
                            assert!(l.env_remove.iter().any(|v| v == k), "{k} not removed");
                        }
                    }
                }
            }
        }
    }
}
