#!/bin/bash
# An aarch64 guest of a Grace-like shape, for what qemu-user cannot show
# (no clone3 there, no NUMA): Debian's arm64 kernel under
# qemu-system-aarch64 (full emulation), booted straight into an initramfs
# built here of busybox (Debian's arm64 busybox-static), the cross glibc,
# the aarch64 wheel's two binaries and a static touch program
# (scripts/numa_guest/touch.c). The shape, as a GB200's host sees itself:
# two Grace CPU nodes of 2 CPUs (one socket each) and two memory-only nodes
# standing in for the GPUs' memory, with distances 10/40 between CPU nodes
# and 80/120 to GPU memory. scripts/numa_guest/grace.sh runs inside;
# scripts/numa_guest/grace_check.py checks what it reports. Nothing stays
# behind but the downloaded packages (kernel, busybox, lstopo), cached in
# target/aarch64-guest/.
#
#   scripts/aarch64-guest.sh [WHEEL]   (default: dist/*aarch64.whl, built by
#                                       scripts/wheel.sh --target when missing)
# Installs what it needs when missing (qemu-system-arm, gcc-aarch64-linux-gnu, cpio).
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "aarch64-guest: error: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (apt for the kernel); hint: sudo $0"
need=()
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
command -v cpio >/dev/null || need+=(cpio)
if ((${#need[@]})); then
  echo "aarch64-guest: installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
wheel=${1:-$(ls dist/threadwise-*aarch64.whl 2>/dev/null | tail -1)}
[ -n "$wheel" ] || wheel=$(scripts/wheel.sh --target aarch64-unknown-linux-gnu)
[ -f "$wheel" ] || die "no wheel at $wheel; hint: scripts/wheel.sh --target aarch64-unknown-linux-gnu"

# Debian's arm64 kernel, busybox and lstopo (scripts/lib/arm64-packages.sh).
cache=target/aarch64-guest
if ! ls "$cache"/pkgs/boot/vmlinuz-* >/dev/null 2>&1 || [ ! -x "$cache/pkgs/bin/busybox" ]; then
  echo "aarch64-guest: fetching Debian's arm64 kernel, busybox-static and hwloc-nox (lstopo)" >&2
  . scripts/lib/arm64-packages.sh
  rm -rf "$cache"
  arm64_packages "$cache" linux-image-arm64 busybox-static hwloc-nox libhwloc15 libtinfo6 libudev1
  rm -rf "$cache"/pkgs/lib/modules
fi
kernel=$(ls "$cache"/pkgs/boot/vmlinuz-* | tail -1)

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
root=$dir/root
mkdir -p "$root"/{bin,lib,usr/bin,proc,sys,dev,tmp}
python3 -m zipfile -e "$wheel" "$dir/wheel"
cp "$dir"/wheel/*.data/scripts/threadwise "$dir"/wheel/*.data/scripts/threadwise-workload "$root/usr/bin/"
chmod +x "$root"/usr/bin/threadwise*
aarch64-linux-gnu-gcc -O2 -static -o "$root/usr/bin/touch-numa" scripts/numa_guest/touch.c
cp "$cache/pkgs/bin/busybox" "$root/bin/"
cp "$cache/pkgs/usr/bin/lstopo-no-graphics" "$root/usr/bin/"
cp -L "$cache"/pkgs/{,usr/}lib/aarch64-linux-gnu/lib*.so.* "$root/lib/"
for l in ld-linux-aarch64.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 libgcc_s.so.1 librt.so.1; do
  cp -L "/usr/aarch64-linux-gnu/lib/$l" "$root/lib/"
done
cp scripts/numa_guest/grace.sh "$root/grace.sh"
cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs tmpfs /tmp
ip link set lo up
export PATH=/usr/bin:/bin HOME=/tmp
sh /grace.sh
echo "@@exit $?"
poweroff -f
EOF
chmod +x "$root/init" "$root/grace.sh"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initrd"

m=512M
qemu=(qemu-system-aarch64 -M virt,gic-version=3 -cpu max -smp 4,sockets=2,cores=2,threads=1 -m 2G
  -object memory-backend-ram,id=m0,size=$m -object memory-backend-ram,id=m1,size=$m
  -object memory-backend-ram,id=m2,size=$m -object memory-backend-ram,id=m3,size=$m
  -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1
  -numa node,nodeid=2,memdev=m2 -numa node,nodeid=3,memdev=m3
  -numa dist,src=0,dst=1,val=40 -numa dist,src=0,dst=2,val=80 -numa dist,src=0,dst=3,val=120
  -numa dist,src=1,dst=2,val=120 -numa dist,src=1,dst=3,val=80 -numa dist,src=2,dst=3,val=120
  -kernel "$kernel" -initrd "$dir/initrd" -append "console=ttyAMA0 quiet panic=-1"
  -nographic -no-reboot)
t0=$(date +%s.%N)
# Through a pipe (a console rewinds a file it writes to); the guest's own
# exit code comes back as its @@exit line.
timeout 900 "${qemu[@]}" </dev/null 2>&1 | tr -d '\r' | tee "$dir/console" | grep -av '^@@' || true
secs=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}")
echo "aarch64-guest: $(basename "$kernel"), qemu-system-aarch64 (TCG, -cpu max), 4 CPUs on 2 of 4 NUMA nodes: $secs s, boot included" >&2
python3 scripts/numa_guest/grace_check.py "$dir/console"
