#!/usr/bin/env bash
# Launch overhead: `threadwise run -n 8 -- true` against the processes' own cost
# (8 x `true` started by a shell) and against torchrun (when PyTorch is in the
# venv that scripts/pytorch-e2e.sh makes). Needs hyperfine (apt-get install hyperfine).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null
cargo build --release -q
tw=$PWD/target/release/threadwise
venv=${THREADWISE_VENV:-$HOME/.cache/threadwise-venv}
cmds=(
  "sh -c 'for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait'"
  "$tw run -n 8 --policy none -q -- true"
  "$tw run -n 8 --oversubscribe -q -- true"
)
if [ -x "$venv/bin/torchrun" ]; then
  cmds+=("$venv/bin/torchrun --standalone --nproc-per-node 8 --no-python true")
fi
hyperfine -N --warmup 3 --min-runs 10 --export-markdown "${1:-/dev/stdout}" "${cmds[@]}"
