#!/usr/bin/env bash
# An A/B of launch time: this tree's `threadwise run -n N --oversubscribe -q
# -- true` against another build's (BASELINE), N = 2 and 8, in pairs whose
# order alternates (so neither side always runs on a warmer cache), ROUNDS
# pairs (default 200), beside a shell starting the same N processes. Prints
# each side's median, the paired median of this/baseline with its
# interquartile range, and each side's median ratio to the shell.
#   BASELINE=/path/to/threadwise scripts/bench-launch-ab.sh [ROUNDS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
: "${BASELINE:?BASELINE=/path/to/another/threadwise}"
cargo build --release -q
python3 - "$TW_TARGET/release/threadwise" "$BASELINE" "${1:-200}" <<'PY'
import statistics, subprocess, sys, time
new, old, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

def once(argv):
    t = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t

for n in (2, 8):
    run = lambda b: [b, "run", "-n", str(n), "--oversubscribe", "-q", "--", "true"]
    # The floor as bench-launch.sh has it (no `seq` to exec).
    sh = ["sh", "-c", f"for i in {' '.join(map(str, range(n)))}; do /bin/true & done; wait"]
    t = {"this": [], "baseline": [], "sh": []}
    for i in range(rounds):
        pair = [("this", new), ("baseline", old)]
        for k, b in pair if i % 2 == 0 else reversed(pair):
            t[k].append(once(run(b)))
        t["sh"].append(once(sh))
    r = sorted(a / b for a, b in zip(t["this"], t["baseline"]))
    q = lambda f: r[int(f * (len(r) - 1))]
    ms = lambda k: statistics.median(t[k]) * 1000
    to_sh = lambda k: statistics.median(a / b for a, b in zip(t[k], t["sh"]))
    print(f"-n {n}: this {ms('this'):.2f} ms, baseline {ms('baseline'):.2f} ms, "
          f"paired {statistics.median(r):.3f} [IQR {q(0.25):.3f}-{q(0.75):.3f}]; "
          f"shell {ms('sh'):.2f} ms: this {to_sh('this'):.2f}x, baseline {to_sh('baseline'):.2f}x "
          f"({rounds} pairs)")
PY
