#!/bin/bash
# Test hosts: a small cluster on this machine, for multi-node tests.
#
#   scripts/test-hosts.sh up N          bring up N (2-4) hosts; prints export lines to eval
#   scripts/test-hosts.sh exec HOST CMD run CMD on HOST (host0, host1, ...), in this directory
#   scripts/test-hosts.sh down          stop everything it started, remove what it made
#   scripts/test-hosts.sh status        the hosts and Slurm's view of them
#
# Each host is a network namespace (its own veth on a private bridge, address
# 10.77.0.1X/24, no route out; and a second interface, mgmt0, that reaches
# nothing), a UTS namespace (its own hostname) and a mount
# namespace (its own /etc/hosts naming every host, and a resolv.conf that
# fails at once), held open by a `sleep` holder process. Every process of a
# host, the holder and what `exec` starts, lives in the host's own cgroup
# (cpuset: a distinct CPU set per host where the machine has a CPU per host),
# so `down` stops them by the pids the cgroups list. We enter the namespaces
# with nsenter, not `ip netns exec`, which remounts /sys and hides
# /sys/fs/cgroup.
#
# A real Slurm (Debian's slurm-wlm) runs across them: slurmctld on host0, one
# slurmd per host under its own name, with their own config, spool, pid and
# log files under the state directory and their own munged (own key and
# socket), so a Slurm or munge the machine already runs is never touched.
# Commands on the hosts need SLURM_CONF (printed by `up`, set by `exec`).
set -euo pipefail

D=${TW_TEST_HOSTS_DIR:-/run/threadwise-test-hosts}
NET=10.77.0
BR=twbr0
CG_NAME=threadwise-test-hosts

die() { echo "test-hosts: error: $*" >&2; exit 2; }

preflight() {
  [ "$(id -u)" = 0 ] || die "must run as root (namespaces, cgroups, a bridge); hint: sudo $0 $*"
  [ -e /proc/self/ns/net ] || die "this kernel has no network namespaces (CONFIG_NET_NS)"
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v ip >/dev/null; then
    echo "test-hosts: installing slurm-wlm, munge and iproute2" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge iproute2 >/dev/null
  fi
  command -v unshare >/dev/null && command -v nsenter >/dev/null || die "unshare/nsenter not found; hint: apt-get install util-linux"
  command -v ip >/dev/null || die "ip not found; hint: apt-get install iproute2"
  unshare --net true 2>/dev/null || die "cannot create a network namespace here (a container without CAP_SYS_ADMIN?)"
}

# The cgroup directories of host $1 (v1: cpuset and pids hierarchies; v2: one).
cg_dirs() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "/sys/fs/cgroup/$CG_NAME/$1"
  else
    for c in cpuset pids; do [ -d "/sys/fs/cgroup/$c" ] && echo "/sys/fs/cgroup/$c/$CG_NAME/$1"; done
  fi
}

# Make host $1's cgroups with CPU set $2.
cg_make() {
  local h=$1 cpus=$2 d
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p "/sys/fs/cgroup/$CG_NAME"
    echo +cpuset >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    echo +cpuset >"/sys/fs/cgroup/$CG_NAME/cgroup.subtree_control" 2>/dev/null || true
    mkdir -p "/sys/fs/cgroup/$CG_NAME/$h"
    echo "$cpus" >"/sys/fs/cgroup/$CG_NAME/$h/cpuset.cpus" 2>/dev/null || true
  else
    for d in $(cg_dirs "$h"); do
      mkdir -p "$d"
      if [ -f "$(dirname "$d")/cpuset.cpus" ]; then
        # v1 cpuset: a child needs cpus and mems before it takes a task.
        cat /sys/fs/cgroup/cpuset/cpuset.cpus >"$(dirname "$d")/cpuset.cpus"
        cat /sys/fs/cgroup/cpuset/cpuset.mems >"$(dirname "$d")/cpuset.mems"
        echo "$cpus" >"$d/cpuset.cpus"
        cat /sys/fs/cgroup/cpuset/cpuset.mems >"$d/cpuset.mems"
      fi
    done
  fi
}

# Every pid in host $1's cgroups.
cg_pids() {
  local d
  for d in $(cg_dirs "$1"); do cat "$d/cgroup.procs" 2>/dev/null || true; done | sort -u
}

hosts() { cat "$D/hosts.list" 2>/dev/null || true; }

holder_pid() { cat "$D/$1/holder.pid" 2>/dev/null || true; }

alive() { local p; p=$(holder_pid "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

# Run "$@" on host $H: join its cgroups, then its namespaces, in $PWD.
on_host() {
  local h=$1; shift
  local pid; pid=$(holder_pid "$h")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || die "no host $h is up; hint: $0 up N (hosts: $(hosts | tr '\n' ' '))"
  local joins=""
  for d in $(cg_dirs "$h"); do joins+="echo \$\$ >'$d/cgroup.procs'; "; done
  SLURM_CONF="$D/slurm.conf" exec sh -c "$joins exec nsenter -t $pid -n -u -m --wd=\"\$0\" -- \"\$@\"" "$PWD" "$@"
}

up() {
  local n=${1:-}
  [[ "$n" =~ ^[2-4]$ ]] || die "up needs a host count from 2 to 4, not '${n}'; hint: $0 up 2"
  preflight up "$n"
  if [ -f "$D/up" ] && [ "$(hosts | wc -l)" = "$n" ]; then
    local ok=1 h
    for h in $(hosts); do alive "$h" || ok=0; done
    if [ $ok = 1 ]; then exports; return; fi
  fi
  [ -d "$D" ] && down >/dev/null
  local t0; t0=$(date +%s.%N)
  mkdir -p "$D"/munge "$D"/ctld
  local ncpu; ncpu=$(nproc --all)
  local allowed; allowed=$(cat /sys/fs/cgroup/cpuset/cpuset.effective_cpus 2>/dev/null || cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null || echo "0-$((ncpu - 1))")
  : >"$D/hosts.list"
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    for ((i = 0; i < n; i++)); do echo "$NET.1$i host$i"; done
  } >"$D/etc-hosts"
  # Lookups that miss /etc/hosts fail at once instead of waiting on a nameserver.
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$D/resolv.conf"
  ip link add "$BR" type bridge
  ip link set "$BR" up
  local i h cpus
  for ((i = 0; i < n; i++)); do
    h=host$i
    mkdir -p "$D/$h/spool"
    echo "$h" >>"$D/hosts.list"
    # A CPU of its own per host when there are enough; else the whole set.
    if [ "$ncpu" -ge "$n" ]; then cpus=$(cpu_share "$allowed" "$i" "$n"); else cpus=$allowed; fi
    echo "$cpus" >"$D/$h/cpus"
    cg_make "$h" "$cpus"
    local joins=""
    for d in $(cg_dirs "$h"); do joins+="echo \$\$ >'$d/cgroup.procs'; "; done
    # The holder: new net, UTS and mount namespaces, its own names, then sleep.
    setsid sh -c "$joins exec unshare --net --uts --mount --propagation private sh -c '
      hostname $h
      mount --bind $D/etc-hosts /etc/hosts
      mount --bind $D/resolv.conf /etc/resolv.conf
      ip link set lo up
      exec sleep infinity'" </dev/null >/dev/null 2>&1 &
    echo $! >"$D/$h/holder.pid"
    wait_ns "$h"
    ip link add "twv$i" type veth peer name "twp$i"
    ip link set "twv$i" master "$BR" up
    ip link set "twp$i" netns "$(holder_pid "$h")"
    # eth0 reaches the other hosts; mgmt0 is a second interface that does not
    # (as a management or storage network would), so which one collectives
    # use matters.
    nsenter -t "$(holder_pid "$h")" -n sh -c "ip link set twp$i name eth0 && ip addr add $NET.1$i/24 dev eth0 && ip link set eth0 up &&
      ip link add mgmt0 type veth peer name mgmt0p && ip addr add 10.78.0.1$i/24 dev mgmt0 && ip link set mgmt0p up && ip link set mgmt0 up"
  done
  slurm_conf "$n"
  start_slurm "$n"
  touch "$D/up"
  local t1; t1=$(date +%s.%N)
  echo "test-hosts: $n host(s) up in $(echo "$t1 - $t0" | bc 2>/dev/null || echo '?') s" >&2
  exports
}

# The i-th of n equal shares of a cpulist (contiguous, in order).
cpu_share() {
  local list=$1 i=$2 n=$3 part a b c
  local -a parts cpus=()
  IFS=, read -ra parts <<<"$list"
  for part in "${parts[@]}"; do
    a=${part%-*}; b=${part#*-}
    for ((c = a; c <= b; c++)); do cpus+=("$c"); done
  done
  local k=$((${#cpus[@]} / n))
  local -a mine=("${cpus[@]:i*k:k}")
  (IFS=,; echo "${mine[*]}")
}

# Wait until the holder has entered its namespaces (its hostname is set).
wait_ns() {
  local h=$1 pid k
  pid=$(holder_pid "$h")
  for k in $(seq 100); do
    if [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" != "$(readlink /proc/self/ns/net)" ] &&
       [ "$(nsenter -t "$pid" -u hostname 2>/dev/null)" = "$h" ] &&
       [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$(command -v sleep)")" ]; then
      return
    fi
    sleep 0.05
  done
  die "host $h did not start (holder pid $pid)"
}

slurm_conf() {
  local n=$1 i
  : >"$D/plugstack.conf"
  {
    echo "ClusterName=twhosts"
    echo "SlurmctldHost=host0($NET.10)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$D/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "MpiDefault=none"
    echo "ProctrackType=proctrack/linuxproc"
    # Tasks keep their host's CPU set; threadwise bind places them.
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "PlugStackConfig=$D/plugstack.conf"
    echo "StateSaveLocation=$D/ctld"
    echo "SlurmctldPidFile=$D/ctld/slurmctld.pid"
    echo "SlurmctldLogFile=$D/ctld/slurmctld.log"
    echo "SlurmdSpoolDir=$D/%n/spool"
    echo "SlurmdPidFile=$D/%n/slurmd.pid"
    echo "SlurmdLogFile=$D/%n/slurmd.log"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=30"
    echo "MessageTimeout=5"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    for ((i = 0; i < n; i++)); do
      echo "NodeName=host$i NodeAddr=$NET.1$i CPUs=$(nproc --all) State=UNKNOWN"
    done
    echo "PartitionName=main Nodes=host[0-$((n - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
  } >"$D/slurm.conf"
}

start_slurm() {
  local n=$1 i k
  # munged of our own, in the machine's namespaces: its socket is a file every
  # host's mount namespace sees.
  dd if=/dev/urandom bs=1 count=1024 of="$D/munge/key" 2>/dev/null
  chmod 700 "$D/munge"
  chmod 400 "$D/munge/key"
  munged --force --socket="$D/munge/munge.socket" --key-file="$D/munge/key" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/seed"
  chmod 755 "$D/munge"
  (on_host host0 slurmctld -i -f "$D/slurm.conf")
  for ((i = 0; i < n; i++)); do
    (on_host "host$i" slurmd -N "host$i" -f "$D/slurm.conf")
  done
  export SLURM_CONF="$D/slurm.conf"
  for k in $(seq 150); do
    if [ "$( (on_host host0 sinfo -h -o '%t %D' -t idle) 2>/dev/null | awk '{s+=$2} END {print s+0}')" = "$n" ]; then
      return
    fi
    if [ "$k" = 40 ]; then
      (on_host host0 scontrol update nodename="host[0-$((n - 1))]" state=resume) >/dev/null 2>&1 || true
    fi
    sleep 0.1
  done
  (on_host host0 sinfo) >&2 || true
  die "Slurm's nodes did not become idle in 15 s; see $D/ctld/slurmctld.log and $D/host*/slurmd.log"
}

exports() {
  echo "export SLURM_CONF=$D/slurm.conf"
  echo "export TW_TEST_HOSTS=\"$(hosts | tr '\n' ' ' | sed 's/ $//')\""
  echo "export TW_TEST_HOSTS_DIR=$D"
}

down() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  local t0; t0=$(date +%s.%N)
  local h p k
  # Slurm first, by the pids it wrote; then munged; then every process in the
  # hosts' cgroups (holders and whatever `exec` started).
  for p in "$D"/ctld/slurmctld.pid "$D"/host*/slurmd.pid "$D"/munge/munged.pid; do
    [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
  done
  for h in $(ls -d "$D"/host* 2>/dev/null | xargs -rn1 basename) $(ls /sys/fs/cgroup/pids/$CG_NAME /sys/fs/cgroup/$CG_NAME 2>/dev/null | grep '^host' || true); do
    for k in $(seq 50); do
      local pids; pids=$(cg_pids "$h")
      [ -z "$pids" ] && break
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
      sleep 0.05
    done
    for d in $(cg_dirs "$h"); do rmdir "$d" 2>/dev/null || true; done
  done
  for p in "$D"/ctld/slurmctld.pid "$D"/host*/slurmd.pid "$D"/munge/munged.pid; do
    [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null || true
  done
  for d in /sys/fs/cgroup/*/$CG_NAME /sys/fs/cgroup/$CG_NAME; do
    [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  for k in 0 1 2 3; do ip link del "twv$k" 2>/dev/null || true; done
  rm -rf "$D"
  local t1; t1=$(date +%s.%N)
  echo "test-hosts: down in $(echo "$t1 - $t0" | bc 2>/dev/null || echo '?') s" >&2
}

status() {
  local h
  for h in $(hosts); do
    if alive "$h"; then echo "$h: up (holder $(holder_pid "$h"), CPUs $(cat "$D/$h/cpus"), $(cg_pids "$h" | wc -l) process(es))"
    else echo "$h: down"; fi
  done
  [ -f "$D/up" ] && (on_host host0 sinfo) || true
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  exec)
    [ $# -ge 2 ] || die "exec needs a host and a command; hint: $0 exec host0 hostname"
    on_host "$@" ;;
  status) status ;;
  *) die "unknown command '${cmd}'; hint: $0 up N | exec HOST CMD... | down | status" ;;
esac
