#!/usr/bin/env bash
# The GPU check: what threadwise sees on a GPU machine (topo, doctor, plan -n
# gpu, NVML, what the kernel or sandbox refuses), then the seeds' comparison
# on real hardware: a ResNet-50 training job fed by a DataLoader decoding JPEGs
# it made itself, under threads unset, torchrun, torchrun --numa-binding node,
# threadwise run and threadwise tune's winner, in interleaved rounds, with
# images/s, GPU % (NVML) and CPU %, with intervals. Writes OUT/report.md and
# OUT/report.json (and tune.json, topo.txt, doctor.txt, plan.txt, logs.txt).
# docs/gpu-check.md says how to run it on a lent machine or your own server.
#
#   scripts/gpu-check.sh OUT            on a GPU machine (about 7 minutes)
#   scripts/gpu-check.sh --dry OUT      here, on CPU: the NVML stand-in, the
#                                       GPU machine of tests/support, a tiny
#                                       model (about 2 minutes; PyTorch venv)
#
# THREADWISE: the binary (default: the wheel's, glibc 2.17, from
# scripts/wheel.sh; then target/dist, target/release; else built); PYTHON: the Python with torch (default python3; --dry: the venv of
# scripts/torch-venv.sh); GPU_CHECK_ARGS: more options for check.py
# (--rounds N, --seconds S, --tune-args "...", --seed N).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/target-dir.sh"
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dry=""
if [[ ${1:-} == --dry ]]; then
    dry=1
    shift
fi
out=${1:?usage: scripts/gpu-check.sh [--dry] OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
tw=${THREADWISE:-}
if [[ -z $tw ]]; then
    for b in "$TW_TARGET/$(uname -m)-unknown-linux-gnu/dist/threadwise" \
        "$TW_TARGET/dist/threadwise" "$TW_TARGET/release/threadwise"; do
        [[ -x $b ]] && { tw=$b; break; }
    done
fi
if [[ -z $tw ]]; then
    command -v cargo >/dev/null || { echo "gpu-check: no threadwise binary (target/dist, target/release) and no cargo to build one; set THREADWISE" >&2; exit 2; }
    (cd "$root" && cargo build --release -q)
    tw=$TW_TARGET/release/threadwise
fi
python=${PYTHON:-python3}
if [[ -n $dry ]]; then
    if [[ -z ${PYTHON:-} ]]; then
        # shellcheck source=scripts/torch-venv.sh
        (cd "$root" && . scripts/torch-venv.sh >/dev/null)
        venv=${THREADWISE_VENV:-$HOME/.cache/threadwise-venv}
        python=$venv/bin/python
    fi
    "$python" -c 'import PIL' 2>/dev/null || "$(dirname "$python")/pip" install -q pillow
    if [[ -z ${TW_GPU_CHECK_INSIDE:-} ]]; then
        # The NVML stand-in and a machine of two GPUs (tests/support): a Slurm
        # step holding GPUs 4 and 5 of eight, in a private mount namespace.
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        gcc -shared -fPIC -O2 -o "$scratch/libnvidia-ml.so.1" "$root/tests/support/nvml-standin/nvml.c"
        "$root/tests/support/gpu-machine.sh" dump slurm "$scratch/dump" >/dev/null
        # The GPUs busy 40-95% as a training job's are (the stand-in cycles the list).
        "$python" - "$scratch/dump/nvml.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for g in d["gpus"]:
    g["utilization"], g["step_ms"] = [40, 90, 95, 70], 300
    g["name"] = "NVIDIA H200 (stand-in)"
json.dump(d, open(sys.argv[1], "w"))
PY
        rc=0
        TW_GPU_CHECK_INSIDE=1 THREADWISE="$tw" PYTHON="$python" \
            THREADWISE_NVML_LIBRARY="$scratch/libnvidia-ml.so.1" THREADWISE_NVML_STANDIN="$scratch/dump/nvml.json" \
            "$root/tests/support/gpu-machine.sh" live slurm -- "$0" --dry "$out" || rc=$?
        exit $rc
    fi
fi
# shellcheck disable=SC2086
exec "$python" "$here/gpu_check/check.py" "$out" --tw "$tw" --python "$python" ${dry:+--dry} ${GPU_CHECK_ARGS:-}
