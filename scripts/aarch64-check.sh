#!/bin/bash
# Opt-in: the aarch64 wheel (Grace, Graviton), built here by cross
# compilation (scripts/wheel.sh --target aarch64-unknown-linux-gnu), and its
# binaries run under qemu-user: topo, plan -n 2, run -n 2, and the workload.
# Prints the wheel's size and the highest glibc symbol each binary needs.
# Installs qemu-user-static and gcc-aarch64-linux-gnu when missing.
#   scripts/aarch64-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
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
echo "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
for b in "$bin" "$work"; do
  echo "  $(basename "$b"): $(file -b "$b" | cut -d, -f2), needs up to $(aarch64-linux-gnu-objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
done
# The loader named explicitly: under Debian's qemu-user 7.2 with -L, these
# binaries exit 1 without a word (even --version; a C hello world runs), not
# yet understood; named this way they run.
q=(qemu-aarch64-static /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 --library-path /usr/aarch64-linux-gnu/lib)
"${q[@]}" "$bin" topo | head -1
"${q[@]}" "$bin" plan -n 2 --json | python3 -c 'import json,sys; p=json.load(sys.stdin); print("  plan -n 2:", [r["cpus"] for r in p["ranks"]])'
out=$("${q[@]}" "$bin" run -n 2 --no-doctor -- /bin/sh -c 'echo rank $RANK of $WORLD_SIZE' 2>&1)
echo "$out" | grep -c 'rank [01] of 2' | grep -qx 2 || { echo "FAIL run -n 2 under qemu-user: $out"; exit 1; }
echo "  run -n 2: $(echo "$out" | grep -o 'rank [01] of 2' | sort | tr '\n' ' ')"
"${q[@]}" "$work" --help >/dev/null && echo "  threadwise-workload --help: ok"
echo "aarch64 check passed"
