#!/usr/bin/env bash
# Output throughput and memory: `threadwise run -n 2` with each rank printing
# 100 MB (200 MB in all) of short lines, with and without --log-dir, against
# `cat` of the same bytes to a file; and tune's own peak RSS while a trial
# prints 60 MB (the output is parsed as it streams, never kept).
# Needs hyperfine (installed when missing).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null
cargo build --release -q
tw=$TW_TARGET/release/threadwise
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# 100 MB per rank: 1,000,000 lines of 100 bytes.
line=$(printf '%099d' 0)
{ yes "$line" || true; } | head -c 100000000 > "$d/100M"
gen="head -c 100000000 $d/100M"
hyperfine -N --warmup 1 --min-runs 5 --export-markdown "${1:-/dev/stdout}" \
  "sh -c 'cat $d/100M $d/100M > $d/cat.out'" \
  "sh -c '$tw run -n 2 -q --no-prefix -- $gen > $d/run.out'" \
  "sh -c '$tw run -n 2 -q -- $gen > $d/run.out'" \
  "sh -c '$tw run -n 2 -q --log-dir $d/logs -- $gen > $d/run.out'" \
  "sh -c '$tw run -n 2 -q --log-dir $d/logs -- $gen > /dev/null'"
cmp <(cat "$d/100M") "$d/logs/rank-0.stdout" && echo "log file byte-exact: yes"
echo
echo "tune with 60 MB of output per trial (peak RSS of threadwise itself):"
/usr/bin/time -f "  max RSS %M KiB, %e s" "$tw" tune -n 1 --runs 1 --grid threads=1 \
  -- sh -c "head -c 60000000 $d/100M; echo 42 img/s" > /dev/null
