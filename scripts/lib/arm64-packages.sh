# Sourced by the aarch64 scripts: Debian's arm64 packages, fetched with apt
# into a private state (this machine's dpkg architectures and package lists
# are left alone) and unpacked under one directory.
#   arm64_packages DIR PACKAGE...   # DIR/pkgs: the packages' files; DIR/*.deb kept
arm64_packages() {
  local dir=$1 a
  shift
  mkdir -p "$dir"/apt/lists/partial "$dir"/apt/cache/archives/partial "$dir/pkgs"
  a=$(realpath "$dir/apt")
  local O=(-o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o Dir::State::Status=/dev/null
    -o APT::Architecture=arm64 -o APT::Architectures=arm64 -o APT::Sandbox::User=root)
  apt-get "${O[@]}" update -qq >&2
  local want=() name p
  for name in "$@"; do
    p=$name
    # A metapackage (linux-image-arm64) stands for the package it depends on.
    case $p in
      linux-image-arm64) p=$(apt-cache "${O[@]}" depends "$p" | awk '/Depends: linux-image-/ {print $2; exit}') ;;
    esac
    [ -n "$p" ] || { echo "arm64_packages: no $name in Debian's package lists" >&2; return 2; }
    want+=("$p")
  done
  (cd "$dir" && apt-get "${O[@]}" download -qq "${want[@]}" >&2)
  for p in "$dir"/*.deb; do dpkg-deb -x "$p" "$dir/pkgs"; done
  rm -rf "$dir"/*.deb "$dir/apt"
}
