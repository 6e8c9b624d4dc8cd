//! The built-in training-like workload's communication: ranks (started by
//! `threadwise run` with the torchrun environment) meet at MASTER_ADDR:MASTER_PORT,
//! and after each step rank 0 sums every rank's gradient buffer and sends the
//! sum back, like DDP's all-reduce over gloo. The compute is OpenMP C code
//! linked into the `threadwise-workload` binary; this module is plain Rust.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The workload's size limits, shared by its own options and `tune --work-*`.
pub const MAX_SIZE: u64 = 1024;
pub const MAX_BATCH: u64 = 4096;
pub const MAX_LAYERS: u64 = 64;
pub const MAX_LOADER_WORK: u64 = 1_000_000;
pub const MAX_WORKERS: u64 = 64;
/// The most activation memory a rank may hold (checked before it starts).
pub const MAX_BYTES: u64 = 4 << 30;

/// An upper bound on one rank's activation bytes: the first stage's image
/// (16 channels, NHWC f32) kept twice (input and output) per layer.
fn activation_bytes(size: usize, batch: usize, layers: usize) -> u64 {
    (size as u64)
        .saturating_mul(size as u64)
        .saturating_mul(batch as u64)
        .saturating_mul(16 * 4 * 2)
        .saturating_mul(layers as u64)
}

/// The activation MiB a rank would hold, when that is over MAX_BYTES: checked
/// by the workload itself and by `tune --work-*` before any trial starts.
pub fn activations_too_big(size: usize, batch: usize, layers: usize) -> Option<u64> {
    let bytes = activation_bytes(size, batch, layers);
    (bytes > MAX_BYTES).then_some(bytes >> 20)
}

/// Floats as the little-endian bytes the workload's pipes and sockets carry.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes back to floats (a trailing partial float is ignored).
pub fn floats(raw: &[u8]) -> impl Iterator<Item = f32> + '_ {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// One rank's place in the job, from the torchrun variables.
#[derive(Debug, Clone)]
pub struct Peer {
    pub rank: usize,
    pub world: usize,
    pub addr: String,
    pub port: u16,
}

impl Peer {
    /// Read RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a lone run is rank 0 of 1).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Peer, String> {
        let num = |k: &str, d: usize| -> Result<usize, String> {
            get(k).map_or(Ok(d), |v| {
                v.parse().map_err(|_| format!("{k}={v:?} is not a number"))
            })
        };
        let world = num("WORLD_SIZE", 1)?;
        let rank = num("RANK", 0)?;
        if world == 0 || rank >= world {
            return Err(format!("RANK {rank} is not below WORLD_SIZE {world}"));
        }
        let port = num("MASTER_PORT", 0)?;
        if world > 1 && port == 0 {
            return Err(
                "MASTER_PORT is needed when WORLD_SIZE > 1 (run it with threadwise run)".into(),
            );
        }
        Ok(Peer {
            rank,
            world,
            addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            port: u16::try_from(port).map_err(|_| format!("MASTER_PORT {port} is not a port"))?,
        })
    }
}

/// The all-reduce group: rank 0 holds one stream per other rank.
pub enum Group {
    Alone,
    Root(Vec<TcpStream>),
    Member(TcpStream),
}

fn io(e: std::io::Error, what: &str) -> String {
    format!("{what}: {e}")
}

impl Group {
    /// Meet the other ranks (members retry for up to `patience`).
    pub fn join(p: &Peer, patience: Duration) -> Result<Group, String> {
        if p.world == 1 {
            return Ok(Group::Alone);
        }
        if p.rank == 0 {
            let l = TcpListener::bind((p.addr.as_str(), p.port)).map_err(|e| io(e, "listen"))?;
            let mut streams: Vec<Option<TcpStream>> = (1..p.world).map(|_| None).collect();
            for _ in 1..p.world {
                let (mut s, _) = l.accept().map_err(|e| io(e, "accept"))?;
                s.set_nodelay(true).ok();
                let mut b = [0u8; 4];
                s.read_exact(&mut b).map_err(|e| io(e, "hello"))?;
                let r = u32::from_le_bytes(b) as usize;
                if r == 0 || r >= p.world || streams[r - 1].is_some() {
                    return Err(format!("unexpected peer rank {r}"));
                }
                streams[r - 1] = Some(s);
            }
            return Ok(Group::Root(streams.into_iter().flatten().collect()));
        }
        let start = Instant::now();
        loop {
            match TcpStream::connect((p.addr.as_str(), p.port)) {
                Ok(mut s) => {
                    s.set_nodelay(true).ok();
                    s.write_all(&(p.rank as u32).to_le_bytes())
                        .map_err(|e| io(e, "hello"))?;
                    return Ok(Group::Member(s));
                }
                Err(e) if start.elapsed() < patience => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io(e, "connect to rank 0")),
            }
        }
    }

    /// Sum `buf` over all ranks in place; rank 0 also decides `stop` for all.
    pub fn all_reduce(&mut self, buf: &mut [f32], stop: bool) -> Result<bool, String> {
        match self {
            Group::Alone => Ok(stop),
            Group::Root(streams) => {
                let mut raw = vec![0u8; buf.len() * 4];
                for s in streams.iter_mut() {
                    s.read_exact(&mut raw).map_err(|e| io(e, "receive"))?;
                    for (x, v) in buf.iter_mut().zip(floats(&raw)) {
                        *x += v;
                    }
                }
                let mut msg = vec![u8::from(stop)];
                msg.extend(to_bytes(buf));
                for s in streams.iter_mut() {
                    s.write_all(&msg).map_err(|e| io(e, "send"))?;
                }
                Ok(stop)
            }
            Group::Member(s) => {
                s.write_all(&to_bytes(buf)).map_err(|e| io(e, "send"))?;
                let mut msg = vec![0u8; 1 + buf.len() * 4];
                s.read_exact(&mut msg).map_err(|e| io(e, "receive"))?;
                for (x, v) in buf.iter_mut().zip(floats(&msg[1..])) {
                    *x = v;
                }
                Ok(msg[0] != 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_ranks_reduce_and_stop_together() {
        let port = crate::launch::env::free_port().unwrap();
        let peers: Vec<Peer> = (0..3)
            .map(|rank| Peer {
                rank,
                world: 3,
                addr: "127.0.0.1".into(),
                port,
            })
            .collect();
        let handles: Vec<_> = peers
            .into_iter()
            .map(|p| {
                std::thread::spawn(move || {
                    let mut g = Group::join(&p, Duration::from_secs(5)).unwrap();
                    let mut buf = vec![p.rank as f32 + 1.0; 4];
                    let stop = g.all_reduce(&mut buf, p.rank == 0).unwrap();
                    (buf, stop)
                })
            })
            .collect();
        for h in handles {
            let (buf, stop) = h.join().unwrap();
            assert_eq!(buf, vec![6.0; 4]);
            assert!(stop, "rank 0's decision reaches everyone");
        }
    }

    #[test]
    fn peer_from_env_errors() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(a, _)| *a == k)
                    .map(|(_, b)| b.to_string())
            }
        };
        assert_eq!(Peer::from_env(&env(&[])).unwrap().world, 1);
        assert!(
            Peer::from_env(&env(&[("WORLD_SIZE", "2"), ("RANK", "1")]))
                .unwrap_err()
                .contains("MASTER_PORT")
        );
        assert!(Peer::from_env(&env(&[("WORLD_SIZE", "2"), ("RANK", "2")])).is_err());
    }
}
