//! The workload's options: `threadwise-workload --help`.

use threadwise::workload::{
    MAX_BATCH, MAX_BYTES, MAX_LAYERS, MAX_LOADER_WORK, MAX_SIZE, MAX_WORKERS,
};

pub(crate) struct Args {
    pub(crate) seconds: f64,
    pub(crate) size: usize,
    pub(crate) batch: usize,
    pub(crate) layers: usize,
    pub(crate) bucket_kib: usize,
    pub(crate) warmup: usize,
    pub(crate) loader_work: usize,
    pub(crate) workers: Option<usize>,
    /// The feeder's period (0: none).
    pub(crate) feed_us: usize,
}

const USAGE: &str = "threadwise-workload [--seconds 1.5] [--size 16] [--batch 16] [--layers 8] \
                     [--bucket-kib 256] [--warmup 2] [--loader-work 40] [--workers N] \
                     [--feed-us 1000]";

pub(crate) fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        seconds: 1.5,
        size: 16,
        batch: 16,
        layers: 8,
        bucket_kib: 256,
        warmup: 2,
        loader_work: 40,
        workers: None,
        feed_us: 1000,
    };
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
            "--bucket-kib" => a.bucket_kib = value as usize,
            "--warmup" => a.warmup = value as usize,
            "--loader-work" => a.loader_work = value as usize,
            "--workers" => a.workers = Some(value as usize),
            "--feed-us" => a.feed_us = value as usize,
            other => return Err(format!("unknown option {other:?}; usage: {USAGE}")),
        }
    }
    let within = |v: usize, lo: u64, hi: u64| (lo..=hi).contains(&(v as u64));
    if !(within(a.size, 1, MAX_SIZE)
        && within(a.batch, 1, MAX_BATCH)
        && within(a.layers, 1, MAX_LAYERS)
        && within(a.loader_work, 0, MAX_LOADER_WORK)
        && within(a.bucket_kib, 1, 1 << 20)
        && within(a.feed_us, 0, 1_000_000)
        && a.workers.is_none_or(|w| within(w, 0, MAX_WORKERS)))
    {
        return Err(format!(
            "sizes out of range (1 <= size <= {MAX_SIZE}, 1 <= batch <= {MAX_BATCH}, \
             1 <= layers <= {MAX_LAYERS}, loader-work <= {MAX_LOADER_WORK}, \
             1 <= bucket-kib <= 1048576, workers <= {MAX_WORKERS}, feed-us <= 1000000)"
        ));
    }
    if let Some(mib) = threadwise::workload::activations_too_big(a.size, a.batch, a.layers) {
        return Err(format!(
            "--size {} --batch {} --layers {} would hold {mib} MiB of activations per rank \
             (at most {} MiB): make them smaller",
            a.size,
            a.batch,
            a.layers,
            MAX_BYTES >> 20
        ));
    }
    Ok(a)
}
