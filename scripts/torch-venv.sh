# Sourced by the PyTorch scripts: a venv with torch from PyPI (~5 GB with its
# CUDA libraries; runs on CPU), made once at $THREADWISE_VENV, on PATH; and a
# release build of threadwise.
venv=${THREADWISE_VENV:-$HOME/.cache/threadwise-venv}
if [ ! -x "$venv/bin/torchrun" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch numpy
fi
export PATH="$venv/bin:$PATH"
cargo build --release -q
