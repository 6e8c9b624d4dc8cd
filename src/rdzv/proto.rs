//! What node agents and the rendezvous host say to each other: one JSON
//! object per line over TCP, so a session can be read with `nc` and a
//! mismatched peer fails on a readable line, not on bytes. Once a job that
//! authenticates is through the door, every line carries after its JSON the
//! HMAC-SHA256 of its direction, its sequence number (counted by both ends,
//! as TLS does, not sent) and its text, under a key only the two ends know
//! (`auth::Key`): nothing can be changed, injected, dropped, replayed,
//! reordered or reflected on the connection without the receiver finding out
//! and closing it (`Seal`).

use std::io::{BufRead, Write};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::auth::Key;
use crate::measure::throughput::Hit;

pub(crate) use super::auth::PROTOCOL;

/// The longest line read before a peer has authenticated.
pub(crate) const MAX_DOOR_LINE: usize = 8 << 10;

/// The longest line read from a peer through the door.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// A node asking to join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub host: String,
    /// Ranks it runs.
    pub nproc: usize,
    /// The most nodes of the job (`--nnodes N`, or MAX of `MIN:MAX`).
    pub nnodes: usize,
    /// The fewest (MIN of `--nnodes MIN:MAX`; 0 for a fixed `--nnodes N`).
    #[serde(default)]
    pub min_nodes: usize,
    /// The node rank it was given (--node-rank), if any.
    pub node_rank: Option<usize>,
    pub run_id: String,
    /// It runs the rendezvous host (node 0 unless ranks were given).
    pub hosting: bool,
    /// A port free on it: MASTER_PORT should it be node 0.
    pub port: u16,
    /// How it authenticates (`auth::Auth::mode`): none, secret or munge.
    #[serde(default)]
    pub auth: String,
    /// Its fresh nonce, for the host's proof.
    #[serde(default)]
    pub nonce: String,
    /// The address it gives the others (--local-addr), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Its ticket for the door, where the job has a secret
    /// (`auth::Auth::ticket`): checked before anything costly, it keeps the
    /// node's place at the door against a flood.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ticket: String,
}

/// How a node's part of a round went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub round: u32,
    /// The root-cause line: host, rank, pid, signal or code.
    pub cause: String,
    /// The job's exit code (the failing rank's own).
    pub code: i32,
    /// A rank failed (a restart may follow); not a user's signal.
    pub restartable: bool,
}

/// Where a node stands in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Start {
    /// The round: 0, then one more for every restart and membership change.
    pub round: u32,
    /// Restarts counted against --max-restarts so far (a node joining an
    /// elastic job restarts the ranks without counting, as under torchrun):
    /// the ranks' TORCHELASTIC_RESTART_COUNT.
    #[serde(default)]
    pub restarts: u32,
    pub node_rank: usize,
    pub nnodes: usize,
    pub rank_offset: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub max_restarts: u32,
    /// Every node's host name, by node rank.
    pub hosts: Vec<String>,
}

pub(crate) use crate::measure::usage::NodeUsage;

/// What a node reports of a round for `tune --nnodes` (`run --report-node`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    pub usage: NodeUsage,
    /// The throughput global rank 0 printed, on the node that ran it.
    pub hit: Option<Hit>,
}

/// Node to rendezvous host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum ToHost {
    Hello {
        protocol: String,
        hello: Hello,
    },
    Beat,
    /// The agent's proof, answering the host's challenge.
    Proof {
        proof: String,
    },
    Failed(Failure),
    /// The node's use in `round` (sent before its Ended).
    Report {
        round: u32,
        report: Report,
    },
    /// Every rank of the node ended in `round` (`code`: 0 or the failure's).
    Ended {
        round: u32,
        code: i32,
        port: u16,
    },
}

/// Rendezvous host to node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum ToAgent {
    /// The host's proof of the agent's nonce, and its own nonce to prove.
    Challenge {
        nonce: String,
        proof: String,
    },
    /// The node is through the door (authenticated, where the job asks it);
    /// the coordinator may still refuse it.
    Welcome,
    /// Too many connections are waiting to say hello: try again.
    Busy,
    Start(Start),
    Beat,
    /// Stop this round's ranks: the job failed elsewhere.
    Stop {
        round: u32,
        cause: String,
    },
    /// The job is over: exit with `code`.
    End {
        code: i32,
        cause: Option<String>,
    },
    /// The rendezvous would not take this node.
    Refused {
        why: String,
    },
    /// Not every node joined in time.
    Incomplete {
        why: String,
    },
}

/// Write one message as a plain line (before the door, and in open jobs).
pub(crate) fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    Seal::plain(Dir::ToAgent).send(w, msg)
}

/// Read one plain message of at most `MAX_LINE`; None at the end of the stream.
#[cfg(test)]
pub(crate) fn recv<T: for<'de> Deserialize<'de>>(
    r: &mut impl BufRead,
) -> std::io::Result<Option<T>> {
    Seal::plain(Dir::ToHost).recv(r, MAX_LINE)
}

/// Which way a message goes: part of what its MAC covers, so a message
/// cannot be sent back to the side that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    ToHost,
    ToAgent,
}

/// One direction of a connection: plain lines, or (with a key) lines that
/// carry their MAC, numbered from 0 at both ends.
#[derive(Debug)]
pub(crate) struct Seal {
    key: Option<Key>,
    dir: Dir,
    seq: u64,
}

fn invalid(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.into())
}

impl Seal {
    /// Plain lines, no MAC.
    pub(crate) fn plain(dir: Dir) -> Seal {
        Seal::new(None, dir)
    }

    pub(crate) fn new(key: Option<Key>, dir: Dir) -> Seal {
        Seal { key, dir, seq: 0 }
    }

    fn tag(key: &Key, dir: Dir, seq: u64, text: &[u8]) -> Hmac<Sha256> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&key.0).unwrap_or_else(|_| unreachable!());
        m.update(match dir {
            Dir::ToHost => b"to-host\0",
            Dir::ToAgent => b"to-agent",
        });
        m.update(&seq.to_be_bytes());
        m.update(text);
        m
    }

    /// Write one message as a line (its MAC after it, with a key).
    pub(crate) fn send<T: Serialize>(
        &mut self,
        w: &mut impl Write,
        msg: &T,
    ) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        if let Some(k) = &self.key {
            let tag = Seal::tag(k, self.dir, self.seq, &line)
                .finalize()
                .into_bytes();
            line.push(b' ');
            line.extend(super::auth::hex(&tag).bytes());
            self.seq += 1;
        }
        line.push(b'\n');
        w.write_all(&line)?;
        w.flush()
    }

    /// Read one message of at most `max` bytes; None at the end of the
    /// stream. With a key, a line whose MAC does not hold for this
    /// direction and the next sequence number is an error.
    pub(crate) fn recv<T: for<'de> Deserialize<'de>>(
        &mut self,
        r: &mut impl BufRead,
        max: usize,
    ) -> std::io::Result<Option<T>> {
        let mut line = Vec::new();
        let n = std::io::Read::take(&mut *r, max as u64).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            return Err(invalid(format!(
                "a message line was cut short or over {} KiB",
                max >> 10
            )));
        }
        line.pop();
        let text = match &self.key {
            None => &line[..],
            Some(k) => {
                let at = line
                    .iter()
                    .rposition(|b| *b == b' ')
                    .ok_or_else(|| invalid("a message without its MAC"))?;
                let (text, tag) = (&line[..at], &line[at + 1..]);
                let tag = std::str::from_utf8(tag)
                    .ok()
                    .and_then(super::auth::unhex)
                    .ok_or_else(|| invalid("a message whose MAC is not hex"))?;
                Seal::tag(k, self.dir, self.seq, text)
                    .verify_slice(&tag)
                    .map_err(|_| {
                        invalid(format!(
                            "message {} failed its MAC check: changed, injected, replayed or \
                             reordered on the way",
                            self.seq
                        ))
                    })?;
                self.seq += 1;
                text
            }
        };
        serde_json::from_slice(text)
            .map(Some)
            .map_err(|e| invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_lines() {
        let msgs = vec![
            ToAgent::Beat,
            ToAgent::Stop {
                round: 2,
                cause: "host1: rank 3 exited with code 1".into(),
            },
            ToAgent::End {
                code: 137,
                cause: None,
            },
        ];
        let mut buf = vec![];
        for m in &msgs {
            send(&mut buf, m).unwrap();
        }
        assert_eq!(buf.iter().filter(|b| **b == b'\n').count(), 3);
        assert!(String::from_utf8_lossy(&buf).starts_with("{\"msg\":\"beat\"}\n"));
        let mut r = std::io::BufReader::new(&buf[..]);
        for m in &msgs {
            assert_eq!(recv::<ToAgent>(&mut r).unwrap().as_ref(), Some(m));
        }
        assert_eq!(recv::<ToAgent>(&mut r).unwrap(), None);
        // Garbage and a cut line are errors, not panics.
        let mut bad = std::io::BufReader::new(&b"hello\n{\"msg\":"[..]);
        assert!(recv::<ToAgent>(&mut bad).is_err());
        assert!(recv::<ToAgent>(&mut bad).is_err());
    }

    fn sealed(key: u8, msgs: &[ToAgent]) -> Vec<Vec<u8>> {
        let mut s = Seal::new(Some(Key([key; 32])), Dir::ToAgent);
        msgs.iter()
            .map(|m| {
                let mut b = vec![];
                s.send(&mut b, m).unwrap();
                b
            })
            .collect()
    }

    /// What a receiver with key 1, to the agent, makes of these lines.
    fn opened(lines: &[Vec<u8>]) -> Vec<Result<ToAgent, String>> {
        let all = lines.concat();
        let mut out = vec![];
        let mut s = Seal::new(Some(Key([1; 32])), Dir::ToAgent);
        let mut r = std::io::BufReader::new(&all[..]);
        loop {
            match s.recv::<ToAgent>(&mut r, MAX_LINE) {
                Ok(Some(m)) => out.push(Ok(m)),
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[test]
    fn sealed_lines_detect_any_change_injection_replay_reorder_or_reflection() {
        let msgs = [
            ToAgent::Welcome,
            ToAgent::Beat,
            ToAgent::End {
                code: 0,
                cause: None,
            },
        ];
        let lines = sealed(1, &msgs);
        assert_eq!(
            opened(&lines),
            msgs.iter().cloned().map(Ok).collect::<Vec<_>>()
        );
        let failed = |got: Vec<Result<ToAgent, String>>, at: usize| {
            assert_eq!(got.len(), at + 1, "{got:?}");
            assert!(got[..at].iter().all(|m| m.is_ok()), "{got:?}");
            let e = got[at].as_ref().unwrap_err();
            assert!(e.contains("MAC"), "{e}");
        };
        // A byte flipped in the second line's JSON (`code` 0 -> 1 in the third).
        let mut flipped = lines.clone();
        let at = flipped[2].iter().position(|b| *b == b'0').unwrap();
        flipped[2][at] = b'1';
        failed(opened(&flipped), 2);
        // Replayed, reordered, dropped.
        failed(opened(&[lines[0].clone(), lines[0].clone()]), 1);
        failed(opened(&[lines[1].clone(), lines[0].clone()]), 0);
        failed(opened(&[lines[0].clone(), lines[2].clone()]), 1);
        // Injected: plain, or sealed under another key, or sent the other way.
        let mut plain = vec![];
        send(&mut plain, &ToAgent::Beat).unwrap();
        failed(opened(&[lines[0].clone(), plain]), 1);
        failed(opened(&sealed(2, &msgs)), 0);
        let mut back = Seal::new(Some(Key([1; 32])), Dir::ToHost);
        let mut reflected = vec![];
        back.send(&mut reflected, &ToAgent::Welcome).unwrap();
        failed(opened(&[reflected]), 0);
        // A line over the cap is refused before its end is read.
        let mut s = Seal::plain(Dir::ToHost);
        let long = format!("{}\n", "x".repeat(MAX_DOOR_LINE + 1));
        let e = s
            .recv::<ToHost>(&mut std::io::BufReader::new(long.as_bytes()), MAX_DOOR_LINE)
            .unwrap_err();
        assert!(e.to_string().contains("over 8 KiB"), "{e}");
    }
}
