#!/bin/bash
# A virtual test machine of a chosen NUMA shape, for what this one-node
# machine cannot show: Debian's kernel under qemu, booted by virtme-ng
# (PyPI) with this machine's root shared read-only (writes go to an
# overlay), so the project's binaries and Python run inside. Full emulation
# (TCG); NUMA_GUEST_KVM=1 tries KVM (on these machines /dev/kvm exists but a
# KVM guest fails with "KVM internal error"). Nothing stays behind: the guest
# is a process, gone when its command ends.
#
#   scripts/numa-guest.sh [SHAPE] [-- CMD...]    run CMD in the guest (default:
#                                               scripts/numa_guest/checks.sh)
#   SHAPE: 2s2c   2 sockets x 2 cores, 2 NUMA nodes, distance 20 (default)
#          4n8t   2 sockets x 2 cores x 2 threads (a Skylake-Server CPU model:
#                 TCG shows its SMT; an AMD one's it does not), 4 NUMA nodes
#                 of one core each, distances 12/20/22
#          all    both, one after the other
# Installs what it needs when missing (qemu-system-x86, busybox-static,
# linux-image-amd64 from Debian; virtme-ng from PyPI).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."
shape=${1:-2s2c}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
cmd=("$@")
[ ${#cmd[@]} -gt 0 ] || cmd=(bash scripts/numa_guest/checks.sh)

die() { echo "numa-guest: error: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (qemu and the kernel image); hint: sudo $0"
if ! command -v qemu-system-x86_64 >/dev/null || ! command -v busybox >/dev/null || ! ls /boot/vmlinuz-* >/dev/null 2>&1; then
  echo "numa-guest: installing qemu-system-x86, busybox-static, linux-image-amd64" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 busybox-static linux-image-amd64 >/dev/null
fi
command -v vng >/dev/null || { echo "numa-guest: installing virtme-ng" >&2; pip install -q virtme-ng >&2; }
# The binary the checks run: $TW, else a release build, else the test suite's debug one.
if [ -z "${TW:-}" ]; then
  for b in $TW_TARGET/release/threadwise $TW_TARGET/debug/threadwise; do
    [ -x "$b" ] && { TW=$b; break; }
  done
  [ -n "${TW:-}" ] || { cargo build --release >&2; TW=$TW_TARGET/release/threadwise; }
fi
kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
# The checks' rank that touches a buffer (the guest shares this root).
mkdir -p target/numa-guest
TOUCH=target/numa-guest/touch-numa
gcc -O2 -o "$TOUCH" scripts/numa_guest/touch.c

boot() { # shape -> vng's options for it, in the array opts
  case $1 in
    2s2c) opts=(--cpus 4 --memory 2G --numa 1G,cpus=0-1 --numa 1G,cpus=2-3 --numa-distance 0,1=20
                --qemu-opts "-smp 4,sockets=2,cores=2,threads=1") ;;
    4n8t) opts=(--cpus 8 --memory 2G --numa 512M,cpus=0-1 --numa 512M,cpus=2-3 --numa 512M,cpus=4-5
                --numa 512M,cpus=6-7 --numa-distance 0,1=12 --numa-distance 2,3=12 --numa-distance 0,2=20
                --numa-distance 0,3=22 --numa-distance 1,2=22 --numa-distance 1,3=20
                --qemu-opts "-smp 8,sockets=2,cores=2,threads=2 -cpu Skylake-Server") ;;
    *) die "unknown shape $1; hint: 2s2c, 4n8t or all" ;;
  esac
}
shapes=$shape
[ "$shape" = all ] && shapes="2s2c 4n8t"
kvm=--disable-kvm
[ "${NUMA_GUEST_KVM:-0}" = 1 ] && kvm=
for s in $shapes; do
  t0=$(date +%s.%N)
  boot "$s"
  # Through a pipe: the guest's console rewinds a file it is written to
  # (a CI log lost the first guest's lines); pipefail keeps the guest's code.
  vng --run "$kernel" $kvm "${opts[@]}" --exec "TW=$(printf '%q' "$TW") TOUCH=$(printf '%q' "$TOUCH") $(printf '%q ' "${cmd[@]}")" 2>&1 | cat
  echo "numa-guest: $s: $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s, boot included ($(basename "$kernel"), $([ -n "$kvm" ] && echo TCG || echo KVM))" >&2
done
