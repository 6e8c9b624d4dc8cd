//! The cost of `top`'s sampling: 16 ranks of 50 threads each (real child
//! processes with real threads), sampled as `top` does every second. Prints
//! the CPU time one sample takes and what that is of one core at 1 s.
//!   cargo bench --bench top

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use threadwise::{Sampler, Target};

fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    if std::env::args().any(|a| a == "--child") {
        // A rank: 49 more threads, all asleep, until killed.
        for _ in 0..49 {
            std::thread::spawn(|| std::thread::sleep(Duration::from_secs(3600)));
        }
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..16)
        .map(|_| {
            Command::new(&me)
                .arg("--child")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let targets: Vec<Target> = kids
        .iter()
        .enumerate()
        .map(|(i, k)| Target {
            local_rank: i,
            pid: k.id() as i32,
            cpus: threadwise::CpuSet::parse_list("0-1").unwrap(),
            worker_cpus: Default::default(),
            mem_nodes: vec![0],
            gpu: None,
            roles: None,
            corrections: Default::default(),
        })
        .collect();
    let mut s = Sampler::new(targets);
    let threads: usize = s.sample().ranks.iter().map(|r| r.threads).sum();
    let n = 50;
    let (c0, t0) = (cpu_time(), Instant::now());
    for _ in 0..n {
        std::hint::black_box(s.sample());
    }
    let per = (cpu_time() - c0) / n;
    println!(
        "top sampling, 16 ranks x 50 threads ({threads} threads seen): {:.2} ms CPU per sample \
         ({:.2} ms wall), {:.2}% of one core at --interval 1 (context switches every 3rd sample, numa_maps every 10th)",
        per.as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64() * 1e3 / n as f64,
        per.as_secs_f64() * 100.0
    );
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}
