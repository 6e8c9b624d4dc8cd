#!/usr/bin/env bash
# Builds the wheel into dist/: `threadwise` and `threadwise-workload` on the
# venv's PATH plus the `threadwise` Python helper, for any Linux of this
# machine's architecture with glibc >= 2.17 (manylinux2014, below PyTorch's own manylinux_2_28
# floor). zig links against glibc 2.17's symbol set (maturin --zig); the
# workload's OpenMP kernels are compiled by GCC and GCC's libgomp.a is linked
# in (THREADWISE_STATIC_OPENMP=1, see build.rs), so the wheel needs no
# libgomp.so.1 and no repair step. Debug info is stripped (profile `dist`).
#
# Installs what it needs when missing: python3's venv (Debian: python3-venv),
# GCC's static libgomp (Debian: libgcc-12-dev, part of gcc), and a build venv
# (target/wheel-tools) with maturin and ziglang from PyPI. A Rust toolchain is
# assumed (rustup).
#
#   scripts/wheel.sh            # -> dist/threadwise-<version>-py3-none-manylinux_2_17_<arch>.whl
#   scripts/wheel.sh --target aarch64-unknown-linux-gnu   # cross: Grace, Graviton (Debian's
#                               # gcc-aarch64-linux-gnu compiles the kernels and gives libgomp.a)
set -euo pipefail
cd "$(dirname "$0")/.."
target=
if [ "${1:-}" = --target ]; then
  target=${2:?--target needs a Rust target triple}
fi

MATURIN=1.16.0
ZIGLANG=0.17.1
tools=target/wheel-tools

need=()
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
cc=gcc
case $target in
  "" | x86_64-unknown-linux-gnu) ;;
  aarch64-unknown-linux-gnu)
    cc=aarch64-linux-gnu-gcc
    command -v "$cc" >/dev/null || need+=(gcc-aarch64-linux-gnu)
    rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target" >&2 ;;
  *) echo "wheel.sh: error: no wheel for --target $target; hint: aarch64-unknown-linux-gnu, or none" >&2; exit 2 ;;
esac
gomp=$($cc -print-file-name=libgomp.a 2>/dev/null || true)
[ -f "$gomp" ] || [ "$cc" != gcc ] || need+=(gcc libgcc-12-dev)
if ((${#need[@]})); then
  echo "wheel.sh: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! "$tools/bin/python" -c "import importlib.metadata as m; assert m.version('maturin') == '$MATURIN' and m.version('ziglang') == '$ZIGLANG'" 2>/dev/null; then
  echo "wheel.sh: setting up $tools (maturin $MATURIN, ziglang $ZIGLANG)" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "maturin==$MATURIN" "ziglang==$ZIGLANG"
fi

start=$(date +%s)
mkdir -p dist
arch=${target%%-*}
arch=${arch:-$(uname -m)}
rm -f dist/threadwise-*"$arch".whl
THREADWISE_STATIC_OPENMP=1 THREADWISE_OPENMP_CC=$cc PATH="$PWD/$tools/bin:$PATH" \
  maturin build --locked --zig --compatibility manylinux2014 ${target:+--target "$target"} --out dist >&2
wheel=$(ls dist/threadwise-*"$arch".whl)
echo "wheel.sh: built $wheel ($(du -k "$wheel" | cut -f1) KiB) in $(($(date +%s) - start)) s" >&2
echo "$wheel"
