# Where cargo puts the binaries: $CARGO_TARGET_DIR (a shared build cache)
# when set, else the repository's target/; absolute, so it holds after a cd.
# Sourced by every script that runs a built binary: TW_TARGET.
TW_TARGET=${CARGO_TARGET_DIR:-target}
case $TW_TARGET in
  /*) ;;
  *) TW_TARGET=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/$TW_TARGET ;;
esac
export TW_TARGET
