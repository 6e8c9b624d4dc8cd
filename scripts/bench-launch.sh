#!/usr/bin/env bash
# Launch overhead as a user compares it: `threadwise run -n 2 -- true` and
# `run -n 8 --oversubscribe -- true` interleaved with torchrun's
# `--nproc-per-node 2 --no-python true` (one after the other, alternating,
# ROUNDS rounds, default 10), so each threadwise launch runs right after a
# torchrun one, as in a side-by-side comparison. Prints each command's median
# wall time and threadwise's as a share of torchrun's, beside the floor (the
# same processes started by sh). Needs the PyTorch venv
# (scripts/torch-venv.sh); without it, only threadwise's figures. With
# BASELINE=/path/to/another/threadwise, that binary's `run -n 2` and `-n 8`
# too, in the same rounds (an A/B of a change). Each threadwise line also
# gives the median over rounds of its time over the shell's for the same
# number of processes in that round (paired, so drift between rounds cancels).
#   scripts/bench-launch.sh [ROUNDS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
cargo build --release -q
tw=$TW_TARGET/release/threadwise
venv=${THREADWISE_VENV:-$HOME/.cache/threadwise-venv}
torchrun=""
[ -x "$venv/bin/torchrun" ] && torchrun="$venv/bin/torchrun"
python3 - "$tw" "${1:-10}" "$torchrun" "${BASELINE:-}" <<'PY'
import statistics, subprocess, sys, time
tw, rounds, torchrun, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cmds = {}
if torchrun:
    cmds["torchrun -n 2"] = [torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", "true"]
cmds["threadwise run -n 2"] = [tw, "run", "-n", "2", "-q", "--", "true"]
cmds["threadwise run -n 8"] = [tw, "run", "-n", "8", "--oversubscribe", "-q", "--", "true"]
if baseline:
    cmds["baseline run -n 2"] = [baseline, "run", "-n", "2", "-q", "--", "true"]
    cmds["baseline run -n 8"] = [baseline, "run", "-n", "8", "--oversubscribe", "-q", "--", "true"]
# The floor: the same processes started by a shell, with nothing else.
cmds["sh: 2 x true"] = ["sh", "-c", "/bin/true & /bin/true & wait"]
cmds["sh: 8 x true"] = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait"]
times = {k: [] for k in cmds}
for _ in range(rounds):
    for k, c in cmds.items():
        t = time.perf_counter()
        subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times[k].append(time.perf_counter() - t)
for k, v in times.items():
    v_ms = sorted(x * 1000 for x in v)
    line = f"{k:<22} median {statistics.median(v_ms):8.1f} ms  [min {v_ms[0]:.1f}, max {v_ms[-1]:.1f}] over {rounds} rounds"
    if torchrun and k.startswith(("threadwise", "baseline")):
        share = 100 * statistics.median(v) / statistics.median(times["torchrun -n 2"])
        line += f"  = {share:.2f}% of torchrun -n 2"
    if k.startswith(("threadwise", "baseline")):
        floor = times["sh: " + k.split()[-1] + " x true"]
        ratio = statistics.median(a / b for a, b in zip(v, floor))
        line += f"  = {ratio:.2f}x the shell's"
    print(line)
PY
