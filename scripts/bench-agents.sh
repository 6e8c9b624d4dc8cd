#!/usr/bin/env bash
# N threadwise agents of one job on loopback (with a shared secret), each
# running one rank of `true`: how many end 0, and the time to form and end.
# Bounded: every agent gives up after --rdzv-timeout 300.
#   scripts/bench-agents.sh [N]            (default 1024; threadwise from target/release,
#                                           or THREADWISE=path)
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
tw=${THREADWISE:-$TW_TARGET/release/threadwise}
n=${1:-1024}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
head -c 32 /dev/urandom | base64 > "$d/s"
chmod 600 "$d/s"
port=$((29700 + RANDOM % 200))
ulimit -n 65536 2>/dev/null || true
t0=$(date +%s.%N)
for i in $(seq 1 "$n"); do
  "$tw" run --nnodes "$n" -n 1 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id agents \
    --rdzv-secret-file "$d/s" --rdzv-timeout 300 --heartbeat-timeout 60 --no-doctor -q \
    -- true >/dev/null 2>"$d/e$i" &
  [ "$i" = 1 ] && sleep 0.5
done
fails=0
for j in $(jobs -p); do wait "$j" || fails=$((fails + 1)); done
t1=$(date +%s.%N)
echo "$n agents: $fails failed, $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s"
[ "$fails" = 0 ] || grep -h error "$d"/e* | sort | uniq -c | head
