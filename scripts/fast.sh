#!/usr/bin/env bash
# The fast loop, for daily work: the pure and unit tests, and the integration
# tests that need no root, no Slurm, no test hosts and no guest (the planner on
# real machine dumps, the command line, the docs against the binary, the
# source's layout). No install step. The whole suite is scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --lib
cargo test --locked --test integration -- \
  layout:: plans:: topologies:: cli:: torchrun_cli:: docs::
