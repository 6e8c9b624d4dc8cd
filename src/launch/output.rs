//! Rank output: each rank's stdout and stderr are read concurrently (a full
//! pipe never blocks a rank) and written line by line with a `[rank K]` prefix,
//! a whole line per write under one lock, so no rank's line is cut by another's.
//! The final unterminated line is kept. With a log directory, every byte is
//! also written to `rank-K.stdout` / `rank-K.stderr` as it arrives.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Lines longer than this are passed on in pieces.
const MAX_LINE: usize = 1 << 20;
/// Stderr lines kept per rank for the failure report.
pub const TAIL_LINES: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How output is shown.
#[derive(Debug, Clone)]
pub struct OutputOptions {
    pub prefix: bool,
    /// Ranks whose output is shown on the terminal (None: all).
    pub show: Option<Vec<usize>>,
    /// Also keep every line (stdout and stderr, all ranks) here.
    pub capture: Option<Arc<Mutex<Vec<String>>>>,
}

/// The last stderr lines of one rank.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Start a thread that copies one pipe to our stdout or stderr.
pub fn pump(
    rank: usize,
    stream: Stream,
    pipe: impl Read + Send + 'static,
    log: Option<File>,
    opts: &OutputOptions,
    tail: Option<Tail>,
) -> JoinHandle<()> {
    let show = opts.show.as_ref().is_none_or(|s| s.contains(&rank));
    let prefix = if opts.prefix {
        format!("[rank {rank}] ")
    } else {
        String::new()
    };
    let capture = opts.capture.clone();
    // A small stack: the thread only copies bytes, and 2 threads per rank add up.
    let builder = std::thread::Builder::new().stack_size(64 * 1024);
    let spawned = builder.spawn(move || {
        let mut reader = BufReader::with_capacity(64 * 1024, pipe);
        let mut log = log;
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let n = match read_line(&mut reader, &mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(f) = log.as_mut() {
                let _ = f.write_all(&line[..n]);
            }
            if let Some(c) = &capture {
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                c.lock().unwrap_or_else(|e| e.into_inner()).push(text);
            }
            if let Some(t) = &tail {
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
            }
            if show {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut out = Vec::with_capacity(prefix.len() + line.len());
                out.extend_from_slice(prefix.as_bytes());
                out.extend_from_slice(&line);
                let _ = match stream {
                    Stream::Stdout => std::io::stdout().lock().write_all(&out),
                    Stream::Stderr => std::io::stderr().lock().write_all(&out),
                };
            }
        }
    });
    spawned.expect("cannot start an output thread")
}

/// Read up to and including '\n', or MAX_LINE bytes, or to EOF.
fn read_line(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<usize> {
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(out.len());
        }
        let room = MAX_LINE - out.len();
        let (take, done) = match buf.iter().take(room).position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len().min(room), out.len() + buf.len() >= MAX_LINE),
        };
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            return Ok(out.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_partial_and_long() {
        let data = b"one\ntwo\nthree".to_vec();
        let mut r = BufReader::with_capacity(4, &data[..]);
        let mut got = vec![];
        loop {
            let mut l = vec![];
            if read_line(&mut r, &mut l).unwrap() == 0 {
                break;
            }
            got.push(String::from_utf8(l).unwrap());
        }
        assert_eq!(got, ["one\n", "two\n", "three"]);
        let long = vec![b'x'; MAX_LINE + 10];
        let mut r = BufReader::new(&long[..]);
        let mut l = vec![];
        assert_eq!(read_line(&mut r, &mut l).unwrap(), MAX_LINE);
    }
}
