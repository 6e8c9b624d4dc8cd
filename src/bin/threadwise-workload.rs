//! The built-in training-like workload that `threadwise tune` runs when no
//! command is given: N ranks (started by `threadwise run`), each step a series
//! of OpenMP parallel regions (the real GNU OpenMP runtime, honouring
//! OMP_NUM_THREADS, OMP_PROC_BIND, OMP_WAIT_POLICY) then an all-reduce across
//! ranks over TCP, like DDP; rank 0 prints `throughput: N samples/s`.

use std::time::{Duration, Instant};

use threadwise::workload::{Group, MAX_BATCH, MAX_LAYERS, MAX_LOADER_WORK, MAX_SIZE, Peer};

unsafe extern "C" {
    fn tw_forward(w: *const f32, x: *mut f32, y: *mut f32, n: i32, batch: i32, regions: i32)
    -> f64;
    fn tw_fill(g: *mut f32, len: i64, v: f32);
    fn tw_max_threads() -> i32;
}

struct Args {
    seconds: f64,
    size: usize,
    batch: usize,
    layers: usize,
    grad_kib: usize,
    warmup: usize,
    loader_work: usize,
}

const USAGE: &str = "threadwise-workload [--seconds 2] [--size 192] [--batch 8] [--layers 8] [--grad-kib 256] [--warmup 3] [--loader-work 0]";

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seconds: 2.0,
        size: 192,
        batch: 8,
        layers: 8,
        grad_kib: 256,
        warmup: 3,
        loader_work: 0,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v >= 0.0 && v.is_finite())
            .ok_or_else(|| format!("{flag} needs a number >= 0"))?;
        match flag.as_str() {
            "--seconds" => a.seconds = value,
            "--size" => a.size = value as usize,
            "--batch" => a.batch = value as usize,
            "--layers" => a.layers = value as usize,
            "--grad-kib" => a.grad_kib = value as usize,
            "--warmup" => a.warmup = value as usize,
            "--loader-work" => a.loader_work = value as usize,
            other => return Err(format!("unknown option {other:?}; usage: {USAGE}")),
        }
    }
    let within = |v: usize, lo: u64, hi: u64| (lo..=hi).contains(&(v as u64));
    if !(within(a.size, 1, MAX_SIZE)
        && within(a.batch, 1, MAX_BATCH)
        && within(a.layers, 1, MAX_LAYERS)
        && within(a.loader_work, 0, MAX_LOADER_WORK)
        && within(a.grad_kib, 0, 1 << 20))
    {
        return Err(format!(
            "sizes out of range (1 <= size <= {MAX_SIZE}, 1 <= batch <= {MAX_BATCH}, \
             1 <= layers <= {MAX_LAYERS}, loader-work <= {MAX_LOADER_WORK}, grad-kib <= 1048576)"
        ));
    }
    Ok(a)
}

fn fail(code: i32, msg: String) -> ! {
    threadwise::say!("threadwise-workload: {msg}");
    std::process::exit(code)
}

fn main() {
    let a = parse().unwrap_or_else(|e| fail(2, e));
    let peer = Peer::from_env(&|k| std::env::var(k).ok()).unwrap_or_else(|e| fail(2, e));
    let (n, b) = (a.size, a.batch);
    let w: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut x: Vec<f32> = (0..n * b).map(|i| (i % 13) as f32 / 13.0).collect();
    let mut y = vec![0f32; n * b];
    let mut grad = vec![0f32; a.grad_kib * 256];
    // SAFETY: a C function without arguments.
    let threads = unsafe { tw_max_threads() };
    threadwise::say!(
        "rank {}/{}: {threads} OpenMP thread(s)",
        peer.rank,
        peer.world
    );
    let mut group = Group::join(&peer, Duration::from_secs(60))
        .unwrap_or_else(|e| fail(3, format!("rank {}: {e}", peer.rank)));
    // A data-loader thread prepares the next batches while the step computes
    // (like DataLoader workers): real CPU work per sample, two batches ahead.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<f32>>(2);
    let (len, work) = (n * b, a.loader_work);
    let loader = (work > 0).then_some(rx);
    std::thread::spawn(move || {
        if work == 0 {
            return;
        }
        let mut seed = 1u32;
        loop {
            let batch: Vec<f32> = (0..len)
                .map(|i| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let mut v = (seed >> 8) as f32 / (1u32 << 24) as f32 + (i % 3) as f32;
                    for _ in 0..work {
                        v = (v * v + 0.1).sqrt();
                    }
                    v
                })
                .collect();
            if tx.send(batch).is_err() {
                return;
            }
        }
    });
    let mut steps = 0usize;
    let mut start = Instant::now();
    let mut checksum = 0.0;
    loop {
        if let Some(Ok(batch)) = loader.as_ref().map(|rx| rx.recv()) {
            x.copy_from_slice(&batch);
        }
        // SAFETY: the buffers hold n*n, n*b, n*b and grad.len() floats, as the C code reads.
        unsafe {
            checksum += tw_forward(
                w.as_ptr(),
                x.as_mut_ptr(),
                y.as_mut_ptr(),
                n as i32,
                b as i32,
                a.layers as i32,
            );
            tw_fill(grad.as_mut_ptr(), grad.len() as i64, 1.0);
        }
        if steps == a.warmup {
            start = Instant::now();
        }
        steps += 1;
        let stop = peer.rank == 0 && steps > a.warmup && start.elapsed().as_secs_f64() >= a.seconds;
        match group.all_reduce(&mut grad, stop) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => fail(3, format!("rank {}: {e}", peer.rank)),
        }
    }
    if peer.rank == 0 {
        let elapsed = start.elapsed().as_secs_f64();
        let counted = steps - a.warmup;
        let samples = (counted * b * peer.world) as f64;
        println!(
            "throughput: {:.1} samples/s (world {}, {threads} OpenMP threads per rank, {counted} steps in {elapsed:.2} s, checksum {:.3})",
            samples / elapsed,
            peer.world,
            checksum.fract()
        );
    }
}
