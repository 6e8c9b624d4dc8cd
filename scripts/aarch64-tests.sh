#!/bin/bash
# The test suite's unit tests and CLI tests (plan, topo, doctor, man,
# torchrun's options, the docs' topo/plan examples), cross-built for
# aarch64 and run under qemu-user: the binary the tests start is the aarch64
# one, through binfmt_misc (registered for this run when missing, removed
# after) and Debian's cross glibc (QEMU_LD_PREFIX). qemu-user has no
# clone3, no set_mempolicy and no NUMA: launching and placement are
# checked in the aarch64 guest (scripts/aarch64-guest.sh) instead.
#   scripts/aarch64-tests.sh
# Installs what it needs when missing (gcc-aarch64-linux-gnu,
# qemu-user-static, the Rust target).
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "aarch64-tests: error: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (binfmt_misc); hint: sudo $0"
target=aarch64-unknown-linux-gnu
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if ((${#need[@]})); then
  echo "aarch64-tests: installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target" >&2

# The kernel runs aarch64 ELF files through qemu while the tests run.
misc=/proc/sys/fs/binfmt_misc
mountpoint -q "$misc" || mount -t binfmt_misc binfmt_misc "$misc" || die "cannot mount $misc"
registered=
if [ ! -e "$misc/qemu-aarch64" ]; then
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -f "$conf" ] || die "no $conf; hint: apt-get install qemu-user-static"
  cat "$conf" >"$misc/register"
  registered=1
fi
log=$(mktemp)
trap '[ -z "$registered" ] || echo -1 >"$misc/qemu-aarch64"; rm -f "$log"' EXIT

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
t0=$(date +%s)
cargo build --tests --target "$target" 2>&1 | tail -1 >&2
t1=$(date +%s)
# run WHAT CARGO-TEST-ARGS...: its summary lines; on failure, what failed.
run() {
  local what=$1
  shift
  if ! cargo test --target "$target" "$@" >"$log" 2>&1; then
    grep -E '^test .*FAILED|panicked|^error' "$log" | head -40 >&2
    die "$what failed under qemu-user (rerun: cargo test --target $target $*)"
  fi
  grep -E '^test result' "$log" | sed "s/^/  $what: /"
}
run "unit tests" --lib
t2=$(date +%s)
# The CLI modules. Skipped: the two that look for Debian's libjemalloc2 in
# /usr/lib/aarch64-linux-gnu, which an arm64 machine has and this one has not
# (qemu-user redirects opens to QEMU_LD_PREFIX, not the statx they use).
run "CLI tests" --test integration -- cli:: plans:: topologies:: doctor:: torchrun_cli:: docs_reference:: docs:: \
  --skip cli::every_exported_variable_is_documented --skip cli::planted_allocators_are_not_preloaded
t3=$(date +%s)
echo "aarch64-tests: passed under $(qemu-aarch64-static --version | head -1): build $((t1 - t0)) s, unit tests $((t2 - t1)) s, CLI tests $((t3 - t2)) s"
