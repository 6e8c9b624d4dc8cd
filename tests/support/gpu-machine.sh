#!/usr/bin/env bash
# GPU machines as the tests need them, without a GPU: the evidence threadwise
# reads (PCI devices in sysfs, /proc/driver/nvidia, device nodes, the job's
# environment) laid out as a real machine shows it.
#
#   gpu-machine.sh dump SCENARIO OUT
#       A --root dump: a real 2-socket machine's /sys + /proc (hwloc's
#       32intel64-2p8co2t+8ve) with 8 GPUs planted on its PCI bus, 0-3 local
#       to NUMA node 0 and 4-7 to node 1, and OUT/proc/self/environ holding
#       the job's environment. OUT/nvml.json describes what NVML lists there
#       (for the NVML stand-in). Scenarios:
#         whole      the server seen whole: every GPU's node, no variables
#         container  docker --gpus '"device=3,5"': only /dev/nvidia3 and 5,
#                    NVIDIA_VISIBLE_DEVICES=3,5, CUDA_VISIBLE_DEVICES unset
#         slurm      a Slurm step holding GPUs 4 and 5 (ConstrainDevices):
#                    their nodes only, CUDA_VISIBLE_DEVICES=0,1 re-indexed,
#                    SLURM_STEP_GPUS=SLURM_JOB_GPUS=4,5
#         uuid       the container, CUDA_VISIBLE_DEVICES by UUID (5, then 3)
#         mig        a pod with two MIG slices of GPU 0 (NVIDIA_VISIBLE_DEVICES
#                    names them); NVML lists the slices
#         amd        8 AMD GPUs (render nodes), ROCR_VISIBLE_DEVICES=2,6
#
#   gpu-machine.sh live SCENARIO -- CMD...
#       Run CMD on this machine inside a private mount namespace whose
#       /sys/bus/pci/devices, /proc/driver and /dev show 8 NVIDIA GPUs local
#       to this machine's CPUs, with real character device nodes (195:N, no
#       driver behind them) and a real cgroup v1 devices controller denying
#       the nodes the scenario withholds. Scenarios: whole, slurm (all eight
#       nodes exist, the cgroup lets the job open 4 and 5 only). Root only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base="$here/../data/topologies/linux/32intel64-2p8co2t+8ve.tar.gz"

BUS=(0000:07:00.0 0000:0f:00.0 0000:47:00.0 0000:4e:00.0 0000:87:00.0 0000:90:00.0 0000:b7:00.0 0000:bd:00.0)
uuid() { printf 'GPU-5d0c1b3a-7e21-4c8f-9a6b-%012d' "$1"; }
mig() { printf 'MIG-8e5b6a4c-1d2f-5a3b-9c7d-%012d' "$1"; }

# plant_gpus SYSROOT VENDOR CLASS CPUS0 CPUS1 NODE1: PCI device directories.
plant_gpus() {
  local root=$1 vendor=$2 class=$3 cpus0=$4 cpus1=$5 node1=$6 i d
  for i in "${!BUS[@]}"; do
    d="$root/${BUS[$i]}"
    mkdir -p "$d"
    echo "$vendor" >"$d/vendor"
    echo 0x20b0 >"$d/device"
    echo "$class" >"$d/class"
    if ((i < 4)); then echo 0 >"$d/numa_node"; echo "$cpus0" >"$d/local_cpulist"
    else echo "$node1" >"$d/numa_node"; echo "$cpus1" >"$d/local_cpulist"; fi
    echo 16 >"$d/current_link_width"; echo 16 >"$d/max_link_width"
    echo "16.0 GT/s PCIe" >"$d/current_link_speed"; echo "16.0 GT/s PCIe" >"$d/max_link_speed"
  done
}

# driver_table PROCDRIVER: /proc/driver/nvidia/gpus/<bus>/information.
driver_table() {
  local i d
  for i in "${!BUS[@]}"; do
    d="$1/nvidia/gpus/${BUS[$i]}"
    mkdir -p "$d"
    printf 'Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t %d\nGPU UUID: \t %s\nVideo BIOS: \t 92.00.36.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n' \
      $((100 + i)) "$(uuid "$i")" "${BUS[$i]}" "$i" >"$d/information"
  done
}

# nvml_json GPU-INDEX...: what NVML lists (a container lists its own GPUs).
nvml_json() {
  local first=1 i
  printf '{"driver_version": "550.54.15", "gpus": ['
  for i in "$@"; do
    ((first)) || printf ','
    first=0
    printf '\n  {"bus_id": "%s", "uuid": "%s", "minor": %d, "utilization": %d, "memory_total_mib": 81920, "memory_used_mib": 0, "job_process_memory_mib": 2048}' \
      "${BUS[$i]}" "$(uuid "$i")" "$i" $((10 * i + 5))
  done
  printf '\n]}\n'
}

environ() { # KEY=VALUE... -> NUL-separated
  { printf 'PATH=/usr/bin:/bin\0'; for kv in "$@"; do printf '%s\0' "$kv"; done; } >"$out/proc/self/environ"
}

dump() {
  local scenario=$1 out=$2 i nodes=()
  rm -rf "$out"
  mkdir -p "$out"
  tar xzf "$base" -C "$out"
  local pci="$out/sys/bus/pci/devices"
  mkdir -p "$out/dev" "$out/proc/self"
  case $scenario in
    amd)
      plant_gpus "$pci" 0x1002 0x038000 0-7,16-23 8-15,24-31 1
      mkdir -p "$out/sys/class/drm" "$out/dev/dri"
      for i in "${!BUS[@]}"; do
        mkdir -p "$out/sys/class/drm/renderD$((128 + i))"
        ln -s "../../../bus/pci/devices/${BUS[$i]}" "$out/sys/class/drm/renderD$((128 + i))/device"
        : >"$out/dev/dri/renderD$((128 + i))"
      done
      environ ROCR_VISIBLE_DEVICES=2,6
      echo '{"gpus": []}' >"$out/nvml.json"
      return ;;
  esac
  plant_gpus "$pci" 0x10de 0x030200 0-7,16-23 8-15,24-31 1
  driver_table "$out/proc/driver"
  : >"$out/dev/nvidiactl"
  case $scenario in
    whole) nodes=(0 1 2 3 4 5 6 7); environ; nvml_json 0 1 2 3 4 5 6 7 >"$out/nvml.json" ;;
    container) nodes=(3 5); environ NVIDIA_VISIBLE_DEVICES=3,5; nvml_json 3 5 >"$out/nvml.json" ;;
    uuid) nodes=(3 5); environ "CUDA_VISIBLE_DEVICES=$(uuid 5),$(uuid 3)"; nvml_json 3 5 >"$out/nvml.json" ;;
    slurm)
      nodes=(4 5)
      environ CUDA_VISIBLE_DEVICES=0,1 SLURM_STEP_GPUS=4,5 SLURM_JOB_GPUS=4,5
      nvml_json 4 5 >"$out/nvml.json" ;;
    mig)
      nodes=(0)
      mkdir -p "$out/proc/driver/nvidia/capabilities/gpu0/mig/gi1" "$out/proc/driver/nvidia/capabilities/gpu0/mig/gi2" "$out/dev/nvidia-caps"
      : >"$out/dev/nvidia-caps/nvidia-cap1"
      environ "NVIDIA_VISIBLE_DEVICES=$(mig 1),$(mig 2)"
      printf '{"gpus": [{"bus_id": "%s", "uuid": "%s", "minor": 0, "mig": [{"uuid": "%s"}, {"uuid": "%s"}]}]}\n' \
        "${BUS[0]}" "$(uuid 0)" "$(mig 1)" "$(mig 2)" >"$out/nvml.json" ;;
    *) echo "gpu-machine.sh: unknown scenario $scenario" >&2; exit 2 ;;
  esac
  for i in "${nodes[@]}"; do : >"$out/dev/nvidia$i"; done
}

live() {
  local scenario=$1
  shift
  [[ ${1:-} == -- ]] && shift
  (($(id -u) == 0)) || { echo "gpu-machine.sh live: needs root (mount namespace, mknod, cgroups)" >&2; exit 2; }
  if [[ -z ${TW_GPU_NS:-} ]]; then
    exec env TW_GPU_NS=1 unshare -m --propagation private "$0" live "$scenario" -- "$@"
  fi
  local allow
  t=$(mktemp -d /tmp/tw-gpu-machine.XXXXXX)
  cg=""
  trap cleanup EXIT
  local cpus
  cpus=$(cat /sys/devices/system/cpu/online)
  mkdir -p "$t/pci" "$t/driver" "$t/olddev"
  plant_gpus "$t/pci" 0x10de 0x030200 "$cpus" "$cpus" 0
  mount --bind "$t/pci" /sys/bus/pci/devices
  mount -t tmpfs tw-driver /proc/driver
  driver_table /proc/driver
  # A /dev of our own: the usual nodes bound from the real one, then the GPUs'.
  mount --rbind /dev "$t/olddev"
  mount -t tmpfs -o mode=755 tw-dev /dev
  for n in null zero full random urandom tty; do
    [[ -e $t/olddev/$n ]] || continue
    : >"/dev/$n"
    mount --bind "$t/olddev/$n" "/dev/$n"
  done
  mkdir -p /dev/shm /dev/pts
  mount --bind "$t/olddev/shm" /dev/shm
  mount --bind "$t/olddev/pts" /dev/pts
  ln -s /proc/self/fd /dev/fd
  ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
  mknod /dev/nvidiactl c 195 255
  for i in "${!BUS[@]}"; do mknod "/dev/nvidia$i" c 195 "$i"; done
  local envs=()
  case $scenario in
    whole) allow="" ;;
    slurm)
      allow="4 5"
      envs=(CUDA_VISIBLE_DEVICES=0,1 SLURM_STEP_GPUS=4,5 SLURM_JOB_GPUS=4,5) ;;
    *) echo "gpu-machine.sh live: unknown scenario $scenario (whole, slurm)" >&2; exit 2 ;;
  esac
  if [[ -n $allow ]]; then
    cg=/sys/fs/cgroup/devices/tw-gpu-machine-$$
    [[ -d /sys/fs/cgroup/devices ]] || { echo "gpu-machine.sh: no cgroup v1 devices controller at /sys/fs/cgroup/devices" >&2; exit 2; }
    mkdir "$cg"
    # Deny by default, then allow every device but the GPUs' major (195)
    # wholesale, and of 195 the control node and the scenario's GPUs: what
    # Slurm's ConstrainDevices and docker do.
    echo a >"$cg/devices.deny"
    echo 'b *:* rwm' >"$cg/devices.allow"
    awk '/^Character/{c=1;next} /^Block/{c=0} c && $1 ~ /^[0-9]+$/ && $1 != 195 {print $1}' /proc/devices | sort -un |
      while read -r m; do echo "c $m:* rwm" >"$cg/devices.allow"; done
    echo 'c 195:255 rwm' >"$cg/devices.allow"
    for i in $allow; do echo "c 195:$i rwm" >"$cg/devices.allow"; done
    echo $$ >"$cg/cgroup.procs"
  fi
  local rc=0
  # What this machine made, for a test to check that it is gone afterwards.
  env "${envs[@]}" TW_GPU_MACHINE="$t $cg" "$@" || rc=$?
  return $rc
}

# Leave nothing behind: the cgroup (after leaving it), the mounts (before
# removing the scratch directory: never recurse into the real /dev).
cleanup() {
  if [[ -n ${cg:-} && -d $cg ]]; then
    echo $$ >/sys/fs/cgroup/devices/cgroup.procs
    rmdir "$cg" 2>/dev/null || true
  fi
  [[ -n ${t:-} && -d $t ]] || return 0
  umount -l "$t/olddev" 2>/dev/null || true
  umount -l /sys/bus/pci/devices 2>/dev/null || true
  if ! mountpoint -q "$t/olddev" 2>/dev/null; then
    rmdir "$t/olddev" 2>/dev/null || true
    rm -rf "$t/pci"
    rmdir "$t/driver" "$t" 2>/dev/null || true
  fi
}

case ${1:-} in
  dump) dump "$2" "$3" ;;
  live) shift; live "$@" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;$d' >&2; exit 2 ;;
esac
