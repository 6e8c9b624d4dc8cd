#!/usr/bin/env bash
# Benchmark (not a test): real PyTorch DDP on this machine (examples/ddp_train.py,
# 2 ranks, gloo, DataLoader workers doing per-sample CPU work), launched
# several ways in alternating rounds, so that the machine's drift hits every
# way alike. Prints each round's img/s and the medians with their ratio to
# torchrun's default.
#   scripts/bench-run-vs-torchrun.sh [ROUNDS] [STEPS] [EXAMPLE OPTIONS...]
# (e.g. `5 10 --width 16`: the ResNet-18 layout at width 16, ~115 img/s under
# torchrun here, the setting of issue 10's figures).
# Ways: torchrun's default (OMP_NUM_THREADS=1, unpinned, the script's own 2
# workers); threads unlimited (OMP_NUM_THREADS=2: what torch picks on 2 cores
# with nothing set); threadwise run's default; and grid points of run
# (workers 0/1/4, policy none, --hold off), and with BASELINE=/path/to/another/threadwise
# that build's run (way `baseline`). WAYS="torchrun run" picks some of them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
rounds=${1:-5}
steps=${2:-10}
shift $(( $# > 2 ? 2 : $# ))
. scripts/torch-venv.sh
tw=$TW_TARGET/release/threadwise
ex=$PWD/examples/ddp_train.py
args=(--steps "$steps" --warmup 3 "$@")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

declare -A cmd=(
  [torchrun]="torchrun --standalone --nproc-per-node 2 $ex ${args[*]}"
  [unlimited]="env OMP_NUM_THREADS=2 torchrun --standalone --nproc-per-node 2 $ex ${args[*]}"
  [run]="$tw run -n 2 -q -- python $ex ${args[*]}"
  [run-workers0]="$tw run -n 2 -q --workers 0 -- python $ex ${args[*]}"
  [run-workers1]="$tw run -n 2 -q --workers 1 -- python $ex ${args[*]}"
  [run-workers4]="$tw run -n 2 -q --workers 4 -- python $ex ${args[*]}"
  [run-policy-none]="$tw run -n 2 -q --policy none -- python $ex ${args[*]}"
  [run-hold-off]="$tw run -n 2 -q --hold off -- python $ex ${args[*]}"
  [baseline]="${BASELINE:-false} run -n 2 -q -- python $ex ${args[*]}"
)
order=(${WAYS:-torchrun run unlimited run-workers0 run-workers1 run-workers4 run-policy-none})
for r in $(seq 1 "$rounds"); do
  # Alternate the order each round: odd rounds forward, even rounds backward.
  if (( r % 2 == 0 )); then seq_=($(printf '%s\n' "${order[@]}" | tac)); else seq_=("${order[@]}"); fi
  for w in "${seq_[@]}"; do
    log="$out/$w.$r.log"
    if ! ${cmd[$w]} >"$log" 2>&1; then echo "FAIL $w round $r"; tail -20 "$log"; exit 1; fi
    v=$(grep -o 'img/s: [0-9.]*' "$log" | tail -1 | cut -d' ' -f2)
    echo "$w $r $v" | tee -a "$out/all"
  done
done
python3 - "$out/all" "${order[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
order = sys.argv[2:]
med = {w: statistics.median(float(v) for n, _, v in rows if n == w) for w in order}
print(f"\n| launch | img/s median | min-max | vs torchrun |\n|---|---:|---:|---:|")
for w in order:
    vs = [float(v) for n, _, v in rows if n == w]
    print(f"| {w} | {med[w]:.1f} | {min(vs):.1f}-{max(vs):.1f} | {med[w] / med['torchrun']:.2f}x |")
best = max(med, key=med.get)
line = f"\nbest: {best} {med[best]:.1f}"
if "run" in med:
    line += f"; run/best {med['run'] / med[best]:.2f}"
    if "unlimited" in med:
        line += f"; run/unlimited {med['run'] / med['unlimited']:.2f}x"
print(line)
PY
