#!/usr/bin/env bash
# What holding threads in place costs the supervisor: `threadwise run -n 16
# --oversubscribe` of ranks with 16 threads each (python3 starting 15
# sleeping threads), the supervisor's own CPU time (utime + stime of its
# /proc/PID/stat, which leaves the ranks out) read over SECS seconds of the
# steady state, as % of one core. Rows: --hold on (the default, ticking every
# 100 ms), --hold off (the same reads, no setting), and with
# BASELINE=/path/to/another/threadwise that build (before the holder) too.
#   scripts/bench-hold.sh [SECS]     (default 16)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
cargo build --release -q
tw=$TW_TARGET/release/threadwise
python3 - "$tw" "${1:-16}" "${BASELINE:-}" <<'PY'
import os, subprocess, sys, time
tw, secs, baseline = sys.argv[1], float(sys.argv[2]), sys.argv[3]
hz = os.sysconf("SC_CLK_TCK")
rank = ("import threading, time\n"
        f"ts = [threading.Thread(target=time.sleep, args=({secs + 6},)) for _ in range(15)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz
rows = [("--hold on", [tw, "run", "-n", "16", "--oversubscribe", "-q"]),
        ("--hold off", [tw, "run", "-n", "16", "--oversubscribe", "-q", "--hold", "off"])]
if baseline:
    rows.append(("baseline", [baseline, "run", "-n", "16", "--oversubscribe", "-q"]))
for name, cmd in rows:
    p = subprocess.Popen(cmd + ["--", "python3", "-c", rank],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    c0, t0 = cpu(p.pid), time.monotonic()
    time.sleep(secs)
    c1, t1 = cpu(p.pid), time.monotonic()
    threads = sum(len(os.listdir(f"/proc/{k}/task"))
                  for k in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
                  if os.path.exists(f"/proc/{k}/task"))
    p.wait()
    print(f"{name:<12} supervisor {100 * (c1 - c0) / (t1 - t0):5.2f}% of a core over "
          f"{t1 - t0:.0f} s, 16 ranks, {threads} threads in their processes")
PY
