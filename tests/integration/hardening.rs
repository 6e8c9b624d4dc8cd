//! What an adversarial user (or a mistake) does to files root writes, and to
//! plan files: real device nodes, planted symbolic links, a full tmpfs, and
//! plans that lie. Each is refused with a clear error before anything starts,
//! or written the safe way.

use std::path::Path;
use std::process::Command;

use super::run::{bin, text};

/// A one-trial tune of `true` writing its CSV to `target`.
fn tune_csv(target: &Path) -> std::process::Output {
    Command::new(bin())
        .args([
            "tune",
            "-n",
            "1",
            "--runs",
            "1",
            "--grid",
            "threads=1",
            "--export-csv",
        ])
        .arg(target)
        .args(["--", "true"])
        .output()
        .unwrap()
}

fn mknod_char(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; makedev/mknod are plain calls.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn is_char_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

#[test]
fn reports_to_devices_are_written_in_place_and_links_refused() {
    let d = tempfile::tempdir().unwrap();
    let null = d.path().join("null");
    mknod_char(&null, 1, 3);
    let out = tune_csv(&null);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(is_char_device(&null), "the device node is still a device");

    let full = d.path().join("full");
    mknod_char(&full, 1, 7);
    let out = tune_csv(&full);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("No space left"),
        "{}",
        text(&out.stderr)
    );
    assert!(is_char_device(&full), "/dev/full's twin survives");

    // A link planted where the report goes: refused before any trial, the
    // target untouched.
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = d.path().join("r.csv");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = tune_csv(&link);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("--export-csv") && err.contains("symbolic link"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // A regular file: replaced whole, no temporary left beside it.
    let csv = d.path().join("ok.csv");
    assert!(tune_csv(&csv).status.success());
    assert!(
        std::fs::read_to_string(&csv)
            .unwrap()
            .starts_with("config,options,round")
    );
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".threadwise-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

fn run_logged(dir: &Path, script: &str) -> std::process::Output {
    Command::new(bin())
        .args(["run", "-n", "1", "-q", "--log-dir"])
        .arg(dir)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap()
}

#[test]
fn log_dir_links_are_not_followed_and_a_full_disk_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let logs = d.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::os::unix::fs::symlink(&victim, logs.join("rank-0.stdout")).unwrap();
    let out = run_logged(&logs, "echo hi");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rank-0.stdout"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // Rank 1's log refused: no rank starts at all (every log is opened
    // before the first rank is born), not rank 0 started and then killed.
    std::fs::remove_file(logs.join("rank-0.stdout")).unwrap();
    std::os::unix::fs::symlink(&victim, logs.join("rank-1.stdout")).unwrap();
    let ran = d.path().join("ran");
    let out = Command::new(bin())
        .args(["run", "-n", "2", "--oversubscribe", "-q", "--log-dir"])
        .arg(&logs)
        .args(["--", "sh", "-c", "touch \"$0\"-$LOCAL_RANK"])
        .arg(&ran)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rank-1.stdout"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.path().join("ran-0").exists(), "rank 0 never started");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // A directory others can write: said before the run.
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run_logged(&open, "echo hi");
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("other users may write in it"),
        "{}",
        text(&out.stderr)
    );

    // A full disk: a 64 KiB tmpfs, 1 MiB of output.
    let small = d.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap()
        .success();
    assert!(mounted, "mount a tmpfs (the tests run as root)");
    let out = run_logged(&small, "head -c 1048576 /dev/zero | tr '\\0' x; echo");
    let _ = Command::new("umount").arg(&small).status();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("is incomplete") && err.contains("No space left"),
        "{err}"
    );
}

fn plan_with(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, std::path::PathBuf) {
    let out = super::threadwise()
        .args(["plan", "--json", "-n", "2", "--policy", "none"])
        .output()
        .unwrap();
    let mut p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    edit(&mut p);
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("plan.json");
    std::fs::write(&f, p.to_string()).unwrap();
    (d, f)
}

#[test]
fn plan_files_are_validated_before_anything_starts() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|p| p["ranks"][1]["local_rank"] = 0.into()),
            "ranks must be 0..2",
        ),
        (
            Box::new(|p| p["nproc"] = 3.into()),
            "nproc is 3 but it lists 2 ranks",
        ),
        (
            Box::new(|p| p["ranks"][0]["env"]["A=B"] = "x".into()),
            "is not an environment variable name",
        ),
        (
            Box::new(|p| p["ranks"][0]["env"]["BAD\nNAME"] = "x".into()),
            "is not an environment variable name",
        ),
        (
            Box::new(|p| p["ranks"][0]["mem_nodes"] = serde_json::json!([1_000_000_000_000u64])),
            "cannot exist",
        ),
        (
            Box::new(|p| {
                p["ranks"][0]["env"]["LD_PRELOAD"] = "/nonexistent/libjemalloc.so.2".into()
            }),
            "LD_PRELOAD=/nonexistent/libjemalloc.so.2",
        ),
        (
            Box::new(|p| {
                let r = p["ranks"][0].clone();
                p["ranks"] = serde_json::Value::Array(vec![r; 9000]);
                p["nproc"] = 9000.into();
            }),
            "at most 8192",
        ),
        (
            Box::new(|p| p["schema"] = "other/1".into()),
            "schema \"other/1\"",
        ),
    ];
    for (edit, needle) in cases {
        let (d, f) = plan_with(edit);
        let marker = d.path().join("started");
        let out = Command::new(bin())
            .args(["run", "--plan"])
            .arg(&f)
            .args(["--", "sh", "-c", &format!("touch {}", marker.display())])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{needle}: {err}");
        assert!(err.contains(needle), "{needle}: {err}");
        assert!(!marker.exists(), "{needle}: a rank started");
    }
}

/// torch's `@record` writes the exception to TORCHELASTIC_ERROR_FILE; like
/// torchrun, run prints it as the failing rank's root cause.
#[test]
fn a_recorded_exception_is_the_root_cause() {
    let script = r#"
if [ "$RANK" = 1 ]; then
  printf '{"message": {"message": "ValueError: lr must be positive", "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"train.py\\", line 9, in main\\nValueError: lr must be positive\\n", "timestamp": "0"}}}' > "$TORCHELASTIC_ERROR_FILE"
  echo "noise on stderr" >&2
  exit 1
fi
[ "$TORCHELASTIC_SIGNALS_TO_HANDLE" = "SIGTERM,SIGINT,SIGHUP,SIGQUIT" ] || exit 9
sleep 5"#;
    for log_dir in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-n", "2", "-q"]);
        if log_dir {
            cmd.arg("--log-dir").arg(d.path());
        }
        let out = cmd.args(["--", "sh", "-c", script]).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("error: rank 1 (pid"), "{err}");
        assert!(err.contains("root cause (recorded by rank 1 in "), "{err}");
        assert!(err.contains("  | ValueError: lr must be positive"), "{err}");
        assert!(
            err.contains("  |   File \"train.py\", line 9, in main"),
            "{err}"
        );
        if log_dir {
            assert!(d.path().join("rank-1.error.json").is_file());
        }
    }
}
