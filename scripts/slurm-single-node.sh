#!/bin/bash
# Starts a real single-node Slurm cluster on this machine (Debian slurm-wlm +
# munge), as root, for the tests under srun. Idempotent: daemons already
# running are left alone. Adapted from the project's shared set-up script.
set -e
if ! command -v slurmctld >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
H=$(hostname -s); C=$(nproc)
# A daemon of the machine's own, not one of scripts/test-hosts.sh's (theirs
# name its state directory on their command line).
machine_daemon() {
  local p
  for p in $(pgrep -x "$1"); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q threadwise-test-hosts || return 0
  done
  return 1
}
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
[ -f /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true; chmod 400 /etc/munge/munge.key
machine_daemon munged || runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=tw
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
NodeName=$H CPUs=$C State=UNKNOWN
PartitionName=main Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
machine_daemon slurmctld || slurmctld
machine_daemon slurmd || slurmd
sleep 3
scontrol update nodename=$H state=resume 2>/dev/null || true
sinfo
