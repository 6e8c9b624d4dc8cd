#!/usr/bin/env bash
# Opt-in end-to-end test with real PyTorch from PyPI (~5 GB with its CUDA
# libraries; runs on CPU with gloo): the DDP example three ways, torchrun,
# threadwise run, torchrun --no-python threadwise bind, plus a two-agent
# multi-node run on this machine and one across two test hosts (network
# namespaces, scripts/test-hosts.sh), and the wheel's Python helper placing real
# DataLoader workers under bind. Prints each throughput; fails on any error.
#   scripts/pytorch-e2e.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
. scripts/torch-venv.sh
tw=$PWD/target/release/threadwise
ex=$PWD/examples/ddp_train.py
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

check() { # name log: the run printed a throughput and each rank its placement
  local name=$1 log=$2
  grep -q "img/s: " "$log" || { echo "FAIL $name: no throughput"; cat "$log"; exit 1; }
  printf '%-44s %s\n' "$name" "$(grep -o 'img/s: [0-9.]*' "$log")"
  grep -o 'rank [0-9]/[0-9] local [0-9]: cpus [0-9,-]* torch threads [0-9]*' "$log" | sed 's/^/    /'
}

torchrun --standalone --nproc-per-node 2 "$ex" --steps "$steps" >"$out/torchrun.log" 2>&1
check "torchrun --standalone" "$out/torchrun.log"

"$tw" run -n 2 -q -- python "$ex" --steps "$steps" >"$out/run.log" 2>&1
check "threadwise run" "$out/run.log"

torchrun --standalone --nproc-per-node 2 --no-python "$tw" bind -- python "$ex" --steps "$steps" >"$out/bind.log" 2>&1
check "torchrun --no-python threadwise bind" "$out/bind.log"

# top --all finds the ranks real torchrun started through threadwise bind.
torchrun --standalone --nproc-per-node 2 --no-python "$tw" bind -- python "$ex" --steps "$steps" >"$out/bind-top.log" 2>&1 &
tr=$!
found=0
for _ in $(seq 1 60); do
  sleep 1
  n=$("$tw" top --all --once --json --interval 0.3 2>/dev/null | python -c 'import json,sys; print(len(json.load(sys.stdin)["ranks"]))' 2>/dev/null || echo 0)
  if [ "$n" -ge 2 ]; then found=1; break; fi
done
wait "$tr"
[ "$found" = 1 ] || { echo "FAIL top --all: torchrun's ranks not found"; exit 1; }
printf '%-44s %s\n' "threadwise top --all (torchrun + bind)" "found 2 ranks"

# Each bound rank got its own CPUs (disjoint), unlike torchrun's default.
for log in run bind; do
  sets=$(grep -o 'local [0-9]: cpus [0-9,-]*' "$out/$log.log" | awk '{print $4}' | sort)
  if [ "$(echo "$sets" | uniq | wc -l)" -ne 2 ]; then echo "FAIL $log: ranks share CPUs: $sets"; exit 1; fi
done

# Two agents on this machine: --nnodes 2, rendezvous on 127.0.0.1.
port=$((29400 + RANDOM % 500))
"$tw" run --nnodes 2 -n 1 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id e2e -- python "$ex" --steps 5 >"$out/node0.log" 2>&1 &
"$tw" run --nnodes 2 -n 1 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id e2e -- python "$ex" --steps 5 >"$out/node1.log" 2>&1
wait
cat "$out/node0.log" "$out/node1.log" >"$out/nodes.log"
check "threadwise run --nnodes 2 (two agents)" "$out/nodes.log"
grep -q "rank 1/2" "$out/nodes.log" || { echo "FAIL: the second node's rank did not join"; exit 1; }
# Two test hosts (network namespaces, their own addresses and names): real DDP
# (gloo) across them, each host's ranks supervised by its own threadwise; the
# ranks of one job end with the same parameters and gradients.
scripts/test-hosts.sh up 2 >/dev/null
for h in 0 1; do
  scripts/test-hosts.sh exec "host$h" "$tw" run --nnodes 2 -n 1 --rdzv-endpoint host0:29650 \
    -- python "$ex" --steps 5 >"$out/host$h.log" 2>&1 &
done
wait
cat "$out/host0.log" "$out/host1.log" >"$out/hosts.log"
check "threadwise run --nnodes 2 (two test hosts)" "$out/hosts.log"
sums=$(grep -o 'checksum params .*' "$out/hosts.log" | sort -u)
n=$(grep -c 'checksum params' "$out/hosts.log")
[ "$n" = 2 ] && [ "$(echo "$sums" | wc -l)" = 1 ] || { echo "FAIL: the hosts' ranks disagree: $(grep checksum "$out/hosts.log")"; exit 1; }
grep -q '^threadwise: host1: node 1 of 2' "$out/host1.log" || { echo "FAIL: host1 was not node 1"; cat "$out/host1.log"; exit 1; }
printf '    %s (both ranks)\n' "$sums"

# The wheel's helper under bind: every real DataLoader worker lands on its
# rank's THREADWISE_WORKER_CPUS with one thread (bind leaves no mover behind).
ls dist/threadwise-*.whl >/dev/null 2>&1 || scripts/wheel.sh >/dev/null
pip install -q --no-deps --force-reinstall dist/threadwise-*.whl
torchrun --standalone --nproc-per-node 2 --no-python "$tw" bind -- python "$ex" --helper --steps 5 >"$out/helper.log" 2>&1
check "bind + threadwise.worker_init_fn" "$out/helper.log"
python - "$out/helper.log" <<'PY'
import re, sys
lines = re.findall(r"worker (\d+) of local (\d+): cpus (\S+) torch threads (\d+) expected (\S+)", open(sys.argv[1]).read())
assert len({(w, l) for w, l, *_ in lines}) >= 4, f"want 2 workers on each of 2 ranks, got {lines}"
bad = [x for x in lines if x[2] != x[4] or x[3] != "1"]
assert not bad, f"workers off their planned CPUs or threads: {bad}"
for w, l, cpus, threads, _ in sorted(set(lines)):
    print(f"    worker {w} of local {l}: cpus {cpus} (planned), torch threads {threads}")
PY
echo "7 passed, 0 failed"
