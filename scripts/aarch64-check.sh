#!/bin/bash
# The aarch64 build (Grace, Graviton), four ways. scripts/test.sh runs all but
# the third; the whole script is the opt-in check before a change to
# launching, placement or memory policy.
#   1. the wheel, cross-built (scripts/wheel.sh --target aarch64-unknown-linux-gnu):
#      its size and the highest glibc symbol each binary needs;
#   2. its binaries under qemu-user: topo, plan -n 2, run -n 2, the workload's --help;
#   3. the unit and CLI tests under qemu-user (scripts/aarch64-tests.sh);
#   4. an aarch64 guest of a Grace-like shape, where run -n 2 places ranks
#      through the real clone3 path (scripts/aarch64-guest.sh).
# Installs what it needs when missing (qemu-user-static, qemu-system-arm,
# gcc-aarch64-linux-gnu, the Rust target; Debian's arm64 kernel).
#   scripts/aarch64-check.sh [--no-tests]   (--no-tests: all but the third,
#                                            which costs 5 minutes more)
set -euo pipefail
cd "$(dirname "$0")/.."
tests=1
case ${1:-} in
  "") ;;
  --no-tests) tests=0 ;;
  *) echo "aarch64-check: error: unknown argument ${1}; hint: --no-tests, or none" >&2; exit 2 ;;
esac
command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static gcc-aarch64-linux-gnu >/dev/null
}
wheel=$(scripts/wheel.sh --target aarch64-unknown-linux-gnu)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -m zipfile -e "$wheel" "$dir"
bin=$(ls "$dir"/*.data/scripts/threadwise)
work=$(ls "$dir"/*.data/scripts/threadwise-workload)
# (zipfile drops the mode: under qemu-user a file without x exits 1 silently)
chmod +x "$bin" "$work"
echo "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
for b in "$bin" "$work"; do
  echo "  $(basename "$b"): $(file -b "$b" | cut -d, -f2), needs up to $(aarch64-linux-gnu-objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
done
q=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
"${q[@]}" "$bin" topo >"$dir/topo" && head -1 "$dir/topo"   # (not piped to head: pipefail)
"${q[@]}" "$bin" plan -n 2 --json | python3 -c 'import json,sys; p=json.load(sys.stdin); print("  plan -n 2:", [r["cpus"] for r in p["ranks"]])'
out=$("${q[@]}" "$bin" run -n 2 --no-doctor -- /bin/sh -c 'echo rank $RANK of $WORLD_SIZE' 2>&1)
echo "$out" | grep -c 'rank [01] of 2' | grep -qx 2 || { echo "FAIL run -n 2 under qemu-user: $out"; exit 1; }
echo "  run -n 2: $(echo "$out" | grep -o 'rank [01] of 2' | sort | tr '\n' ' ')"
# Only --help here: the workload's loader workers re-exec its binary, which
# under qemu-user without binfmt_misc fails (the guest runs it whole).
"${q[@]}" "$work" --help >/dev/null && echo "  threadwise-workload --help: ok"
t0=$(date +%s)
[ "$tests" = 0 ] || scripts/aarch64-tests.sh
t1=$(date +%s)
scripts/aarch64-guest.sh "$wheel"
echo "aarch64 check passed (tests $((t1 - t0)) s, guest $(($(date +%s) - t1)) s)"
