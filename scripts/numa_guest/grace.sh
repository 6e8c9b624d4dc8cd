#!/bin/sh
# Inside the aarch64 guest of scripts/aarch64-guest.sh (busybox, no Python):
# what the kernel says and what threadwise does, as @@-lines for the host to
# check (scripts/numa_guest/grace_check.py). Never stops early: every
# command's output and exit code is reported.
tw=/usr/bin/threadwise
say() { sed "s/^/@@$1 /"; }

echo "@@uname $(uname -m) $(uname -r) $(nproc) cpus, up $(cut -d" " -f1 /proc/uptime) s"
for d in /sys/devices/system/node/node[0-9]*; do
  n=${d##*node}
  echo "@@node $n cpus=$(cat "$d/cpulist") memkb=$(awk '/MemTotal/ {print $4}' "$d/meminfo") distance=$(cat "$d/distance" | tr ' ' ,)"
done
echo "@@topo $("$tw" topo --json | tr -d '\n')"
"$tw" topo 2>&1 | say topo-text
for kind in numa package core pu; do
  echo "@@lstopo $kind $(lstopo-no-graphics --only "$kind" 2>&1 | wc -l)"
done
lstopo-no-graphics --only numa -v 2>&1 | say lstopo-numa
"$tw" plan -n 2 --json 2>&1 | tr -d '\n' | say plan
echo
# The containment line: a real clone3 with CLONE_INTO_CGROUP, on this kernel.
"$tw" run --dry-run -n 2 -- true 2>&1 | say dry

for mem in bind preferred local; do
  "$tw" run -n 2 --mem "$mem" -q --no-doctor -- /usr/bin/touch-numa 256 --worker >/tmp/out 2>&1
  echo "@@code run-$mem $?"
  say "run-$mem" </tmp/out
done
"$tw" run -n 1 --policy none --mem interleave -q --no-doctor -- /usr/bin/touch-numa 256 >/tmp/out 2>&1
echo "@@code interleave $?"
say interleave </tmp/out
# The built-in workload (OpenMP threads and loader workers, born by clone3),
# its threads and workers watched live by top.
"$tw" run -n 2 --no-doctor -- /usr/bin/threadwise-workload --seconds 8 --warmup 1 >/tmp/out 2>&1 &
sleep 6
"$tw" top --once --json >/tmp/top 2>&1
echo "@@code top $?"
echo "@@top $(tr -d '\n' </tmp/top)"
wait $!
echo "@@code workload $?"
say workload </tmp/out
"$tw" doctor --json --no-python >/tmp/out 2>&1
echo "@@code doctor $?"
echo "@@doctor $(tr -d '\n' </tmp/out)"
echo "@@done $(cut -d" " -f1 /proc/uptime)"
