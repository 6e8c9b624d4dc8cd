//! Who may join a rendezvous, and whom an agent may trust as its host.
//!
//! Three modes, the same on every node of a job:
//! - `secret`: a shared secret (`--rdzv-secret-file`, or
//!   `THREADWISE_RDZV_SECRET` set once by the batch script), never sent:
//!   each side proves it with an HMAC-SHA256 over a transcript of both
//!   sides' fresh nonces, the run id and which side speaks;
//! - `munge`: under Slurm, the cluster's own MUNGE (every Slurm host runs
//!   munged for Slurm itself): each side's proof is a credential whose
//!   payload is that transcript; the other side decodes it with `unmunge`
//!   and checks the payload and that it was made by our own user, on a host
//!   of the same cluster (same key). munged refuses a credential decoded
//!   twice;
//! - `none`: open, as torchrun's c10d store is (said at start-up).
//!
//! The host proves first (so an agent knows the host it joined holds the
//! job's secret or MUNGE before it says more), then the agent. Both nonces
//! are fresh for every connection, so a recorded session proves nothing
//! later. The handshake also gives both ends a session key (`Key`) that
//! nobody between them can know: derived from the secret and both nonces,
//! or under MUNGE made by the host and sent inside its credential, which
//! only our own user can decode (`munge -u`), once. Every later message
//! carries a MAC under it (`proto::Seal`): a relay of the handshake can
//! neither read the key nor change, inject or replay a message.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The least a secret may hold.
pub(crate) const MIN_SECRET: usize = 16;

/// The environment variable a batch script sets once for every node.
pub(crate) const SECRET_VAR: &str = "THREADWISE_RDZV_SECRET";

/// A connection's session key (HMAC-SHA256), known to its two ends only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Key(pub [u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// A proof, and the session key it gives its maker (where it gives one).
#[derive(Debug, Clone)]
pub(crate) struct Proof {
    pub text: String,
    pub key: Option<Key>,
}

/// How the nodes of a job know each other.
#[derive(Clone)]
pub(crate) enum Auth {
    Open,
    Secret(Vec<u8>),
    Munge(Munge),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        write!(f, "Auth({})", self.mode())
    }
}

/// MUNGE through its own command-line tools (no C library at run time).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Munge {
    /// munged's socket, where Slurm's configuration names one (`AuthInfo=socket=`).
    pub socket: Option<PathBuf>,
}

/// Who is speaking in a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Host,
    Agent,
}

/// The protocol's name and version, in every hello and every proof.
pub(crate) const PROTOCOL: &str = "threadwise.rdzv/4";

/// What one handshake binds: the job, both nonces, and the agent's hello
/// (its digest: `hello_digest`), so that nothing the agent said of itself
/// (its node rank, ranks, address, port, run id, version) can be changed on
/// the way without both proofs failing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session<'a> {
    pub run_id: &'a str,
    pub agent_nonce: &'a str,
    pub host_nonce: &'a str,
    pub hello: &'a str,
}

/// The digest of a hello as both sides serialise it (its fields, in their
/// order: a relay's spacing changes nothing, a changed value changes it).
pub(crate) fn hello_digest(hello_json: &[u8]) -> String {
    use sha2::Digest;
    hex(&Sha256::digest(hello_json))
}

/// What both sides prove knowledge of: the protocol, the side, the run id,
/// both nonces and the agent's hello.
fn transcript(side: Side, s: &Session<'_>) -> String {
    let side = match side {
        Side::Host => "host",
        Side::Agent => "agent",
    };
    format!(
        "{PROTOCOL} {side} run={} agent={} host={} hello={}",
        s.run_id, s.agent_nonce, s.host_nonce, s.hello
    )
}

impl Auth {
    /// The mode's name, as the hello carries it.
    pub(crate) fn mode(&self) -> &'static str {
        match self {
            Auth::Open => "none",
            Auth::Secret(_) => "secret",
            Auth::Munge(_) => "munge",
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(self, Auth::Open)
    }

    /// A node's ticket for the door (with a shared secret only; empty
    /// otherwise): an HMAC of the run id, the node's nonce and the current
    /// `TICKET_WINDOW`, so the host can tell, from the hello alone and at
    /// the cost of one HMAC, a node that holds the secret from a flood.
    /// It admits nothing: the proofs that follow still decide.
    pub(crate) fn ticket(&self, run_id: &str, nonce: &str, unix_secs: u64) -> String {
        match self {
            Auth::Secret(k) => hex(
                &mac(k, &ticket_text(run_id, nonce, unix_secs / TICKET_WINDOW))
                    .finalize()
                    .into_bytes(),
            ),
            _ => String::new(),
        }
    }

    /// Is `ticket` one this job's secret makes for this run and nonce, in
    /// this window or the last (a clock a little apart still agrees)?
    pub(crate) fn ticket_ok(
        &self,
        run_id: &str,
        nonce: &str,
        ticket: &str,
        unix_secs: u64,
    ) -> bool {
        let (Auth::Secret(k), Some(got)) = (self, unhex(ticket)) else {
            return false;
        };
        let w = unix_secs / TICKET_WINDOW;
        [w, w.saturating_sub(1), w + 1].iter().any(|w| {
            mac(k, &ticket_text(run_id, nonce, *w))
                .verify_slice(&got)
                .is_ok()
        })
    }

    /// This side's proof for the transcript, and the session key it gives:
    /// with a secret, the key both sides derive; under MUNGE, the host's
    /// fresh key inside its credential (the agent's proof gives none).
    pub(crate) fn prove(&self, side: Side, s: &Session<'_>) -> Result<Proof, String> {
        let t = transcript(side, s);
        match self {
            Auth::Open => Ok(Proof {
                text: String::new(),
                key: None,
            }),
            Auth::Secret(k) => Ok(Proof {
                text: hex(&mac(k, &t).finalize().into_bytes()),
                key: Some(derive(k, s)),
            }),
            Auth::Munge(m) if side == Side::Host => {
                let mut fresh = [0u8; 32];
                random(&mut fresh).map_err(|e| e.to_string())?;
                let text = m.encode(&format!("{t} key={}", hex(&fresh)), true)?;
                Ok(Proof {
                    text,
                    key: Some(derive(&fresh, s)),
                })
            }
            Auth::Munge(m) => Ok(Proof {
                text: m.encode(&t, false)?,
                key: None,
            }),
        }
    }

    /// Check the other side's proof; the session key it gives (the host's,
    /// under MUNGE, to its agent), or why it fails.
    pub(crate) fn check(
        &self,
        side: Side,
        s: &Session<'_>,
        proof: &str,
    ) -> Result<Option<Key>, String> {
        let t = transcript(side, s);
        match self {
            Auth::Open => Ok(None),
            Auth::Secret(k) => {
                let got = unhex(proof).ok_or("the proof is not hex")?;
                mac(k, &t)
                    .verify_slice(&got)
                    .map_err(|_| "the proof does not match the job's secret".to_string())?;
                Ok(Some(derive(k, s)))
            }
            Auth::Munge(m) => {
                let (uid, payload) = m.decode(proof)?;
                let me = crate::os::euid();
                if uid != me {
                    return Err(format!(
                        "the MUNGE credential is user {uid}'s, not this job's user {me}'s"
                    ));
                }
                let other = || "the MUNGE credential was made for another session".to_string();
                if side == Side::Agent {
                    return if payload == t { Ok(None) } else { Err(other()) };
                }
                let fresh = payload
                    .strip_prefix(&t)
                    .and_then(|rest| rest.strip_prefix(" key="))
                    .and_then(unhex)
                    .filter(|k| k.len() == 32)
                    .ok_or_else(other)?;
                Ok(Some(derive(&fresh, s)))
            }
        }
    }
}

/// A ticket's window: a recorded ticket keeps a place at the door for at
/// most three of these, and buys no admission.
pub(crate) const TICKET_WINDOW: u64 = 30;

fn ticket_text(run_id: &str, nonce: &str, window: u64) -> String {
    format!("{PROTOCOL} ticket run={run_id} agent={nonce} window={window}")
}

/// Seconds since the epoch, for tickets.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The session key from a key both ends hold, both nonces and the hello.
fn derive(key: &[u8], s: &Session<'_>) -> Key {
    let t = format!(
        "{PROTOCOL} session run={} agent={} host={} hello={}",
        s.run_id, s.agent_nonce, s.host_nonce, s.hello
    );
    Key(mac(key, &t).finalize().into_bytes().into())
}

fn mac(key: &[u8], transcript: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(transcript.as_bytes());
    m
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 256 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A fresh nonce: 16 bytes from the kernel's random source, as hex.
pub(crate) fn nonce() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    random(&mut b)?;
    Ok(hex(&b))
}

/// `b` filled from the kernel's random source: getrandom(2), else
/// /dev/urandom (the same pool); an error where neither answers, never
/// bytes left as they were.
pub(crate) fn random(b: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < b.len() {
        // The raw syscall: glibc's getrandom() wrapper is 2.25+, and the
        // wheel runs on 2.17.
        // SAFETY: the buffer is ours and its length is passed with it.
        let n =
            unsafe { libc::syscall(libc::SYS_getrandom, b[got..].as_mut_ptr(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b[got..]))
            .map_err(|u| {
                std::io::Error::other(format!(
                    "no random bytes: getrandom(2): {e}; /dev/urandom: {u}"
                ))
            });
    }
    Ok(())
}

/// Why a secret or MUNGE cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("cannot read the rendezvous secret {path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("the rendezvous secret {path} can be read by others (mode {mode:o})")]
    Exposed { path: String, mode: u32 },
    #[error("the rendezvous secret {path} belongs to user {owner}, not to this user ({me})")]
    NotOwned { path: String, owner: u32, me: u32 },
    #[error("the rendezvous secret {from} holds {len} byte(s), fewer than {MIN_SECRET}")]
    Short { from: String, len: usize },
}

/// The secret in `text` (trailing white space dropped, so `echo` and a
/// variable agree), from `from`.
fn secret_of(text: &[u8], from: &str) -> Result<Auth, AuthError> {
    let end = text
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    if end < MIN_SECRET {
        return Err(AuthError::Short {
            from: from.to_string(),
            len: end,
        });
    }
    Ok(Auth::Secret(text[..end].to_vec()))
}

/// The most a secret file may hold.
const MAX_SECRET_FILE: u64 = 64 << 10;

/// The secret in a file of our own user's that only that user may read:
/// opened once, and what was opened is checked (fstat), so no link or
/// rename between a check and the read can swap it.
pub(crate) fn secret_file_auth(path: &Path) -> Result<Auth, AuthError> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display().to_string();
    let unreadable = |e: std::io::Error| AuthError::Unreadable {
        path: shown.clone(),
        why: e.to_string(),
    };
    // Opened without blocking (a FIFO given as the secret would wait for a
    // writer forever), then checked to be a regular file before any read.
    let f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(unreadable)?
    };
    let meta = f.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(unreadable(std::io::Error::other(
            "not a regular file (a FIFO, device or directory is no secret file)",
        )));
    }
    let me = crate::os::euid();
    if meta.uid() != me {
        return Err(AuthError::NotOwned {
            path: shown,
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(AuthError::Exposed { path: shown, mode });
    }
    let mut text = vec![];
    std::io::Read::read_to_end(&mut std::io::Read::take(&f, MAX_SECRET_FILE), &mut text)
        .map_err(unreadable)?;
    secret_of(&text, &shown)
}

/// The secret in `THREADWISE_RDZV_SECRET`.
pub(crate) fn secret_var(value: &str) -> Result<Auth, AuthError> {
    secret_of(value.as_bytes(), SECRET_VAR)
}

/// The job's mode, in order: the secret file, `THREADWISE_RDZV_SECRET`,
/// MUNGE inside a Slurm job where it answers, else open.
pub(crate) fn for_job(
    secret_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Auth, AuthError> {
    if let Some(f) = secret_file {
        return secret_file_auth(f);
    }
    if let Some(v) = env(SECRET_VAR).filter(|v| !v.is_empty()) {
        return secret_var(&v);
    }
    Ok(munge_for_job(env).map_or(Auth::Open, Auth::Munge))
}

/// What the start-up line says of the job's mode, for the endpoint.
pub(crate) fn said(auth: &Auth, endpoint: &str, secret_file: Option<&Path>) -> String {
    match auth {
        Auth::Secret(_) => format!(
            "the rendezvous at {endpoint} admits nodes that prove the shared secret ({})",
            secret_file.map_or(SECRET_VAR.to_string(), |f| f.display().to_string())
        ),
        Auth::Munge(_) => format!(
            "the rendezvous at {endpoint} admits nodes that prove, through MUNGE, to be this \
             job's user on this cluster"
        ),
        Auth::Open => format!(
            "warning: the rendezvous at {endpoint} is open: anyone who reaches it can join this \
             job; give every node --rdzv-secret-file FILE (or {SECRET_VAR}), or run under Slurm, \
             where MUNGE closes it"
        ),
    }
}

/// MUNGE for a Slurm job, when its tools are here and munged answers
/// (a credential made without a payload); None otherwise.
pub(crate) fn munge_for_job(env: &dyn Fn(&str) -> Option<String>) -> Option<Munge> {
    env("SLURM_JOB_ID")?;
    let socket =
        env("SLURM_CONF").and_then(|c| slurm_munge_socket(&std::fs::read_to_string(c).ok()?));
    let m = Munge { socket };
    m.encode("threadwise probe", false).ok()?;
    which::which("unmunge").ok()?;
    Some(m)
}

/// munged's socket as Slurm's configuration names it (`AuthInfo=...socket=PATH...`).
pub(crate) fn slurm_munge_socket(conf: &str) -> Option<PathBuf> {
    conf.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.strip_prefix("AuthInfo="))
        .flat_map(|v| v.split(','))
        .find_map(|kv| kv.trim().strip_prefix("socket=").map(PathBuf::from))
}

impl Munge {
    /// Run one of MUNGE's tools with `input` on stdin; its stdout and stderr.
    /// Its exit status is not ours to rely on: a supervisor reaping every
    /// child of this process (`run`'s, `tune`'s) may reap it first, so what
    /// it printed, read to the end, is the answer.
    fn tool(&self, name: &str, args: &[&str], input: &[u8]) -> Result<(String, String), String> {
        let mut c = Command::new(name);
        if let Some(s) = &self.socket {
            c.arg(format!("--socket={}", s.display()));
        }
        let mut child = c
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {name}: {e}"))?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(input);
        }
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut o, &mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let _ = child.wait();
        Ok((out, err))
    }

    /// A credential with `payload`; `mine`: only our own user may decode it.
    fn encode(&self, payload: &str, mine: bool) -> Result<String, String> {
        let uid = crate::os::euid().to_string();
        let mut args = vec!["-s", payload];
        if mine {
            args.extend(["-u", &uid]);
        }
        let (out, err) = self.tool("munge", &args, b"")?;
        let cred = out.trim();
        if !cred.starts_with("MUNGE:") {
            return Err(format!("munge failed: {}", err.trim()));
        }
        Ok(cred.to_string())
    }

    /// The user and payload of a credential, as munged decodes it.
    fn decode(&self, cred: &str) -> Result<(u32, String), String> {
        if !cred.starts_with("MUNGE:") || cred.len() > 4096 || cred.contains('\n') {
            return Err("the proof is no MUNGE credential".into());
        }
        let (text, err) = self.tool("unmunge", &[], cred.as_bytes())?;
        let (meta, payload) = text.split_once("\n\n").unwrap_or((&text, ""));
        let field = |k: &str| {
            meta.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        let status = field("STATUS:").unwrap_or_else(|| err.trim().to_string());
        if !status.starts_with("Success") {
            return Err(format!("munged refused the credential: {status}"));
        }
        let uid = field("UID:")
            .and_then(|v| {
                let n = v.rsplit_once('(')?.1.trim_end_matches(')');
                n.parse::<u32>().ok()
            })
            .ok_or("unmunge named no user")?;
        Ok((uid, payload.to_string()))
    }
}

impl crate::error::Hinted for AuthError {
    fn hint(&self) -> String {
        match self {
            AuthError::Unreadable { .. } => "give a file this user can read, the same on every node".into(),
            AuthError::Exposed { path, .. } => format!("chmod 600 {path}"),
            AuthError::NotOwned { path, .. } => {
                format!("keep the secret in a file of this user's own: chown $(id -u) {path}")
            }
            AuthError::Short { .. } => {
                "make one of 32 random bytes: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"
                    .into()
            }
        }
    }
    fn kind(&self) -> crate::error::Kind {
        crate::error::Kind::Usage
    }
}

#[cfg(test)]
mod tests;
