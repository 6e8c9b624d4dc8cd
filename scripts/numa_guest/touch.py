#!/usr/bin/env python3
"""A rank that touches a buffer of MiB (argv[1], default 256) and prints
where the kernel put its pages: the buffer's line of /proc/self/numa_maps
(the anonymous mapping with the most pages), as the share on each node."""
import os
import re
import sys
import time

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
if "--worker" in sys.argv:
    # A DataLoader-like worker: a fork of the rank, which `run` moves onto
    # THREADWISE_WORKER_CPUS within 100 ms.
    if os.fork() == 0:
        time.sleep(0.6)
        got = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        print(f"numa worker of rank {os.environ.get('RANK')} cpus {got} planned {os.environ.get('THREADWISE_WORKER_CPUS')}", flush=True)
        os._exit(0)
buf = bytearray(mib << 20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
best = None
with open("/proc/self/numa_maps") as f:
    for line in f:
        m = re.search(r"\banon=(\d+)", line)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), line)
pages, line = best
nodes = {int(k): int(v) for k, v in re.findall(r"\bN(\d+)=(\d+)", line)}
total = sum(nodes.values())
shares = " ".join(f"N{k}={100.0 * v / total:.1f}%" for k, v in sorted(nodes.items()))
policy = line.split()[1]
cpus = os.sched_getaffinity(0)
if "--worker" in sys.argv:
    os.wait()
print(
    f"numa rank {os.environ.get('RANK', '-')} nodes {os.environ.get('THREADWISE_NUMA_NODES', '-')} "
    f"policy {policy} pages {total} {shares} cpus {','.join(map(str, sorted(cpus)))}",
    flush=True,
)
