#!/bin/bash
# Opt-in (part of scripts/pytorch-e2e.sh): an elastic PyTorch DDP job (gloo)
# across three test hosts, MIN 2, MAX 3, under threadwise run and then under
# torchrun the same way. Two hosts start it, the third joins (world 2 -> 3),
# the third's agent is SIGKILLed (world 3 -> 2), training finishes from its
# checkpoints. For threadwise it checks: both survivors exit 0, every step's
# loss is logged once, steps ran in worlds of 2 and 3, nothing is left
# running. For both it prints the time from the join to the world of 3's
# first rank start and from the SIGKILL to the survivors' next round.
#   scripts/elastic-e2e.sh [STEPS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
steps=${1:-60}
[ -n "${VIRTUAL_ENV:-}" ] || . scripts/torch-venv.sh
tw=$TW_TARGET/release/threadwise
ex=$PWD/examples/elastic_train.py
out=$(mktemp -d)
scripts/test-hosts.sh down >/dev/null 2>&1 || true
scripts/test-hosts.sh up 3 >/dev/null
trap 'scripts/test-hosts.sh down >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT

now() { date +%s.%N; }
# The first rank start of a world of $2 after time $3 in starts log $1 (waits up to $4 s).
first_start() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$4" ]; do
    local t
    t=$(awk -v w="$2" -v after="$3" '$3 == w && $1 >= after { print $1; exit }' "$1" 2>/dev/null || true)
    [ -n "$t" ] && { echo "$t"; return 0; }
    sleep 0.1
  done
  return 1
}

# Wait (up to 60 s) until a world of $2 has written a checkpoint (every 5 steps).
checkpointed() {
  local t1=$SECONDS
  until awk -v w="$2" '$4 == w && ($2 + 1) % 5 == 0 { found = 1 } END { exit !found }' "$1/steps.log" 2>/dev/null; do
    [ $((SECONDS - t1)) -lt 60 ] || return 0
    sleep 0.2
  done
}

# launcher name port: start agents on host0 and host1, then host2, then kill host2's.
elastic() {
  local name=$1 port=$2 dir=$out/$1
  mkdir -p "$dir"
  local cmd
  case $name in
    threadwise) cmd=("$tw" run --nnodes 2:3 --max-restarts 3 -n 1 --rdzv-endpoint "host0:$port"
                    --rdzv-conf last_call_timeout=2 --rdzv-id elastic -- python "$ex" "$dir" "$steps") ;;
    torchrun) cmd=(torchrun --nnodes 2:3 --max-restarts 3 --nproc-per-node 1 --rdzv-backend c10d
                   --rdzv-endpoint "host0:$port" --rdzv-conf last_call_timeout=2 --rdzv-id elastic
                   "$ex" "$dir" "$steps") ;;
  esac
  local t0 pids=()
  t0=$(now)
  for h in 0 1; do
    scripts/test-hosts.sh exec "host$h" "${cmd[@]}" >"$dir/host$h.log" 2>&1 &
    pids+=($!)
    sleep 0.3
  done
  local formed grown="" shrunk="" joined killed
  formed=$(first_start "$dir/starts.log" 2 "$t0" 60) || { echo "FAIL $name: no world of 2"; tail -5 "$dir"/host*.log; return 1; }
  checkpointed "$dir" 2
  joined=$(now)
  scripts/test-hosts.sh exec host2 "${cmd[@]}" >"$dir/host2.log" 2>&1 &
  local third=$!
  grown=$(first_start "$dir/starts.log" 3 "$joined" 40) || grown=""
  # Kill once the world of 3 has checkpointed (its steps then stay in the log).
  if [ -n "$grown" ]; then checkpointed "$dir" 3; else sleep 3; fi
  # SIGKILL the third host's launcher: the background job's pid is it
  # (test-hosts.sh exec execs nsenter, which execs the command).
  killed=$(now)
  kill -KILL "$third"
  wait "$third" 2>/dev/null || true
  shrunk=$(first_start "$dir/starts.log" 2 "$killed" 40) || shrunk=""
  local codes=()
  for p in "${pids[@]}"; do
    if timeout 120 tail --pid="$p" -f /dev/null; then wait "$p" && codes+=(0) || codes+=($?); else codes+=(timeout); kill -KILL "$p" 2>/dev/null || true; fi
  done
  wait 2>/dev/null || true
  printf '%-12s world 2 formed in %.1f s; join -> world 3: %s; SIGKILL -> world 2: %s; survivors exit %s\n' "$name" \
    "$(echo "$formed - $t0" | bc)" \
    "$([ -n "$grown" ] && printf '%.2f s' "$(echo "$grown - $joined" | bc)" || echo 'none in 40 s')" \
    "$([ -n "$shrunk" ] && printf '%.2f s' "$(echo "$shrunk - $killed" | bc)" || echo 'none in 40 s')" \
    "${codes[*]}"
  echo "${codes[*]}" >"$dir/codes"
}

elastic threadwise 29660
d=$out/threadwise
[ "$(cat "$d/codes")" = "0 0" ] || { echo "FAIL: threadwise survivors did not exit 0"; tail -20 "$d"/host*.log; exit 1; }
got=$(awk '{print $2}' "$d/steps.log" | tr '\n' ' ')
want=$(seq 0 $((steps - 1)) | tr '\n' ' ')
[ "$got" = "$want" ] || { echo "FAIL: steps logged: $got"; exit 1; }
grep -q 'world 3' "$d/steps.log" && grep -q 'world 2' "$d/steps.log" || { echo "FAIL: no steps in both worlds"; cat "$d/steps.log"; exit 1; }
if pgrep -f "$ex $d" >/dev/null; then echo "FAIL: ranks left running"; pgrep -af "$ex $d"; exit 1; fi
printf '    %s steps, each logged once; worlds %s\n' "$steps" "$(awk '{print $4}' "$d/steps.log" | uniq | tr '\n' ' ')"
elastic torchrun 29670 || true
pkill -KILL -f "$ex $out/torchrun" 2>/dev/null || true
