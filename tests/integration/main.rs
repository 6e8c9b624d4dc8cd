//! One integration-test binary: the real `threadwise` binary against real
//! machine dumps, real cgroups and real processes.

mod births;
mod cgroups;
mod cli;
mod docs;
mod docs_launch;
mod docs_reference;
mod doctor;
mod elastic;
mod gpus;
mod hardening;
mod holding;
mod hosts;
mod layout;
mod plans;
mod rendezvous;
mod roles;
mod run;
mod signals;
mod slurm;
mod top;
mod topologies;
mod torchrun_cli;
mod tune;

use std::path::PathBuf;

/// The vendored machine dumps and exports (`tests/data/topologies`, hwloc's
/// test data; see its README).
pub fn topologies(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/topologies")
        .join(rel)
}

/// A C helper of tests/support (`src`, below it) built with `cc -O2 FLAGS`
/// into the target's scratch directory as `name`.
pub fn build_support(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(src);
    let tmp = out.with_extension(format!("{}", std::process::id()));
    let cc = std::process::Command::new("cc")
        .arg("-O2")
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("cc (gcc) builds the test helpers");
    assert!(cc.success(), "cc {}", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

pub fn threadwise() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("threadwise").expect("binary built")
}

/// A scratch directory on tmpfs when there is one: the dumps hold thousands of
/// small files, and creating them on this machine's disk costs ~0.6 ms each.
pub fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Unpack the dump `name` from tests/data/topologies/linux into `dir/NAME`.
pub fn extract_dump(dir: &std::path::Path, name: &str) -> PathBuf {
    let root = dir.join(name);
    std::fs::create_dir_all(&root).unwrap();
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(topologies(&format!("linux/{name}.tar.gz")))
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap();
    assert!(status.success(), "cannot extract {name}");
    root
}

/// Start `c` with SIGINT and SIGQUIT at their defaults, as from a terminal: a
/// test runner started with `cmd &` from a script inherits them ignored, and
/// threadwise (rightly) keeps an ignored signal ignored.
pub fn default_signals(c: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal() is async-signal-safe; nothing else runs before exec.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
}

/// Wait until `done` holds, checking every 20 ms; fail naming `what` after
/// `limit`. Tests wait on the condition they need, never a fixed time.
pub fn wait_for(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether DIR/up0 .. DIR/up{n-1} exist: ranks that write `up$RANK` when
/// they are ready (their traps set).
pub fn ranks_up(dir: &std::path::Path, n: usize) -> bool {
    (0..n).all(|r| dir.join(format!("up{r}")).exists())
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The stdout of a command that must have succeeded (its stderr otherwise).
pub fn stdout_ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
