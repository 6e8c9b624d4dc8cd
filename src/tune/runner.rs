//! The real trial runner: plan each configuration on this machine once, launch
//! its ranks with `launch::supervise` (output captured, not shown), and turn the
//! ranks' wait4 figures and the NVML samples into a `TrialOutcome`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::trial::Used;
use super::{LaunchKey, TrialOutcome, TuneConfig};
use crate::launch::output::{LineSink, OutputOptions};
use crate::launch::supervise::{self, RunOptions, Spawned};
use crate::launch::{RankLaunch, node_launches, plan_launches};
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

    fn launches(&self, c: &TuneConfig) -> Result<Vec<RankLaunch>, String> {
        let p = self.plan_of(c)?;
        let ls = node_launches(
            &p,
            &self.argv,
            "127.0.0.1",
            None,
            crate::launch::env::DEFAULT_ROLE,
        )
        .map_err(|e| e.to_string())?;
        let mut ls = ls;
        crate::launch::prepare::check_bindings(&mut ls, false).map_err(|e| e.to_string())?;
        Ok(ls)
    }
}

impl super::TrialRunner for Runner {
    fn launch_key(&self, c: &TuneConfig) -> Option<LaunchKey> {
        let p = self.plan_of(c).ok()?;
        // A fixed job: the port and run id differ between any two launches.
        let job = crate::launch::env::Job::single(p.nproc, "127.0.0.1", 0, String::new());
        Some(plan_launches(&p, &self.argv, &job))
    }

    fn run(&mut self, c: &TuneConfig, metric: &Metric) -> TrialOutcome {
        let launches = match self.launches(c) {
            Ok(l) => l,
            Err(e) => return TrialOutcome::not_started(e),
        };
        // The metric is applied as lines arrive: nothing but the last hit
        // and the stderr tails is kept, however much the ranks print.
        let hit: Arc<Mutex<Option<Hit>>> = Arc::default();
        let (m, h) = (metric.clone(), hit.clone());
        let sink: LineSink = Arc::new(move |rank, line| {
            if let Some(found) = m.scan(rank, line) {
                found.keep_in(&h);
            }
        });
        // The GPUs the configuration's ranks use, and their pids once started.
        let gpus = self.plan_of(c).map(|p| p.gpus()).unwrap_or_default();
        let job: JobPids = Arc::default();
        let j = job.clone();
        let on_spawned = Spawned(Arc::new(move |pids: &[(usize, i32)]| {
            if let Ok(mut v) = j.lock() {
                *v = pids.iter().map(|(_, p)| *p).collect();
            }
        }));
        let opts = RunOptions {
            grace: self.grace,
            timeout: Some(self.timeout),
            output: OutputOptions {
                rank_base: 0,
                prefix_of: None,
                duplicate: [None, None],
                prefix: true,
                show: Some(vec![]),
                sink: Some(sink),
            },
            log_dir: None,
            on_spawned: Some(on_spawned),
            move_workers: true,
            peer: None,
        };
        if let Some(g) = &mut self.gpu {
            g.start(gpus, job);
        }
        let mut proc = ProcReader::new("/");
        let before = proc.system();
        let outcome = supervise::run(&launches, &opts);
        let after = proc.system();
        let gpu = self.gpu.as_mut().map(GpuSampler::stop);
        let o = match outcome {
            Ok(o) => o,
            Err(e) => return TrialOutcome::not_started(e.to_string()),
        };
        let hit = hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut t = TrialOutcome::of(&o, hit, Used::of_ranks(&o));
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
