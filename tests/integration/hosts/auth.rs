//! The rendezvous's door on the test hosts: under their Slurm, agents know
//! each other through MUNGE with nothing configured, and a credential of
//! another user is refused; with a shared secret, an agent holding another
//! one is turned away. Each time the real job forms and ends with its ranks'
//! code, and node 0 names the refused peer's address.

use std::time::Duration;

use super::*;

/// An impostor on `host` speaking the protocol by hand: its hello, then a
/// MUNGE credential for the right session made as user `nobody`; prints
/// what the host answered last.
const IMPOSTOR: &str = r#"
import json, socket, subprocess, sys, os
host, port, run_id, sock = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
nonce = os.urandom(16).hex()
for _ in range(100):
    try:
        s = socket.create_connection((host, port), timeout=15)
        break
    except OSError:
        import time; time.sleep(0.1)
f = s.makefile("rwb")
def say(m):
    f.write(json.dumps(m).encode() + b"\n"); f.flush()
def hear():
    return json.loads(f.readline())
hello = {"host": "evil", "nproc": 1, "nnodes": 2, "min_nodes": 0, "node_rank": 1,
         "run_id": run_id, "hosting": False, "port": 1234, "auth": "munge", "nonce": nonce}
say({"msg": "hello", "protocol": "threadwise.rdzv/4", "hello": hello})
# The session binds the hello as the host serialises it (its fields in order).
import hashlib
said = hashlib.sha256(json.dumps(hello, separators=(",", ":")).encode()).hexdigest()
ch = hear()
assert ch["msg"] == "challenge", ch
payload = f"threadwise.rdzv/4 agent run={run_id} agent={nonce} host={ch['nonce']} hello={said}"
cred = subprocess.run(["runuser", "-u", "nobody", "--", "munge", f"--socket={sock}", "-s", payload],
                      capture_output=True, text=True, check=True).stdout.strip()
say({"msg": "proof", "proof": cred})
print("impostor heard:", json.dumps(hear()), flush=True)
"#;

fn munge_socket() -> String {
    state_dir().join("munge/munge.socket").display().to_string()
}

#[test]
fn munge_admits_the_jobs_agents_and_refuses_another_users_credential() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    let s = rank_script(d.path(), "exit 0");
    let imp = d.path().join("impostor.py");
    std::fs::write(&imp, IMPOSTOR).unwrap();
    // Each node in a one-node allocation of its own: a Slurm job, so MUNGE.
    let node = |h: &str| {
        vec![
            "salloc".to_string(),
            "-N1".into(),
            "-w".into(),
            h.into(),
            bin(),
            "run".into(),
            "--nnodes".into(),
            "2".into(),
            "-n".into(),
            "1".into(),
            "--rdzv-endpoint".into(),
            "host0:29631".into(),
            "--rdzv-id".into(),
            "munge-job".into(),
            "--grace".into(),
            "3".into(),
            "--".into(),
            "sh".into(),
            s.clone(),
        ]
    };
    let mut n0 = start("host0", &strs(&node("host0")), d.path(), "host0");
    let out = on(
        "host1",
        &[
            "python3",
            imp.to_str().unwrap(),
            "host0",
            "29631",
            "munge-job",
            &munge_socket(),
        ],
    )
    .output()
    .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("impostor heard: {\"msg\": \"refused\"")
            && said.contains("the MUNGE credential is user 65534's, not this job's user 0's"),
        "{said}"
    );
    let mut n1 = start("host1", &strs(&node("host1")), d.path(), "host1");
    for (c, h) in [(&mut n1, "host1"), (&mut n0, "host0")] {
        assert_eq!(
            finish(c, Duration::from_secs(60)).0,
            0,
            "{}",
            read(d.path(), h)
        );
    }
    let h0 = read(d.path(), "host0");
    assert!(
        h0.contains("refused a peer at 10.77.0.11: authentication failed: the MUNGE credential is user 65534's"),
        "{h0}"
    );
    assert!(
        h0.contains("admits nodes that prove, through MUNGE"),
        "{h0}"
    );
    assert!(
        h0.contains("[rank 0] host0 RANK=0 ")
            && read(d.path(), "host1").contains("[rank 1] host1 RANK=1 ")
    );
}

#[test]
fn an_agent_with_another_secret_is_turned_away_and_the_job_forms() {
    let _g = hosts();
    let d = tempfile::tempdir().unwrap();
    // The secret is the agents', not the ranks'.
    let s = rank_script(
        d.path(),
        "test -z \"$THREADWISE_RDZV_SECRET\" || echo SECRET-LEAKED\nexit 4",
    );
    let a = agent("host0:29632", &s, &[]);
    let run = |h: &str, secret: &str, name: &str| {
        let mut c = on(h, &strs(&a));
        c.env("THREADWISE_RDZV_SECRET", secret);
        let out = std::fs::File::create(d.path().join(format!("{name}.out"))).unwrap();
        c.stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap()
    };
    let good = "a secret every node of the job shares";
    let mut n0 = run("host0", good, "host0");
    std::thread::sleep(Duration::from_millis(300));
    let mut bad = run("host1", "a secret nobody else has, as long", "bad");
    let (code, _) = finish(&mut bad, Duration::from_secs(30));
    let b = read(d.path(), "bad");
    assert_eq!(code, 3, "{b}");
    assert!(
        b.contains("the rendezvous host at host0:29632's proof fails")
            && b.contains("either it is not this job's")
            && b.contains("or something between the nodes changed this node's hello"),
        "{b}"
    );
    let mut n1 = run("host1", good, "host1");
    // The ranks' own code (4) on both nodes: the impostor changed nothing.
    for (c, h) in [(&mut n1, "host1"), (&mut n0, "host0")] {
        assert_eq!(
            finish(c, Duration::from_secs(30)).0,
            4,
            "{}",
            read(d.path(), h)
        );
    }
    assert!(
        read(d.path(), "host0")
            .contains("admits nodes that prove the shared secret (THREADWISE_RDZV_SECRET)")
    );
}
