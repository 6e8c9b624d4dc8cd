//! The proofs, the secrets and their files.
use super::*;

fn key() -> Auth {
    secret_var("correct horse battery staple").unwrap()
}

fn s<'a>(run_id: &'a str, a: &'a str, h: &'a str, hello: &'a str) -> Session<'a> {
    Session {
        run_id,
        agent_nonce: a,
        host_nonce: h,
        hello,
    }
}

#[test]
fn an_hmac_proof_holds_for_its_transcript_only() {
    let k = key();
    let proof = k.prove(Side::Host, &s("job", "a1", "h1", "x")).unwrap();
    let p = proof.text;
    assert_eq!(p.len(), 64);
    // Both ends hold the same session key; another session, another key.
    let key = k.check(Side::Host, &s("job", "a1", "h1", "x"), &p).unwrap();
    assert!(key.is_some() && key == proof.key);
    let again = k.prove(Side::Host, &s("job", "a1", "h2", "x")).unwrap().key;
    assert_ne!(again, key);
    // Another side, run, nonce, hello or key: refused.
    for (side, run, a, h, hello) in [
        (Side::Agent, "job", "a1", "h1", "x"),
        (Side::Host, "job2", "a1", "h1", "x"),
        (Side::Host, "job", "a2", "h1", "x"),
        (Side::Host, "job", "a1", "h2", "x"),
        (Side::Host, "job", "a1", "h1", "y"),
    ] {
        assert!(k.check(side, &s(run, a, h, hello), &p).is_err());
    }
    let other = secret_var("another secret, just as long").unwrap();
    assert!(
        other
            .check(Side::Host, &s("job", "a1", "h1", "x"), &p)
            .is_err()
    );
    for junk in ["", "zz", "0", &"f".repeat(10_000)] {
        assert!(
            k.check(Side::Host, &s("job", "a1", "h1", "x"), junk)
                .is_err()
        );
    }
    assert!(format!("{k:?}").contains("secret") && !format!("{k:?}").contains("horse"));
}

/// A FIFO (or a device) given as the secret file is refused at once,
/// never waited on.
#[test]
fn a_fifo_secret_is_refused_without_blocking() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a path of our own temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = std::time::Instant::now();
    for p in [fifo.as_path(), Path::new("/dev/zero")] {
        let e = secret_file_auth(p).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn nonces_are_fresh() {
    let (a, b) = (nonce().unwrap(), nonce().unwrap());
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
        matches!(e, AuthError::Exposed { mode: 0o644, .. })
            && crate::error::Hinted::hint(&e).contains("chmod 600")
    );
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The file and the variable agree (a trailing newline is not the secret's).
    let (a, b) = (
        secret_file_auth(&f).unwrap(),
        secret_var("0123456789abcdef0123").unwrap(),
    );
    let p = a.prove(Side::Agent, &s("r", "x", "y", "z")).unwrap().text;
    assert!(b.check(Side::Agent, &s("r", "x", "y", "z"), &p).is_ok());
    assert!(matches!(
        secret_file_auth(&d.path().join("none")),
        Err(AuthError::Unreadable { .. })
    ));
    // A link to it is read as the file it names (Kubernetes mounts
    // secrets so); a directory is refused.
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&f, &link).unwrap();
    assert!(secret_file_auth(&link).is_ok());
    assert!(matches!(
        secret_file_auth(d.path()),
        Err(AuthError::Unreadable { why, .. }) if why.contains("not a regular file")
    ));
}

#[test]
fn a_secret_file_of_another_user_is_refused() {
    if crate::os::euid() != 0 {
        return; // only root can give a file away
    }
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("s");
    std::fs::write(&f, "0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
    let e = secret_file_auth(&f).unwrap_err();
    assert!(
        matches!(
            e,
            AuthError::NotOwned {
                owner: 65534,
                me: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("belongs to user 65534")
            && crate::error::Hinted::hint(&e).contains("chown")
    );
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

/// A door ticket holds for its run, nonce and window (or the next and last),
/// under the job's secret only; open and other secrets make none.
#[test]
fn a_door_ticket_holds_for_its_run_nonce_and_window_only() {
    let k = key();
    let now = 1_000_000_u64;
    let t = k.ticket("job", "n1", now);
    assert_eq!(t.len(), 64);
    assert!(k.ticket_ok("job", "n1", &t, now));
    assert!(k.ticket_ok("job", "n1", &t, now + TICKET_WINDOW));
    assert!(
        !k.ticket_ok("job", "n1", &t, now + 3 * TICKET_WINDOW),
        "stale"
    );
    assert!(!k.ticket_ok("job", "n2", &t, now));
    assert!(!k.ticket_ok("job2", "n1", &t, now));
    let other = secret_var("another secret, just as long").unwrap();
    assert!(!other.ticket_ok("job", "n1", &t, now));
    assert!(Auth::Open.ticket("job", "n1", now).is_empty());
    assert!(!Auth::Open.ticket_ok("job", "n1", &t, now));
    assert!(!k.ticket_ok("job", "n1", "zz", now));
}
