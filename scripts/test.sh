#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine as root: installs what the
# tests need (hwloc's lstopo as the topology oracle, Open MPI's mpirun, the
# jemalloc and tcmalloc libraries, a one-node Slurm, two test hosts with a
# Slurm across them), then fmt, clippy, tests,
# then the wheel (scripts/test-wheel.sh: build, platform checks, a fresh venv
# running the main job, the Python helper's pytest tests), then NUMA guests
# (x86_64 and an aarch64 Grace-like one).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
cd "$(dirname "$0")/.."

need=()
command -v lstopo-no-graphics >/dev/null || need+=(hwloc-nox)
command -v tar >/dev/null || need+=(tar)
command -v mpirun >/dev/null || need+=(openmpi-bin)
# Allocators for the preload tests (threadwise itself only looks them up).
ls /usr/lib/*/libjemalloc.so.2 >/dev/null 2>&1 || need+=(libjemalloc2)
ls /usr/lib/*/libtcmalloc.so.4 >/dev/null 2>&1 || need+=(libgoogle-perftools4)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# A real one-node Slurm for the srun tests (installs and starts it).
# (the machine's own Slurm answers with no SLURM_CONF; the test hosts' does not)
if ! command -v srun >/dev/null || ! env -u SLURM_CONF scontrol ping 2>/dev/null | grep -q UP; then
  command -v srun >/dev/null || apt-get update -qq
  bash scripts/slurm-single-node.sh >/dev/null
fi
# Two test hosts (network namespaces with a Slurm across them) for the
# multi-node tests; taken down when the suite ends, whatever its result.
scripts/test-hosts.sh up 2 >/dev/null
trap 'scripts/test-hosts.sh down >/dev/null 2>&1 || true' EXIT
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
scripts/test-wheel.sh
# A live NUMA kernel: a guest under qemu (2 sockets x 2 cores on 2 nodes),
# where every rank's pages are read from /proc/PID/numa_maps
# (scripts/numa-guest.sh; about 65 s, and 1.5 minutes the first time for its
# packages). The 4-node SMT shape (100 s more) is left to the opt-in
# `scripts/numa-guest.sh all`, with the whole aarch64 check below: CI's 20
# minutes hold the README's main job (6 minutes) and one guest of each
# architecture, not more.
TW=$TW_TARGET/debug/threadwise scripts/numa-guest.sh 2s2c
# aarch64: the wheel cross-built, its binaries under qemu-user, and a
# Grace-like guest (2 CPU nodes, 2 memory-only) where run -n 2 places ranks
# through the real clone3 path (scripts/aarch64-check.sh; about 2.5 minutes;
# the unit and CLI tests under qemu-user, 6 more with their build, are left to
# the opt-in run of the whole script).
scripts/aarch64-check.sh --no-tests
