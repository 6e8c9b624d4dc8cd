//! The built-in training-like workload that `threadwise tune` runs when no
//! command is given: a small model of one DDP training step per iteration.
//!
//! - Compute: a small CNN (`--layers` 3x3 convolutions in four stages that halve
//!   the image and double the channels, each with batch-norm and ReLU), forward
//!   and backward, every layer an OpenMP parallel region of milliseconds on the
//!   real GNU OpenMP runtime (OMP_NUM_THREADS, OMP_PROC_BIND, OMP_WAIT_POLICY).
//!   Activations are allocated per step, as PyTorch's CPU allocator does, so
//!   the malloc in use matters.
//! - Communication: each layer's weight gradient goes into a bucket as backward
//!   reaches it; full buckets are all-reduced over TCP by a communication thread
//!   while backward continues (DDP's overlap, gloo's own thread), then the
//!   optimizer updates the weights.
//! - Data: worker processes (THREADWISE_NUM_WORKERS of them, else `--workers`,
//!   default 2, like the example's DataLoader) make each sample with CPU work
//!   (decode-like passes, a 2x downscale, a flip) and hand whole batches to the
//!   rank over a pipe, two batches ahead per worker; with 0 workers the rank
//!   makes its batches itself between steps.
//!
//! Rank 0 prints `throughput: N samples/s` over the steps after `--warmup`,
//! with the details, then the same figure as the canonical line that `tune`
//! reads before anything else: `threadwise: throughput=N samples/s`.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

mod args;
mod feeder;
mod loader;

use args::{Args, parse};
use loader::{Lcg, Loader, loader_worker};
use threadwise::workload::{Group, MAX_WORKERS, Peer};

unsafe extern "C" {
    fn tw_conv3x3(
        input: *const f32,
        w: *const f32,
        out: *mut f32,
        batch: i32,
        s: i32,
        cin: i32,
        cout: i32,
    );
    fn tw_conv3x3_gradw(
        input: *const f32,
        gout: *const f32,
        gw: *mut f32,
        batch: i32,
        s: i32,
        cin: i32,
        cout: i32,
    );
    fn tw_flip(w: *const f32, wt: *mut f32, cin: i32, cout: i32);
    fn tw_bn_stats(x: *const f32, pixels: i64, c: i32, mean: *mut f32, inv_std: *mut f32);
    fn tw_bn_apply(x: *mut f32, pixels: i64, c: i32, mean: *const f32, inv_std: *const f32);
    fn tw_relu(x: *const f32, out: *mut f32, n: i64);
    fn tw_add(x: *const f32, y: *const f32, out: *mut f32, n: i64);
    fn tw_relu_back(act: *const f32, g: *mut f32, n: i64);
    fn tw_bn_back(xhat: *const f32, g: *mut f32, pixels: i64, c: i32, inv_std: *const f32);
    fn tw_pool2(input: *const f32, out: *mut f32, batch: i32, s: i32, c: i32);
    fn tw_pool2_back(gout: *const f32, gin: *mut f32, batch: i32, s: i32, c: i32);
    fn tw_sgd(w: *mut f32, mom: *mut f32, g: *const f32, n: i64, lr: f32);
    fn tw_max_threads() -> i32;
    fn tw_set_threads(n: i32);
    fn tw_name_team();
}

/// Channels of the first stage; each later stage doubles them.
const BASE_CHANNELS: usize = 16;
/// Input channels (RGB).
const IN_CHANNELS: usize = 3;

fn fail(code: i32, msg: String) -> ! {
    threadwise::say!("threadwise-workload: {msg}");
    std::process::exit(code)
}

/// One convolution layer with its batch-norm, and what backward needs of it.
struct Layer {
    cin: usize,
    cout: usize,
    /// Image side at this layer (after the pooling before it, if any).
    s: usize,
    pool_before: bool,
    /// The second layer of a residual block adds the block's input (the
    /// previous layer's input) before its ReLU, when the shapes match.
    residual: bool,
    w: Vec<f32>,
    mom: Vec<f32>,
}

fn model(a: &Args) -> Vec<Layer> {
    let stages = a.layers.min(4);
    let mut rng = Lcg(12345);
    let (mut cin, mut s, mut stage) = (IN_CHANNELS, a.size, 0);
    (0..a.layers)
        .map(|l| {
            let k = l * stages / a.layers;
            let pool_before = k > stage && s >= 2 && s % 2 == 0;
            if k > stage {
                stage = k;
                if pool_before {
                    s /= 2;
                }
            }
            let cout = BASE_CHANNELS << stage;
            let n = 9 * cin * cout;
            let scale = (3.0 / (9 * cin) as f32).sqrt();
            let w = (0..n).map(|_| (2.0 * rng.next() - 1.0) * scale).collect();
            let layer = Layer {
                cin,
                cout,
                s,
                pool_before,
                residual: false,
                w,
                mom: vec![0.0; n],
            };
            cin = cout;
            layer
        })
        .collect::<Vec<_>>()
        .into_iter()
        .scan(None::<(usize, usize, bool)>, |prev, mut l| {
            // Blocks of two layers; the second is residual when the block
            // keeps its shape (ResNet's identity shortcut).
            if let Some((pcin, ps, ppool)) = prev.take() {
                l.residual = !ppool && !l.pool_before && pcin == l.cout && ps == l.s;
            } else {
                *prev = Some((l.cin, l.s, l.pool_before));
            }
            Some(l)
        })
        .collect()
}

/// A fresh buffer of `n` floats for a kernel's output, allocated per step as
/// PyTorch's CPU allocator hands out tensors (calloc: large ones are fresh
/// pages, so the malloc in use matters as it does there).
fn buffer(n: usize) -> Vec<f32> {
    vec![0.0; n]
}

enum Job {
    Bucket(Vec<f32>),
    Stop(bool),
}

/// The communication thread: all-reduces buckets in order, as gloo's does.
fn comm_thread(
    mut group: Group,
    jobs: mpsc::Receiver<Job>,
    done: mpsc::Sender<Result<(Vec<f32>, bool), String>>,
) {
    for job in jobs {
        let r = match job {
            Job::Bucket(mut b) => group.all_reduce(&mut b, false).map(|_| (b, false)),
            Job::Stop(stop) => group.all_reduce(&mut [0.0], stop).map(|s| (vec![], s)),
        };
        let failed = r.is_err();
        if done.send(r).is_err() || failed {
            return;
        }
    }
}

fn c(n: usize) -> i32 {
    n as i32
}

/// PyTorch (measured on torch 2.15) takes OMP_NUM_THREADS only up to the
/// machine's online CPUs: OMP_NUM_THREADS=4 on 2 CPUs gives 2 intra-op threads
/// (an explicit torch.set_num_threads(4) gives 4). The workload does the same,
/// so that `threads=4` means here what it means in a PyTorch script.
fn cap_threads_like_torch() {
    let asked = std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.split(',').next()?.trim().parse::<i64>().ok());
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if let Some(n) = asked
        && online > 0
        && n > online
    {
        // SAFETY: omp_set_num_threads with a positive count.
        unsafe { tw_set_threads(online as i32) };
    }
}

/// `THREADWISE_NUM_WORKERS` (the plan's), else `--workers`, else 2.
fn worker_count(a: &Args) -> usize {
    match std::env::var("THREADWISE_NUM_WORKERS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|w| *w as u64 <= MAX_WORKERS)
            .unwrap_or_else(|| {
                fail(
                    2,
                    format!("THREADWISE_NUM_WORKERS={v:?} is not a count up to {MAX_WORKERS}"),
                )
            }),
        Err(_) => a.workers.unwrap_or(2),
    }
}

/// Each layer's normalised output, activation and inverse deviation.
type Acts = Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>;
/// Each layer's input where it is not the previous activation (the batch,
/// or a pooled image).
type Inputs = Vec<Option<Vec<f32>>>;

/// One layer forward: conv, batch norm, the residual add, ReLU.
fn layer_forward(
    layers: &[Layer],
    i: usize,
    b: usize,
    x: &[f32],
    inputs: &Inputs,
    acts: &Acts,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let l = &layers[i];
    let pixels = b * l.s * l.s;
    let n = (pixels * l.cout) as i64;
    let mut y = buffer(pixels * l.cout);
    let mut act = buffer(pixels * l.cout);
    let (mut mean, mut inv) = (vec![0f32; l.cout], vec![0f32; l.cout]);
    // SAFETY: the buffers have the sizes the kernels index (pixels*cin,
    // 9*cin*cout, pixels*cout, cout) and cout <= the kernels' 1024.
    unsafe {
        tw_conv3x3(
            x.as_ptr(),
            l.w.as_ptr(),
            y.as_mut_ptr(),
            c(b),
            c(l.s),
            c(l.cin),
            c(l.cout),
        );
        tw_bn_stats(
            y.as_ptr(),
            pixels as i64,
            c(l.cout),
            mean.as_mut_ptr(),
            inv.as_mut_ptr(),
        );
        tw_bn_apply(
            y.as_mut_ptr(),
            pixels as i64,
            c(l.cout),
            mean.as_ptr(),
            inv.as_ptr(),
        );
    }
    if l.residual {
        // The block's input: the previous layer's input, same shape.
        let r = inputs[i - 1].as_deref().unwrap_or_else(|| &acts[i - 2].1);
        let mut z = buffer(pixels * l.cout);
        // SAFETY: y, r and z all hold pixels*cout floats.
        unsafe {
            tw_add(y.as_ptr(), r.as_ptr(), z.as_mut_ptr(), n);
            tw_relu(z.as_ptr(), act.as_mut_ptr(), n);
        }
    } else {
        // SAFETY: y and act hold pixels*cout floats.
        unsafe { tw_relu(y.as_ptr(), act.as_mut_ptr(), n) };
    }
    (y, act, inv)
}

/// Forward over every layer, keeping what backward needs.
fn forward(layers: &[Layer], a: &Args, input: Vec<f32>) -> (Acts, Inputs) {
    let b = a.batch;
    let mut acts: Acts = Vec::with_capacity(layers.len());
    let mut inputs: Inputs = Vec::with_capacity(layers.len());
    let mut first = Some(input);
    for (i, l) in layers.iter().enumerate() {
        let s_prev = if i == 0 { a.size } else { layers[i - 1].s };
        let mut own = first.take();
        if l.pool_before {
            let x = own.as_deref().unwrap_or_else(|| &acts[i - 1].1);
            let mut p = buffer(b * l.s * l.s * l.cin);
            // SAFETY: x holds b*s_prev^2*cin floats, p b*s^2*cin, s = s_prev/2.
            unsafe { tw_pool2(x.as_ptr(), p.as_mut_ptr(), c(b), c(s_prev), c(l.cin)) };
            own = Some(p);
        }
        let x = own.as_deref().unwrap_or_else(|| &acts[i - 1].1);
        let out = layer_forward(layers, i, b, x, &inputs, &acts);
        inputs.push(own);
        acts.push(out);
    }
    (acts, inputs)
}

/// The gradient of layer `i`'s input from its output's `g` (the flipped
/// kernel), the shortcut's gradient added where a residual block began,
/// un-pooled where the layer pooled.
fn input_gradient(
    layers: &[Layer],
    i: usize,
    b: usize,
    g: &[f32],
    shortcut: &mut Option<Vec<f32>>,
) -> Vec<f32> {
    let l = &layers[i];
    let pixels = b * l.s * l.s;
    let mut wt = buffer(9 * l.cin * l.cout);
    let mut gin = buffer(pixels * l.cin);
    // SAFETY: wt is the flipped 9*cin*cout kernel; gin holds pixels*cin.
    unsafe {
        tw_flip(l.w.as_ptr(), wt.as_mut_ptr(), c(l.cin), c(l.cout));
        tw_conv3x3(
            g.as_ptr(),
            wt.as_ptr(),
            gin.as_mut_ptr(),
            c(b),
            c(l.s),
            c(l.cout),
            c(l.cin),
        );
    }
    // The first layer of a residual block (the one after it stashed
    // the shortcut) takes the block's input: add the shortcut's gradient.
    if !l.residual
        && let Some(r) = shortcut.take()
    {
        // SAFETY: this layer's input is the block's input: same shape as r.
        unsafe { tw_add(gin.as_ptr(), r.as_ptr(), gin.as_mut_ptr(), gin.len() as i64) };
    }
    if !l.pool_before {
        return gin;
    }
    let up = layers[i - 1].s;
    let mut gp = buffer(b * up * up * l.cin);
    // SAFETY: gin holds b*s^2*cin floats, gp b*(2s)^2*cin.
    unsafe { tw_pool2_back(gin.as_ptr(), gp.as_mut_ptr(), c(b), c(up), c(l.cin)) };
    gp
}

/// Backward, last layer first: full buckets of weight gradients go to the
/// communication thread (`send`) while the earlier layers' are computed.
/// Returns every layer's gradient and the layers of each bucket sent.
fn backward(
    layers: &[Layer],
    a: &Args,
    acts: &Acts,
    inputs: &Inputs,
    send: &dyn Fn(Job),
) -> (Vec<Vec<f32>>, Vec<Vec<usize>>) {
    let (b, bucket_floats) = (a.batch, a.bucket_kib * 256);
    let x = &acts.last().expect("at least one layer").1;
    // The loss's gradient, made from the last activation.
    let mut g: Vec<f32> = x.iter().map(|v| v * 0.1 - 0.01).collect();
    let mut grads: Vec<Vec<f32>> = (0..layers.len()).map(|_| vec![]).collect();
    let mut bucket: Vec<f32> = Vec::with_capacity(bucket_floats);
    let mut bucket_layers: Vec<Vec<usize>> = vec![vec![]];
    // The gradient a residual block sends straight to its input, added
    // when backward reaches that input.
    let mut shortcut: Option<Vec<f32>> = None;
    for (i, l) in layers.iter().enumerate().rev() {
        let (xhat, act, inv) = &acts[i];
        let input = inputs[i].as_ref().unwrap_or_else(|| &acts[i - 1].1);
        let pixels = b * l.s * l.s;
        let mut gw = buffer(9 * l.cin * l.cout);
        // SAFETY: as forward; g holds pixels*cout floats.
        unsafe { tw_relu_back(act.as_ptr(), g.as_mut_ptr(), (pixels * l.cout) as i64) };
        if l.residual {
            shortcut = Some(g.clone());
        }
        // SAFETY: as forward.
        unsafe {
            tw_bn_back(
                xhat.as_ptr(),
                g.as_mut_ptr(),
                pixels as i64,
                c(l.cout),
                inv.as_ptr(),
            );
            tw_conv3x3_gradw(
                input.as_ptr(),
                g.as_ptr(),
                gw.as_mut_ptr(),
                c(b),
                c(l.s),
                c(l.cin),
                c(l.cout),
            );
        }
        bucket.extend_from_slice(&gw);
        bucket_layers.last_mut().expect("one open").push(i);
        grads[i] = gw;
        if bucket.len() >= bucket_floats {
            let full = std::mem::replace(&mut bucket, Vec::with_capacity(bucket_floats));
            send(Job::Bucket(full));
            bucket_layers.push(vec![]);
        }
        if i == 0 {
            break;
        }
        g = input_gradient(layers, i, b, &g, &mut shortcut);
    }
    if !bucket.is_empty() {
        send(Job::Bucket(bucket));
    } else {
        bucket_layers.pop();
    }
    (grads, bucket_layers)
}

/// Wait for every bucket, average, and step the optimizer.
fn average_and_step(
    layers: &mut [Layer],
    grads: &mut [Vec<f32>],
    buckets: &[Vec<usize>],
    world: usize,
    receive: &dyn Fn() -> (Vec<f32>, bool),
) {
    for members in buckets {
        let (reduced, _) = receive();
        let mut off = 0;
        for &i in members {
            let n = grads[i].len();
            let scale = 1.0 / world as f32;
            for (d, s) in grads[i].iter_mut().zip(&reduced[off..off + n]) {
                *d = s * scale;
            }
            off += n;
        }
    }
    for (l, gw) in layers.iter_mut().zip(grads.iter()) {
        // SAFETY: w, mom and gw all hold 9*cin*cout floats.
        unsafe {
            tw_sgd(
                l.w.as_mut_ptr(),
                l.mom.as_mut_ptr(),
                gw.as_ptr(),
                gw.len() as i64,
                1e-4,
            )
        };
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("--loader-worker") {
        loader_worker(&argv[1..]);
    }
    let a = parse(&argv).unwrap_or_else(|e| fail(2, e));
    let peer = Peer::from_env(&|k| std::env::var(k).ok()).unwrap_or_else(|e| fail(2, e));
    let workers = worker_count(&a);
    let (world, stride) = (peer.world, peer.world as u64);
    let failed = |e: String| -> ! { fail(3, format!("rank {}: {e}", peer.rank)) };
    // Workers start before any thread of this process exists.
    let mut loader =
        Loader::start(&a, workers, peer.rank as u64, stride).unwrap_or_else(|e| failed(e));
    let mut layers = model(&a);
    cap_threads_like_torch();
    // SAFETY: C functions without arguments.
    let threads = unsafe { tw_max_threads() };
    // SAFETY: likewise (it starts the OpenMP team and names it).
    unsafe { tw_name_team() };
    threadwise::say!(
        "rank {}/{}: {threads} OpenMP thread(s), {workers} data-loader worker(s)",
        peer.rank,
        world
    );
    let group = Group::join(&peer, Duration::from_secs(60)).unwrap_or_else(|e| failed(e));
    let (job_tx, job_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("tw_comm".into())
        .spawn(move || comm_thread(group, job_rx, done_tx))
        .unwrap_or_else(|e| failed(format!("the communication thread: {e}")));
    let feeder = (a.feed_us > 0).then(|| {
        feeder::Feeder::start(Duration::from_micros(a.feed_us as u64))
            .unwrap_or_else(|e| failed(format!("the feeder thread: {e}")))
    });
    let send = |job: Job| {
        if job_tx.send(job).is_err() {
            failed("the communication thread stopped".into());
        }
    };
    let receive = || -> (Vec<f32>, bool) {
        match done_rx.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => failed(e),
            Err(_) => failed("the communication thread stopped".into()),
        }
    };
    let (mut steps, mut checksum) = (0u64, 0f64);
    let mut start = Instant::now();
    loop {
        let index = steps * stride + peer.rank as u64;
        let input = loader
            .next(steps, index, stride)
            .unwrap_or_else(|e| failed(e));
        let (acts, inputs) = forward(&layers, &a, input);
        let last = &acts.last().expect("at least one layer").1;
        checksum += last.iter().take(16).map(|v| f64::from(*v)).sum::<f64>();
        let (mut grads, buckets) = backward(&layers, &a, &acts, &inputs, &send);
        drop((acts, inputs));
        average_and_step(&mut layers, &mut grads, &buckets, world, &receive);
        if steps == a.warmup as u64 {
            start = Instant::now();
            if let Some(f) = &feeder {
                f.measure();
            }
        }
        steps += 1;
        let stop =
            peer.rank == 0 && steps > a.warmup as u64 && start.elapsed().as_secs_f64() >= a.seconds;
        send(Job::Stop(stop));
        if receive().1 {
            break;
        }
    }
    drop(loader);
    let late = feeder.map(feeder::Feeder::finish).unwrap_or_default();
    if peer.rank == 0 {
        let elapsed = start.elapsed().as_secs_f64();
        let counted = steps - a.warmup as u64;
        let samples = (counted as usize * a.batch * world) as f64;
        println!(
            "throughput: {:.1} samples/s (world {world}, {threads} OpenMP threads and {workers} \
             data-loader workers per rank, {counted} steps in {elapsed:.2} s, checksum {:.3})",
            samples / elapsed,
            checksum.fract()
        );
        println!(
            "{}{:.1} samples/s",
            threadwise::THROUGHPUT_LINE,
            samples / elapsed
        );
        if let (Some(p50), Some(p99)) =
            (feeder::quantile(&late, 0.5), feeder::quantile(&late, 0.99))
        {
            println!(
                "feeder: woke {p50} us late at the median, {p99} us at p99 ({} wake-ups, every {} us)",
                late.len(),
                a.feed_us
            );
            println!("{}feeder_p50_us={p50}", threadwise::FIGURE_LINE);
            println!("{}feeder_p99_us={p99}", threadwise::FIGURE_LINE);
        }
    }
}
