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
//! - `none`: open, as torchrun's c10d store is; said at start-up with how to
//!   close it.
//!
//! The host proves first (so an agent knows the host it joined is genuine
//! before it says more), then the agent. Both nonces are fresh for every
//! connection, so a recorded session proves nothing later.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The least a secret may hold.
pub(crate) const MIN_SECRET: usize = 16;

/// The environment variable a batch script sets once for every node.
pub(crate) const SECRET_VAR: &str = "THREADWISE_RDZV_SECRET";

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

/// What both sides prove knowledge of: the protocol, the side, the run id
/// and both nonces.
fn transcript(side: Side, run_id: &str, agent_nonce: &str, host_nonce: &str) -> String {
    let side = match side {
        Side::Host => "host",
        Side::Agent => "agent",
    };
    format!(
        "{} {side} run={run_id} agent={agent_nonce} host={host_nonce}",
        super::proto::PROTOCOL
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

    /// This side's proof for the transcript.
    pub(crate) fn prove(
        &self,
        side: Side,
        run_id: &str,
        agent_nonce: &str,
        host_nonce: &str,
    ) -> Result<String, String> {
        let t = transcript(side, run_id, agent_nonce, host_nonce);
        match self {
            Auth::Open => Ok(String::new()),
            Auth::Secret(k) => Ok(hex(&mac(k, &t).finalize().into_bytes())),
            Auth::Munge(m) => m.encode(&t),
        }
    }

    /// Check the other side's proof; Err says why it fails.
    pub(crate) fn check(
        &self,
        side: Side,
        run_id: &str,
        agent_nonce: &str,
        host_nonce: &str,
        proof: &str,
    ) -> Result<(), String> {
        let t = transcript(side, run_id, agent_nonce, host_nonce);
        match self {
            Auth::Open => Ok(()),
            Auth::Secret(k) => {
                let got = unhex(proof).ok_or("the proof is not hex")?;
                mac(k, &t)
                    .verify_slice(&got)
                    .map_err(|_| "the proof does not match the job's secret".to_string())
            }
            Auth::Munge(m) => {
                let (uid, payload) = m.decode(proof)?;
                let me = crate::os::euid();
                if uid != me {
                    return Err(format!(
                        "the MUNGE credential is user {uid}'s, not this job's user {me}'s"
                    ));
                }
                if payload != t {
                    return Err("the MUNGE credential was made for another session".into());
                }
                Ok(())
            }
        }
    }
}

fn mac(key: &[u8], transcript: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(transcript.as_bytes());
    m
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 256 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A fresh nonce: 16 bytes from the kernel's random source, as hex.
pub(crate) fn nonce() -> String {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // The raw syscall: glibc's getrandom() wrapper is 2.25+, and the
        // wheel runs on 2.17.
        // SAFETY: the buffer is ours and its length is passed with it.
        let n =
            unsafe { libc::syscall(libc::SYS_getrandom, b[got..].as_mut_ptr(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // getrandom(2) does not fail once the pool is initialised; if it
            // did, /dev/urandom is the same source.
            if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                let _ = std::io::Read::read_exact(&mut f, &mut b);
            }
            break;
        }
    }
    hex(&b)
}

/// Why a secret or MUNGE cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("cannot read the rendezvous secret {path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("the rendezvous secret {path} can be read by others (mode {mode:o})")]
    Exposed { path: String, mode: u32 },
    #[error("the rendezvous secret {from} holds {len} byte(s), fewer than {MIN_SECRET}")]
    Short { from: String, len: usize },
}

impl AuthError {
    pub(crate) fn hint(&self) -> String {
        match self {
            AuthError::Unreadable { .. } => "give a file this user can read, the same on every node".into(),
            AuthError::Exposed { path, .. } => format!("chmod 600 {path}"),
            AuthError::Short { .. } => {
                "make one of 32 random bytes: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"
                    .into()
            }
        }
    }
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

/// The secret in a file that only its owner may read.
pub(crate) fn secret_file_auth(path: &Path) -> Result<Auth, AuthError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display().to_string();
    let unreadable = |e: std::io::Error| AuthError::Unreadable {
        path: shown.clone(),
        why: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(AuthError::Exposed { path: shown, mode });
    }
    let text = std::fs::read(path).map_err(unreadable)?;
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
    m.encode("threadwise probe").ok()?;
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

    /// A credential with `payload`.
    fn encode(&self, payload: &str) -> Result<String, String> {
        let (out, err) = self.tool("munge", &["-s", payload], b"")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Auth {
        secret_var("correct horse battery staple").unwrap()
    }

    #[test]
    fn an_hmac_proof_holds_for_its_transcript_only() {
        let k = key();
        let p = k.prove(Side::Host, "job", "a1", "h1").unwrap();
        assert_eq!(p.len(), 64);
        assert!(k.check(Side::Host, "job", "a1", "h1", &p).is_ok());
        // Another side, run, nonce or key: refused.
        for (side, run, a, h) in [
            (Side::Agent, "job", "a1", "h1"),
            (Side::Host, "job2", "a1", "h1"),
            (Side::Host, "job", "a2", "h1"),
            (Side::Host, "job", "a1", "h2"),
        ] {
            assert!(k.check(side, run, a, h, &p).is_err());
        }
        let other = secret_var("another secret, just as long").unwrap();
        assert!(other.check(Side::Host, "job", "a1", "h1", &p).is_err());
        for junk in ["", "zz", "0", &"f".repeat(10_000)] {
            assert!(k.check(Side::Host, "job", "a1", "h1", junk).is_err());
        }
        assert!(format!("{k:?}").contains("secret") && !format!("{k:?}").contains("horse"));
    }

    #[test]
    fn nonces_are_fresh() {
        let (a, b) = (nonce(), nonce());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    #[test]
    fn secrets_are_checked_for_length_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        assert!(matches!(
            secret_var("short\n"),
            Err(AuthError::Short { len: 5, .. })
        ));
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("s");
        std::fs::write(&f, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = secret_file_auth(&f).unwrap_err();
        assert!(
            matches!(e, AuthError::Exposed { mode: 0o644, .. }) && e.hint().contains("chmod 600")
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The file and the variable agree (a trailing newline is not the secret's).
        let (a, b) = (
            secret_file_auth(&f).unwrap(),
            secret_var("0123456789abcdef0123").unwrap(),
        );
        let p = a.prove(Side::Agent, "r", "x", "y").unwrap();
        assert!(b.check(Side::Agent, "r", "x", "y", &p).is_ok());
        assert!(matches!(
            secret_file_auth(&d.path().join("none")),
            Err(AuthError::Unreadable { .. })
        ));
    }

    #[test]
    fn slurms_munge_socket_is_read_from_its_configuration() {
        let conf = "ClusterName=t\n# AuthInfo=socket=/old\nAuthType=auth/munge\nAuthInfo=cred_expire=60,socket=/run/x/munge.socket\n";
        assert_eq!(
            slurm_munge_socket(conf),
            Some(PathBuf::from("/run/x/munge.socket"))
        );
        assert_eq!(slurm_munge_socket("AuthType=auth/munge\n"), None);
    }
}
