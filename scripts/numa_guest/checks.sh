#!/bin/bash
# Inside a guest of scripts/numa-guest.sh: watch the kernel, not our own
# reading of it. Prints one line per check; exits 1 at the first failure.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib/target-dir.sh"
tw=${TW:-$TW_TARGET/release/threadwise}
# The rank that touches a buffer and says where its pages are
# (scripts/numa_guest/touch.c, built by numa-guest.sh).
touch=${TOUCH:?TOUCH: the touch program, built by scripts/numa-guest.sh}
fail() { echo "FAIL $*"; exit 1; }
nodes=$(ls -d /sys/devices/system/node/node[0-9]* | wc -l)
# One rank per NUMA node; a buffer that fits a node of this guest.
mib=$((nodes > 2 ? 128 : 256))

# 1. topo agrees with lstopo (hwloc) and with the kernel's distance table.
"$tw" topo --json >/tmp/topo.json
python3 - "$nodes" <<'PY' || exit 1
import json, subprocess, sys, glob
sys.path.insert(0, "scripts/numa_guest")
from guestlib import expand
t = json.load(open("/tmp/topo.json"))
count = lambda kind: len(subprocess.run(["lstopo-no-graphics", "--only", kind], capture_output=True, text=True).stdout.splitlines())
ours = {"numa": len(t["numa_nodes"]), "package": len(t["packages"]), "core": len(t["cores"]),
        "pu": sum(len(expand(c["cpus"])) for c in t["cores"])}
theirs = {k: count(k) for k in ours}
bad = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
kernel = [list(map(int, open(f"/sys/devices/system/node/node{i}/distance").read().split())) for i in range(int(sys.argv[1]))]
dist = t["numa_distances"]
dist = dist["matrix"] if isinstance(dist, dict) else dist
if bad or dist != kernel:
    sys.exit(f"FAIL topo: ours vs lstopo {bad}; distances {dist} vs the kernel's {kernel}")
print(f"ok   topo = lstopo: {ours['numa']} NUMA nodes, {ours['package']} packages, {ours['core']} cores, {theirs['pu']} PUs; distances = the kernel's {kernel}")
PY

# 2. Each rank's pages on its own node (bind, preferred, local), its worker on its CPUs.
for mem in bind preferred local; do
  out=$("$tw" run -n "$nodes" --mem "$mem" -q --no-doctor -- "$touch" "$mib" --worker 2>&1)
  python3 - "$mem" "$out" "$nodes" "$mib" <<'PY' || exit 1
import sys
sys.path.insert(0, "scripts/numa_guest")
from guestlib import placed_ranks
mem, out, n, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    ranks = placed_ranks(out, mem, n, workers=True)
except ValueError as e:
    sys.exit(f"FAIL {e}")
print(f"ok   run -n {n} --mem {mem} ({mib} MiB each): " + "; ".join(f"rank {r} node {n} {p} {s} cpus {c}" for r, n, p, s, c in ranks)
      + "; workers on their planned CPUs")
PY
done

# 3. One rank over every node, interleaved: 40-60% on each (2 nodes), or an even share.
out=$("$tw" run -n 1 --policy none --mem interleave -q --no-doctor -- "$touch" 256 2>&1)
python3 - "$nodes" "$out" <<'PY' || exit 1
import sys
sys.path.insert(0, "scripts/numa_guest")
from guestlib import shares
n, out = int(sys.argv[1]), sys.argv[2]
got = shares(out)
even = 100.0 / n
if len(got) != n or any(abs(v - even) > 10 for v in got.values()):
    sys.exit(f"FAIL interleave: {out}")
print(f"ok   run -n 1 --mem interleave: " + " ".join(f"N{k}={v}%" for k, v in sorted(got.items())))
PY

# 4. bind under mpirun: the same pages on the same nodes, one rank per node.
if command -v mpirun >/dev/null; then
  out=$(mpirun --allow-run-as-root --oversubscribe -np "$nodes" --bind-to none "$tw" bind --mem bind -- "$touch" 64 2>&1)
  python3 - "$out" "$nodes" <<'PY' || exit 1
import sys
sys.path.insert(0, "scripts/numa_guest")
from guestlib import placed_ranks
out, n = sys.argv[1], int(sys.argv[2])
try:
    ranks = placed_ranks(out, "bind", n, workers=False)
except ValueError as e:
    sys.exit(f"FAIL mpirun {e}")
if len({node for _, node, _, _, _ in ranks}) != n:
    sys.exit(f"FAIL mpirun bind: two ranks on one node: {out}")
print("ok   mpirun ... threadwise bind --mem bind: " + "; ".join(f"node {n} {p} {s}" for _, n, p, s, _ in sorted(ranks)))
PY
fi

# 5. top on the running workload: its threads and workers where the plan put them.
work=$(dirname "$tw")/threadwise-workload
"$tw" plan -n "$nodes" --json >/tmp/plan.json
"$tw" run -n "$nodes" -q --no-doctor -- "$work" --seconds 8 --warmup 1 >/tmp/work.out 2>&1 &
sleep 6
"$tw" top --once --json >/tmp/top.json || true
wait $! || fail "run -n $nodes -- threadwise-workload: $(cat /tmp/work.out)"
python3 - <<'PY' || exit 1
import json, sys
sys.path.insert(0, "scripts/numa_guest")
from guestlib import top_placement
try:
    print("ok   top --once on the workload: " + top_placement(json.load(open("/tmp/top.json")), json.load(open("/tmp/plan.json"))))
except ValueError as e:
    sys.exit(f"FAIL {e}")
PY

# 6. doctor's NUMA findings on a machine that has NUMA.
"$tw" doctor --json --no-python >/tmp/doctor.json || true
python3 - <<'PY' || exit 1
import json, sys
d = json.load(open("/tmp/doctor.json"))
numa = [f for f in d["findings"] if f["id"].startswith("memory.numa")]
if not numa:
    sys.exit(f"FAIL doctor: no NUMA finding: {[f['id'] for f in d['findings']]}")
print("ok   doctor: " + ", ".join(f"{f['id']} {f['severity']}" for f in numa))
PY
echo "guest checks passed"
