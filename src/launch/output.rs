//! Rank output: each rank's stdout and stderr are read as their bytes come
//! (a full pipe never blocks a rank; a few threads, each polling its ranks'
//! pipes) in chunks of up to 256 KiB. On the terminal, every write
//! holds whole lines only, under one lock, so no rank's line is cut by
//! another's; with `[rank K] ` prefixes (the default) each line and each
//! carriage-return update (tqdm) gets the prefix, and a line that already
//! carries torch's own `[rankK]:` prefix is left as it is. Without prefixes
//! the bytes pass unchanged. A line is kept whole up to `MAX_LINE`; a longer
//! one is passed on in `MAX_LINE` pieces (each written whole) and said once.
//! With a log directory every byte also goes to `rank-K.stdout|stderr`,
//! byte-exact, written as each chunk is read (never held in a buffer of
//! ours, so a supervisor killed outright loses no line it read); a failed
//! log write is kept and reported at the end.
//! When our own stdout or stderr closes (`| head`), copying that stream stops
//! and the rank's pipe is closed, so the rank gets EPIPE/SIGPIPE as it would
//! without us; a write of ours never panics.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How much a rank's output pipe holds (`supervise` widens it from the
/// kernel's 64 KiB): a rank that prints a lot wakes its pump less often.
pub(crate) const PIPE_BYTES: usize = 1 << 20;

/// The most one read takes (one buffer per output thread), and the log's
/// buffer (one per log file).
const READ_BYTES: usize = 256 * 1024;

/// Lines up to this long are written whole; longer ones in pieces of it.
pub(crate) const MAX_LINE: usize = 8 << 20;
/// Stderr lines kept per rank for the failure report.
pub(crate) const TAIL_LINES: usize = 20;
/// A tail line is cut to this many bytes (the report wants context, not 8 MiB).
const TAIL_LINE_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// Called with (local rank, line without its terminator) for every line of
/// every rank, as it arrives: tune parses its metric here instead of keeping
/// the output.
pub(crate) type LineSink = Arc<dyn Fn(usize, &str) + Send + Sync>;

/// How output is shown.
#[derive(Clone)]
pub(crate) struct OutputOptions {
    pub prefix: bool,
    /// Ranks whose output is shown on the terminal (None: all).
    pub show: Option<Vec<usize>>,
    /// Also give every line to this sink.
    pub sink: Option<LineSink>,
    /// The global rank of local rank 0 (multi-node), for the prefixes.
    pub rank_base: usize,
    /// Each local rank's prefix, in place of `[rank K] ` (torchrun's
    /// --log-line-prefix-template).
    pub prefix_of: Option<Arc<dyn Fn(usize) -> String + Send + Sync>>,
    /// Also give stdout's and stderr's lines to these (torchrun's
    /// --duplicate-std*-filters).
    pub duplicate: [Option<LineSink>; 2],
}

impl std::fmt::Debug for OutputOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputOptions")
            .field("prefix", &self.prefix)
            .field("show", &self.show)
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

/// The last stderr lines of one rank.
pub(crate) type Tail = Arc<Mutex<VecDeque<String>>>;

/// What went wrong with the output while the ranks ran, for the end report.
#[derive(Debug, Default)]
pub(crate) struct OutputState {
    /// Set when our stdout / stderr was closed by the reader.
    pub stdout_closed: AtomicBool,
    pub stderr_closed: AtomicBool,
    /// Log files that could not be written whole: (file, error).
    pub log_errors: Mutex<Vec<(String, String)>>,
    /// A line over MAX_LINE was passed on in pieces.
    pub split_lines: AtomicBool,
}

impl OutputState {
    fn closed(&self, s: Stream) -> &AtomicBool {
        match s {
            Stream::Stdout => &self.stdout_closed,
            Stream::Stderr => &self.stderr_closed,
        }
    }
}

/// One pipe's copy to the terminal, the log and the sink.
struct Pump {
    rank: usize,
    stream: Stream,
    show: bool,
    prefix: Option<Vec<u8>>,
    /// torch's own per-rank prefix, which makes ours redundant.
    torch_prefix: Vec<u8>,
    /// The rank's log file, written as each chunk is read (no buffer of
    /// ours: a supervisor killed with SIGKILL loses no line it had read).
    log: Option<(File, String)>,
    sink: Option<LineSink>,
    tail: Option<Tail>,
    state: Arc<OutputState>,
    /// Bytes of the current, unterminated line (terminal side).
    pending: Vec<u8>,
    /// The terminal output is at the start of a line.
    at_start: bool,
    /// The terminal bytes of one chunk (kept to reuse its allocation).
    out: Vec<u8>,
    /// In unit tests, what would have reached the terminal.
    #[cfg(test)]
    shown: Vec<u8>,
}

impl Pump {
    fn log(&mut self, bytes: &[u8]) {
        if let Some((f, name)) = &mut self.log
            && let Err(e) = f.write_all(bytes)
        {
            self.state
                .log_errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((name.clone(), e.to_string()));
            self.log = None;
        }
    }

    /// A finished line (without terminator) for the sink and the tail.
    fn line_done(&self, line: &[u8]) {
        if self.sink.is_none() && self.tail.is_none() {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\r', '\n']);
        if let Some(s) = &self.sink {
            s(self.rank, text);
        }
        if let Some(t) = &self.tail {
            let mut cut = text.len().min(TAIL_LINE_BYTES);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(text[..cut].to_string());
        }
    }

    /// Append one segment (ending in its terminator, or not at EOF) to `out`.
    fn render(&mut self, seg: &[u8], out: &mut Vec<u8>) {
        if let Some(p) = &self.prefix
            && self.at_start
            && !seg.starts_with(&self.torch_prefix)
        {
            out.extend_from_slice(p);
        }
        out.extend_from_slice(seg);
        self.at_start = matches!(seg.last(), Some(b'\n' | b'\r'));
    }

    /// Where the next terminal segment ends in `buf`: after '\n', after a
    /// '\r' not followed by '\n' (with prefixes), or None to wait for more.
    fn segment_end(&self, buf: &[u8]) -> Option<usize> {
        if self.prefix.is_none() {
            return memchr::memchr(b'\n', buf).map(|i| i + 1);
        }
        let i = memchr::memchr2(b'\n', b'\r', buf)?;
        if buf[i] == b'\n' {
            return Some(i + 1);
        }
        match buf.get(i + 1) {
            Some(b'\n') => Some(i + 2),
            Some(_) => Some(i + 1),
            None => None,
        }
    }

    /// The whole segments at the start of `buf` into `out` (and the sink and
    /// tail); how many bytes they took.
    fn segments(&mut self, buf: &[u8], out: &mut Vec<u8>) -> usize {
        if self.prefix.is_none() && self.sink.is_none() && self.tail.is_none() {
            // Plain copy: everything up to the last newline, in one piece.
            let end = memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1);
            if self.show {
                out.extend_from_slice(&buf[..end]);
            }
            return end;
        }
        out.reserve(buf.len() + buf.len() / 8 + 64);
        let mut start = 0;
        while let Some(n) = self.segment_end(&buf[start..]) {
            let seg = &buf[start..start + n];
            // A progress bar's carriage-return update is a line to the
            // sink too (tqdm prints its rate there).
            if seg.ends_with(b"\n") || (seg.ends_with(b"\r") && self.sink.is_some()) {
                self.line_done(seg);
            }
            if self.show {
                self.render(seg, out);
            }
            start += n;
        }
        start
    }

    /// Copy a chunk: log it, then show every whole segment in one write.
    fn chunk(&mut self, data: &[u8]) {
        self.log(data);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        if self.pending.is_empty() {
            // The common case: no line carried over, so the chunk is read in
            // place and only its unfinished end is kept.
            let used = self.segments(data, &mut out);
            self.pending.extend_from_slice(&data[used..]);
        } else {
            let mut pending = std::mem::take(&mut self.pending);
            pending.extend_from_slice(data);
            let used = self.segments(&pending, &mut out);
            pending.drain(..used);
            self.pending = pending;
        }
        if self.pending.len() >= MAX_LINE {
            // Too long to hold: pass this piece on whole, and say so once.
            let piece = std::mem::take(&mut self.pending);
            self.state.split_lines.store(true, Ordering::Relaxed);
            if self.show {
                self.render(&piece, &mut out);
            }
        }
        self.show_bytes(&out);
        self.out = out;
    }

    /// The end of the pipe: the last unterminated line.
    fn finish(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.line_done(&rest);
        }
        let mut out = vec![];
        if self.show && !rest.is_empty() {
            self.render(&rest, &mut out);
        }
        // With prefixes, the next rank's line must start on a line of its own.
        if self.prefix.is_some() && !self.at_start && self.show {
            out.push(b'\n');
        }
        self.show_bytes(&out);
    }

    fn show_bytes(&mut self, out: &[u8]) {
        if out.is_empty() || !self.show {
            return;
        }
        #[cfg(test)]
        {
            self.shown.extend_from_slice(out);
            return;
        }
        #[cfg_attr(test, allow(unreachable_code))]
        let closed = self.state.closed(self.stream);
        if closed.load(Ordering::Relaxed) {
            self.show = false;
            return;
        }
        let r = match self.stream {
            Stream::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(out).and_then(|_| o.flush())
            }
            Stream::Stderr => std::io::stderr().lock().write_all(out),
        };
        if let Err(e) = r
            && e.kind() == std::io::ErrorKind::BrokenPipe
        {
            closed.store(true, Ordering::Relaxed);
            self.show = false;
        }
    }

    /// Keep reading while anything still wants the bytes.
    fn wanted(&self) -> bool {
        self.show || self.log.is_some() || self.sink.is_some() || self.tail.is_some()
    }
}

/// One rank pipe to copy: to our stdout or stderr, its log, the tail.
pub(crate) struct Source {
    pub rank: usize,
    pub stream: Stream,
    pub pipe: File,
    pub log: Option<(File, String)>,
    pub tail: Option<Tail>,
}

/// Copy every source on `threads` threads (at least one), each waiting on
/// its share of the pipes at once (poll); a rank's two pipes share a thread.
/// One thread per pipe would cost more to start than the copy of a short
/// run; more threads than CPUs copy no faster.
pub(crate) fn pumps(
    sources: Vec<Source>,
    opts: &OutputOptions,
    state: &Arc<OutputState>,
    threads: usize,
) -> Pumps {
    let mut ranks: Vec<usize> = sources.iter().map(|s| s.rank).collect();
    ranks.dedup();
    let threads = threads.clamp(1, ranks.len().max(1));
    let mut groups: Vec<Vec<(Pump, File)>> = (0..threads).map(|_| vec![]).collect();
    for src in sources {
        let g = ranks.iter().position(|r| *r == src.rank).unwrap_or(0) % threads;
        groups[g].push((
            pump(src.rank, src.stream, src.log, opts, src.tail, state.clone()),
            src.pipe,
        ));
    }
    let (tx, done) = std::sync::mpsc::channel();
    let handles = groups
        .into_iter()
        .filter(|g| !g.is_empty())
        .map(|g| {
            let tx = tx.clone();
            // A small stack: the thread only copies bytes.
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    copy_all(g);
                    let _ = tx.send(());
                })
                .expect("cannot start an output thread")
        })
        .collect();
    Pumps { handles, done }
}

/// The output threads, and word of each one's end.
pub(crate) struct Pumps {
    handles: Vec<JoinHandle<()>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Pumps {
    /// Wait for every thread to end, but never longer than `limit` (a pipe
    /// an escaped process holds open would keep one waiting for ever).
    pub(crate) fn join_within(self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        for _ in 0..self.handles.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.done.recv_timeout(left).is_err() {
                return; // left running; they end with the process
            }
        }
        for h in self.handles {
            let _ = h.join();
        }
    }
}

fn pump(
    rank: usize,
    stream: Stream,
    log: Option<(File, String)>,
    opts: &OutputOptions,
    tail: Option<Tail>,
    state: Arc<OutputState>,
) -> Pump {
    Pump {
        rank,
        stream,
        show: opts.show.as_ref().is_none_or(|s| s.contains(&rank)),
        prefix: opts.prefix.then(|| match &opts.prefix_of {
            Some(f) => f(rank).into_bytes(),
            None => format!("[rank {}] ", opts.rank_base + rank).into_bytes(),
        }),
        torch_prefix: format!("[rank{}]:", opts.rank_base + rank).into_bytes(),
        log,
        sink: match (&opts.sink, &opts.duplicate[stream as usize]) {
            (Some(a), Some(b)) => {
                let (a, b) = (a.clone(), b.clone());
                Some(Arc::new(move |r: usize, l: &str| {
                    a(r, l);
                    b(r, l)
                }))
            }
            (a, b) => a.clone().or_else(|| b.clone()),
        },
        tail,
        state,
        pending: Vec::new(),
        at_start: true,
        out: Vec::new(),
        #[cfg(test)]
        shown: Vec::new(),
    }
}

/// Copy the pipes until each has ended (or nothing wants its bytes): one
/// read per pipe that is ready, in turn, so no pipe waits on another.
fn copy_all(mut live: Vec<(Pump, File)>) {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; READ_BYTES];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(live.len());
    while !live.is_empty() {
        fds.clear();
        fds.extend(live.iter().map(|(_, f)| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        if live.len() > 1 {
            // SAFETY: fds is valid for fds.len() entries.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
        } else {
            // One pipe: its read waits by itself.
            fds[0].revents = libc::POLLIN;
        }
        // Highest first, so a pipe removed does not move one still to read.
        for i in (0..fds.len()).rev() {
            if fds[i].revents == 0 {
                continue;
            }
            let (p, pipe) = &mut live[i];
            let ended = match pipe.read(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    let was_shown = p.show;
                    p.chunk(&buf[..n]);
                    // Our side closed and nothing else wants the bytes: close
                    // the rank's pipe so it sees what it would see without us.
                    was_shown && !p.show && !p.wanted()
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => false,
                Err(_) => true,
            };
            if ended {
                let (mut p, pipe) = live.swap_remove(i);
                p.finish();
                drop(pipe);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pump_with(prefix: bool) -> Pump {
        Pump {
            rank: 1,
            stream: Stream::Stdout,
            show: true,
            prefix: prefix.then(|| b"[rank 1] ".to_vec()),
            torch_prefix: b"[rank1]:".to_vec(),
            log: None,
            sink: None,
            tail: None,
            state: Arc::default(),
            pending: vec![],
            at_start: true,
            out: vec![],
            shown: vec![],
        }
    }

    /// What the terminal would get for these chunks (no real write).
    fn rendered(prefix: bool, chunks: &[&[u8]]) -> Vec<u8> {
        let mut p = pump_with(prefix);
        p.show = false; // collect, do not write
        let mut all = vec![];
        for c in chunks {
            p.pending.extend_from_slice(c);
            let mut start = 0;
            while let Some(n) = p.segment_end(&p.pending[start..]) {
                let seg = p.pending[start..start + n].to_vec();
                p.render(&seg, &mut all);
                start += n;
            }
            p.pending.drain(..start);
        }
        let rest = std::mem::take(&mut p.pending);
        if !rest.is_empty() {
            p.render(&rest, &mut all);
        }
        all
    }

    #[test]
    fn prefixes_lines_and_carriage_return_updates() {
        let got = rendered(true, &[b"one\ntw", b"o\n\r 5%|#\r 9%|##\n"]);
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "[rank 1] one\n[rank 1] two\n[rank 1] \r[rank 1]  5%|#\r[rank 1]  9%|##\n"
        );
        let got = rendered(true, &[b"dos\r\nline\n[rank1]:[W torch] x\n"]);
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "[rank 1] dos\r\n[rank 1] line\n[rank1]:[W torch] x\n"
        );
    }

    #[test]
    fn without_prefix_bytes_pass_unchanged() {
        let input: &[&[u8]] = &[b"a\r", b"b\nno newline at the end"];
        assert_eq!(rendered(false, input), b"a\rb\nno newline at the end");
    }

    #[test]
    fn sink_and_tail_get_whole_lines_even_across_chunks() {
        let seen = Arc::new(Mutex::new(vec![]));
        let s2 = seen.clone();
        let mut p = pump_with(true);
        p.show = false;
        p.sink = Some(Arc::new(move |r, l| {
            s2.lock().unwrap().push(format!("{r}:{l}"))
        }));
        let tail: Tail = Arc::default();
        p.tail = Some(tail.clone());
        p.chunk(b"12.5 img/s\nhal");
        p.chunk(b"f\r\nlast");
        p.finish();
        assert_eq!(*seen.lock().unwrap(), ["1:12.5 img/s", "1:half", "1:last"]);
        assert_eq!(tail.lock().unwrap().len(), 3);
    }

    proptest::proptest! {
        /// However the bytes arrive in chunks, the terminal gets what one
        /// reading of them all renders, and the sink the same lines.
        #[test]
        fn chunking_changes_nothing(
            parts in proptest::collection::vec(
                proptest::sample::select(vec!["ab", "\n", "\r", "\r\n", "[rank1]:x", "[rank", "1]", "é"]),
                0..60,
            ),
            cuts in proptest::collection::vec(0usize..200, 0..8),
            prefix in proptest::bool::ANY,
            sink in proptest::bool::ANY,
        ) {
            let input: Vec<u8> = parts.concat().into_bytes();
            let want = rendered(prefix, &[&input]);
            let run = |chunks: Vec<&[u8]>| {
                let lines = Arc::new(Mutex::new(vec![]));
                let l2 = lines.clone();
                let mut p = pump_with(prefix);
                if sink {
                    // Without a sink (or prefixes), the plain-copy path.
                    p.sink = Some(Arc::new(move |_, l| l2.lock().unwrap().push(l.to_string())));
                }
                for c in chunks {
                    p.chunk(c);
                }
                p.finish();
                let got = lines.lock().unwrap().clone();
                (p.shown, got)
            };
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
            at.sort_unstable();
            let mut chunks = vec![];
            let mut prev = 0;
            for c in at.into_iter().chain([input.len()]) {
                chunks.push(&input[prev..c]);
                prev = c;
            }
            let (whole, whole_lines) = run(vec![&input[..]]);
            let (split, split_lines) = run(chunks);
            // With prefixes the end gets a newline so the next rank starts a line.
            let mut want = want;
            if prefix && !want.is_empty() && !matches!(want.last(), Some(b'\n' | b'\r')) {
                want.push(b'\n');
            }
            proptest::prop_assert_eq!(&whole, &want);
            proptest::prop_assert_eq!(&split, &want);
            proptest::prop_assert_eq!(split_lines, whole_lines);
        }
    }

    #[test]
    fn a_line_longer_than_the_bound_is_passed_on_in_pieces() {
        let mut p = pump_with(false);
        p.show = false;
        p.chunk(&vec![b'x'; MAX_LINE + 10]);
        assert!(p.state.split_lines.load(Ordering::Relaxed));
        assert!(p.pending.is_empty());
    }

    /// Three ranks' pipes (six) on one thread: every log holds exactly what
    /// its writer wrote, whatever the interleaving; the sink gets each line
    /// whole; a pipe whose writer stays silent does not hold up the others.
    #[test]
    fn one_thread_copies_many_pipes_each_whole() {
        let d = tempfile::tempdir().unwrap();
        let lines: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
        let seen = lines.clone();
        let opts = OutputOptions {
            prefix: true,
            show: Some(vec![]),
            sink: Some(Arc::new(move |r, l: &str| {
                seen.lock().unwrap().push((r, l.to_string()))
            })),
            rank_base: 0,
            prefix_of: None,
            duplicate: [None, None],
        };
        let mut sources = vec![];
        let mut writers = vec![];
        for rank in 0..3 {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let mut fds = [0; 2];
                // SAFETY: pipe2 fills two descriptors we then own.
                assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
                // SAFETY: just opened.
                let (r, w) = unsafe {
                    use std::os::fd::FromRawFd;
                    (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
                };
                let name = format!("rank-{rank}.{stream:?}");
                let log = File::create(d.path().join(&name)).unwrap();
                sources.push(Source {
                    rank,
                    stream,
                    pipe: r,
                    log: Some((log, name)),
                    tail: None,
                });
                writers.push((rank, stream, w));
            }
        }
        let state = Arc::new(OutputState::default());
        let pumps = pumps(sources, &opts, &state, 1);
        assert_eq!(pumps.handles.len(), 1);
        let mut expected = vec![];
        let mut threads = vec![];
        for (rank, stream, mut w) in writers {
            // Rank 1's stderr says nothing until the others are done.
            let text: Vec<u8> = (0..2000)
                .flat_map(|i| {
                    format!("{rank} {stream:?} line {i} {}\n", "x".repeat(i % 97)).into_bytes()
                })
                .collect();
            expected.push((format!("rank-{rank}.{stream:?}"), text.clone()));
            let quiet = rank == 1 && stream == Stream::Stderr;
            threads.push(std::thread::spawn(move || {
                if quiet {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                for piece in text.chunks(4093) {
                    w.write_all(piece).unwrap();
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        pumps.join_within(std::time::Duration::from_secs(10));
        for (name, text) in expected {
            assert!(
                std::fs::read(d.path().join(&name)).unwrap() == text,
                "{name}"
            );
        }
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 6 * 2000);
        for (rank, line) in lines.iter() {
            assert!(line.starts_with(&format!("{rank} ")), "{line}");
            let n: usize = line.split(' ').nth(3).unwrap().parse().unwrap();
            assert_eq!(
                line.len(),
                line.find(" line ").unwrap() + 7 + n.to_string().len() + n % 97,
                "{line}"
            );
        }
        assert!(state.log_errors.lock().unwrap().is_empty());
    }
}
