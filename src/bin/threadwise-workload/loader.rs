//! The workload's data: a DataLoader-like set of worker processes that make
//! each sample with CPU work and hand whole batches to the rank over a pipe
//! (prefetching as DataLoader's prefetch_factor=2 does), or the rank making
//! its batches itself with 0 workers.

use std::io::{BufReader, BufWriter, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use threadwise::workload::{floats, to_bytes};

use crate::args::Args;
use crate::{IN_CHANNELS, fail};

/// A small deterministic generator (the data and weights need no quality).
pub struct Lcg(pub u32);

impl Lcg {
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (self.0 >> 8) as f32 / (1u32 << 24) as f32
    }
}

/// One sample as a DataLoader worker would make it: a 2x-size image "decoded"
/// with `work` passes of arithmetic per value, downscaled 2x, flipped when odd.
/// Written NHWC into `out` (size*size*3 floats).
fn make_sample(index: u64, size: usize, work: usize, out: &mut [f32]) {
    let big = 2 * size;
    let mut rng = Lcg(index as u32 ^ 0x9e37_79b9);
    let mut img: Vec<f32> = (0..big * big * IN_CHANNELS)
        .map(|_| {
            let mut v = rng.next();
            for _ in 0..work {
                v = (v * v + 0.1).sqrt();
            }
            v
        })
        .collect();
    if index % 2 == 1 {
        for row in img.chunks_exact_mut(big * IN_CHANNELS) {
            for x in 0..big / 2 {
                for c in 0..IN_CHANNELS {
                    row.swap(x * IN_CHANNELS + c, (big - 1 - x) * IN_CHANNELS + c);
                }
            }
        }
    }
    let at = |y: usize, x: usize, c: usize| img[(y * big + x) * IN_CHANNELS + c];
    for y in 0..size {
        for x in 0..size {
            for c in 0..IN_CHANNELS {
                out[(y * size + x) * IN_CHANNELS + c] = 0.25
                    * (at(2 * y, 2 * x, c)
                        + at(2 * y, 2 * x + 1, c)
                        + at(2 * y + 1, 2 * x, c)
                        + at(2 * y + 1, 2 * x + 1, c));
            }
        }
    }
}

fn make_batch(index: u64, size: usize, batch: usize, work: usize) -> Vec<f32> {
    let per = size * size * IN_CHANNELS;
    let mut v = vec![0f32; per * batch];
    for (i, s) in v.chunks_exact_mut(per).enumerate() {
        make_sample(index * batch as u64 + i as u64, size, work, s);
    }
    v
}

/// A worker process's loop: batch numbers in on stdin, batches out on stdout,
/// until the rank closes the pipe.
pub fn loader_worker(argv: &[String]) -> ! {
    let num = |i: usize| argv.get(i).and_then(|v| v.parse::<usize>().ok());
    let (Some(size), Some(batch), Some(work)) = (num(0), num(1), num(2)) else {
        fail(2, "--loader-worker SIZE BATCH WORK".into())
    };
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut b = [0u8; 8];
    while input.read_exact(&mut b).is_ok() {
        let data = make_batch(u64::from_le_bytes(b), size, batch, work);
        if output
            .write_all(&to_bytes(&data))
            .and_then(|()| output.flush())
            .is_err()
        {
            break;
        }
    }
    std::process::exit(0)
}

/// Where batches come from: the rank itself, or worker processes.
pub enum Loader {
    Inline {
        size: usize,
        batch: usize,
        work: usize,
    },
    Workers {
        kids: Vec<(Child, ChildStdin, ChildStdout)>,
        bytes: usize,
    },
}

/// Batches asked for ahead per worker, as DataLoader's prefetch_factor=2.
const PREFETCH: u64 = 2;

impl Loader {
    pub fn start(a: &Args, workers: usize, first: u64, stride: u64) -> Result<Loader, String> {
        if workers == 0 {
            return Ok(Loader::Inline {
                size: a.size,
                batch: a.batch,
                work: a.loader_work,
            });
        }
        let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
        let mut kids = Vec::with_capacity(workers);
        for _ in 0..workers {
            let mut child = Command::new(&me)
                .arg("--loader-worker")
                .args([a.size, a.batch, a.loader_work].map(|v| v.to_string()))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("start a data-loader worker: {e}"))?;
            let (i, o) = (child.stdin.take(), child.stdout.take());
            kids.push((child, i.expect("piped"), o.expect("piped")));
        }
        let mut l = Loader::Workers {
            kids,
            bytes: a.size * a.size * IN_CHANNELS * a.batch * 4,
        };
        for k in 0..PREFETCH * workers as u64 {
            l.request(k, first + k * stride)?;
        }
        Ok(l)
    }

    fn request(&mut self, step: u64, index: u64) -> Result<(), String> {
        if let Loader::Workers { kids, .. } = self {
            let n = kids.len() as u64;
            let w = &mut kids[(step % n) as usize].1;
            w.write_all(&index.to_le_bytes())
                .map_err(|e| format!("a data-loader worker is gone: {e}"))?;
        }
        Ok(())
    }

    /// Batch `step` (global batch number `index`); asks for the one PREFETCH
    /// per worker ahead.
    pub fn next(&mut self, step: u64, index: u64, stride: u64) -> Result<Vec<f32>, String> {
        match self {
            Loader::Inline { size, batch, work } => Ok(make_batch(index, *size, *batch, *work)),
            Loader::Workers { kids, bytes } => {
                let n = kids.len() as u64;
                let ahead = PREFETCH * n;
                let mut raw = vec![0u8; *bytes];
                kids[(step % n) as usize]
                    .2
                    .read_exact(&mut raw)
                    .map_err(|e| format!("a data-loader worker is gone: {e}"))?;
                self.request(step + ahead, index + ahead * stride)?;
                Ok(floats(&raw).collect())
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Loader::Workers { kids, .. } = self {
            for (mut child, stdin, stdout) in kids.drain(..) {
                drop((stdin, stdout));
                let _ = child.wait();
            }
        }
    }
}
