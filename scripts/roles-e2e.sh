#!/usr/bin/env bash
# Thread roles with real PyTorch (part of scripts/pytorch-e2e.sh): the DDP
# example (gloo, DataLoader workers) under `threadwise run -n 2` and under
# `run -n 1 --roles`; halfway through, `top --once --json --pid RUN` gives each
# thread of every rank its role and mask. Every thread must be named or
# `unknown`, the gloo threads `comm`, and each on its role's CPUs (the rank's,
# or with --roles its service or team set). Prints the table it read.
#   scripts/roles-e2e.sh [STEPS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
steps=${1:-40}
. scripts/torch-venv.sh
tw=$TW_TARGET/release/threadwise
ex=$PWD/examples/ddp_train.py
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for opts in "-n 2" "-n 1 --roles"; do
  # shellcheck disable=SC2086
  "$tw" run $opts -q -- python "$ex" --steps "$steps" >"$out/run.log" 2>&1 &
  sup=$!
  # Every rank has printed its placement (DDP starts right after); then a
  # few seconds into training.
  n=${opts#-n }; n=${n%% *}
  for _ in $(seq 1 600); do
    [ "$(grep -c ' local [0-9]*: cpus ' "$out/run.log" 2>/dev/null)" -ge "$n" ] && break
    sleep 0.2
  done
  sleep 5
  "$tw" top --once --json --interval 0.5 --pid "$sup" >"$out/top.json"
  wait "$sup" || { cat "$out/run.log"; echo "FAIL roles-e2e: run $opts"; exit 1; }
  python - "$out/top.json" "$opts" <<'PY'
import json, sys
v, opts = json.load(open(sys.argv[1])), sys.argv[2]
roles = set()
for r in v["ranks"]:
    print(f"run {opts}: rank {r['local_rank']} pid {r['pid']} planned {r['planned']}")
    for t in r["by_thread"]:
        roles.add(t["role"])
        print(f"    {t['tid']:>7} {t['name']:<16} {t['role']:<10} cpus {t['cpus']:<6} role's {t['role_cpus']:<6} corrections {t['corrections']}")
        assert t["cpus"] == t["role_cpus"], f"not on its role's CPUs: {t}"
assert {"main", "comm"} <= roles, roles
PY
done
echo "roles-e2e: every thread of real PyTorch DDP ranks on its role's CPUs"
