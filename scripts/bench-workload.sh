#!/usr/bin/env bash
# Benchmark (not a test): does the built-in workload behave like real PyTorch?
# Runs the default tune search on the built-in workload with every
# configuration in every round (--runs 5 --strategy all) and prints, per
# configuration, its speed-up against `unset` and its max/min over the runs.
# With a tune report of the PyTorch example (threadwise.tune/1 JSON, e.g. from
#   threadwise tune -n 2 --export-json pt.json -- python examples/ddp_train.py)
# as the first argument it also prints the PyTorch speed-up and the ratio.
#   [WORK_SECONDS=1.5] scripts/bench-workload.sh [PYTORCH_REPORT.json] [RUNS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
pt=${1:-}
runs=${2:-5}
cargo build --release -q
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
# Each round: the machine's own speed first (one rank, one thread pinned to
# CPU 0, no workers, 3 s: a probe of this VM's drift), then every configuration once.
for r in $(seq 1 "$runs"); do
  OMP_NUM_THREADS=1 THREADWISE_NUM_WORKERS=0 taskset -c 0 $TW_TARGET/release/threadwise-workload --seconds 3 2>/dev/null \
    | grep -o 'throughput: [0-9.]*' | cut -d' ' -f2 >>"$out/probe"
  $TW_TARGET/release/threadwise tune -n 2 --runs 1 --strategy all --work-seconds "${WORK_SECONDS:-1.5}" --export-json "$out/w$r.json" >/dev/null 2>"$out/err" \
    || { cat "$out/err"; exit 1; }
done
echo "built-in workload: $runs rounds of every configuration in $(( $(date +%s) - start )) s"
python3 - "$out" "$runs" "$pt" <<'PY'
import json, statistics, sys
out, runs, pt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
probe = [float(x) for x in open(f"{out}/probe")]
rounds = [json.load(open(f"{out}/w{r}.json")) for r in range(1, runs + 1)]
names = [c["name"] for c in rounds[0]["configs"]]
vals = {n: [] for n in names}
norm = {n: [] for n in names}
for r, rep in enumerate(rounds):
    for c in rep["configs"]:
        if c["throughput"]["n"]:
            vals[c["name"]].append(c["throughput"]["median"])
            norm[c["name"]].append(c["throughput"]["median"] / probe[r])
med = {n: statistics.median(v) for n, v in vals.items() if v}
base = med[rounds[0]["baseline"]]
ps = {}
if pt:
    p = json.load(open(pt))
    pb = next(c for c in p["configs"] if c["name"] == p["baseline"])["throughput"]["median"]
    ps = {c["name"]: c["throughput"]["median"] / pb for c in p["configs"] if c["throughput"]["n"]}
print(f"machine probe (1 rank, 1 pinned thread) per round: {', '.join(f'{x:.1f}' for x in probe)}; max/min {max(probe) / min(probe):.2f}")
print("| configuration | workload median | max/min | max/min, probe-normalised | speed-up | PyTorch speed-up | workload/PyTorch |")
print("|---|---:|---:|---:|---:|---:|---:|")
worst = worst_n = 0
for n in names:
    v = vals[n]
    if not v:
        continue
    spread, spread_n = max(v) / min(v), max(norm[n]) / min(norm[n])
    worst, worst_n = max(worst, spread), max(worst_n, spread_n)
    s = med[n] / base
    p = ps.get(n)
    print(f"| {n} | {med[n]:.1f} | {spread:.2f} | {spread_n:.2f} | {s:.2f}x | {f'{p:.2f}x' if p else '-'} | {f'{s / p:.2f}' if p else '-'} |")
print(f"\nlargest max/min: {worst:.2f} raw, {worst_n:.2f} normalised by the probe")
PY
