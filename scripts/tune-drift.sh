#!/usr/bin/env bash
# tune on a real process that drifts (issue 44's experiment): a client that
# does real work (a Python loop, timed) whose amount per image makes
# threads=1 110 img/s and threads=2 90 img/s (threads=1 22% faster) and unset
# 80, where OMP_WAIT_POLICY changes nothing (two A/A pairs), with 5% noise
# per trial; in every other tune the whole machine's speed steps 1.5x (up or
# down, at random) at a random moment. Six tunes of
#   threadwise tune -n 2 --runs 5 --grid threads=1,2 wait=active,passive
# and a line each: the winner, threads=2 against the winner, the A/A pair,
# the step, trials run; then the totals the issue asks for.
#   scripts/tune-drift.sh [TUNES] [THREADWISE]
# THREADWISE: the binary to try (default: this tree's release build), so a
# change can be compared with an older build on the same machine.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
tunes=${1:-6}
tw=${2:-}
if [ -z "$tw" ]; then
    cargo build --release -q
    tw=$TW_TARGET/release/threadwise
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/client.py" <<'PY'
import math, os, random, time
# The true rates (img/s) of a rank at full machine speed.
rate = {"unset": 80.0, "1": 110.0, "2": 90.0}[os.environ.get("OMP_NUM_THREADS", "unset")]
# The machine: 1.5x faster or slower from the step's moment on.
speed = 1.0
with open(os.environ["DRIFT_FILE"]) as f:
    at, factor = f.read().split()
if time.time() >= float(at):
    speed = float(factor)
noise = math.exp(random.gauss(0.0, 0.05))
# One image is a fixed amount of real work, calibrated once per machine
# (CALIBRATION: loop iterations per second); a trial is 40 images.
per_s = float(os.environ["CALIBRATION"])
iters = int(per_s / (rate * speed * noise))
images = 40
t = time.perf_counter()
for _ in range(images):
    x = 0
    for i in range(iters):
        x += i
elapsed = time.perf_counter() - t
if os.environ.get("LOCAL_RANK", "0") == "0":
    print(f"threadwise: throughput={images / elapsed:.2f} img/s", flush=True)
PY
# Loop iterations per second on one CPU of this machine.
calibration=$(python3 -c '
import time
n = 2_000_000
t = time.perf_counter()
x = 0
for i in range(n):
    x += i
print(int(n / (time.perf_counter() - t)))')
echo "client calibrated: $calibration loop iterations/s; threadwise: $tw"
for i in $(seq 1 "$tunes"); do
    # Odd tunes: a 1.5x step 3-18 s in (a tune takes 20-50 s on the 2-core
    # dev VM, so the step falls inside it).
    if [ $((i % 2)) -eq 1 ]; then
        python3 -c "
import random, time
print(time.time() + random.uniform(3, 18), random.choice([1.5, 1 / 1.5]))" >"$work/drift"
    else
        echo "1e12 1" >"$work/drift"
    fi
    start=$(date +%s.%N)
    DRIFT_FILE=$work/drift CALIBRATION=$calibration "$tw" tune -n 2 --runs 5 \
        --grid threads=1,2 wait=active,passive --export-json "$work/tune$i.json" \
        -- python3 "$work/client.py" >"$work/tune$i.txt" 2>&1 || {
        cat "$work/tune$i.txt"
        exit 1
    }
    end=$(date +%s.%N)
    python3 - "$work/tune$i.json" "$work/drift" "$start" "$end" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
at, factor = open(sys.argv[2]).read().split()
step = "no step" if float(at) > 1e11 else f"step {float(factor):.2f}x at +{float(at) - float(sys.argv[3]):.0f} s"
by = {c["name"]: c for c in r["configs"]}
w = r["winner"] or ""
def verdict(c):
    p = c.get("vs_winner")
    if not p:
        return "-"
    if p["high"] < 1:
        v = "slower"
    elif p["low"] > 1:
        v = "faster"
    else:
        v = "tied"
    est = p.get("estimate", p["median"])
    st = c.get("stopped")
    why = f" ({st['why']} after {st['after_round']})" if st else ""
    return f"{v} {est:.2f} [{p['low']:.2f}-{p['high']:.2f}]{why}"
t2 = [verdict(c) for n, c in by.items() if "threads=2" in n]
aa = [verdict(c) for n, c in by.items() if "threads=1" in n and n != w]
trials = sum(len(c["trials"]) for c in r["configs"])
drift = r.get("drift")
found = f"drift {drift['ratio']:.2f}x found" if drift else "no drift found"
print(f"tune {sys.argv[5]} ({step}; {found}; {trials} trials, {float(sys.argv[4]) - float(sys.argv[3]):.0f} s): "
      f"winner {w}; threads=2: {', '.join(t2)}; A/A: {', '.join(aa)}")
PY
done | tee "$work/lines"
python3 - "$work/lines" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
slower = sum(
    sum(1 for v in l.split("threads=2: ")[1].split("; A/A")[0].split(", ") if v.startswith("slower"))
    for l in lines
)
tied = sum(1 for l in lines if l.split("A/A: ")[1].startswith("tied"))
right = sum(1 for l in lines if "winner threads=1" in l)
n = len(lines)
print(f"threads=2 called slower {slower}/{2 * n}; A/A pair tied {tied}/{n}; winner right {right}/{n}")
PY
