#!/usr/bin/env python3
"""Checks what scripts/numa_guest/grace.sh reported from the aarch64 guest
(its console, argv[1]): the kernel's word against threadwise's. One line
per check; exits 1 at the first failure, printing what the guest said."""
import json
import re
import sys

from guestlib import expand, placed_ranks, shares, top_placement

console = open(sys.argv[1], errors="replace").read()
lines = [l for l in console.splitlines() if l.startswith("@@")]


def said(tag):
    return [l[len(tag) + 3:] for l in lines if l.startswith(f"@@{tag} ") or l == f"@@{tag}"]


def fail(what):
    print(f"FAIL {what}")
    print("the guest said:\n" + "\n".join(lines[-80:]) if lines else console[-4000:])
    sys.exit(1)


if not said("exit") or said("exit")[0] != "0" or not said("done"):
    fail("the guest did not finish its script (no @@done, or a nonzero @@exit)")
uname = said("uname")[0]
if not uname.startswith("aarch64 "):
    fail(f"not an aarch64 kernel: {uname}")

# 1. topo = the kernel's nodes (CPUs, memory, distances) and lstopo's counts.
kernel = {}
for l in said("node"):
    m = re.match(r"(\d+) cpus=(\S*) memkb=(\d+) distance=(\S+)", l)
    kernel[int(m[1])] = (expand(m[2]), int(m[3]) * 1024, list(map(int, m[4].split(","))))
topo = json.loads(said("topo")[0])
ours = {n["id"]: (expand(n["cpus"]), n["memory_bytes"]) for n in topo["numa_nodes"]}
dist = topo["numa_distances"]["matrix"]
if ours != {k: v[:2] for k, v in kernel.items()} or dist != [kernel[k][2] for k in sorted(kernel)]:
    fail(f"topo: nodes {ours} distances {dist}; the kernel: {kernel}")
memory_only = sorted(k for k, (cpus, _) in ours.items() if not cpus)
if not memory_only:
    fail("the guest has no memory-only node")
counts = {"numa": len(topo["numa_nodes"]), "package": len(topo["packages"]), "core": len(topo["cores"]),
          "pu": sum(len(expand(c["cpus"])) for c in topo["cores"])}
theirs = {k: int(v) for k, v in (l.split() for l in said("lstopo"))}
if counts != theirs:
    fail(f"topo {counts} vs lstopo {theirs}")
print(f"ok   topo = the kernel and lstopo: {counts['numa']} NUMA nodes ({', '.join(map(str, memory_only))} memory-only), "
      f"{counts['package']} packages, {counts['core']} cores, {counts['pu']} PUs; distances {dist}")

# 2. plan -n 2: one rank per CPU node, memory on that node (never GPU memory).
plan = json.loads(said("plan")[0])
for r in plan["ranks"]:
    node = r["local_rank"]
    if expand(r["cpus"]) != kernel[node][0] or r["mem_nodes"] != [node]:
        fail(f"plan -n 2: rank {node} cpus {r['cpus']} memory {r['mem_nodes']}; node {node} has cpus {kernel[node][0]}")
print("ok   plan -n 2: " + "; ".join(f"rank {r['local_rank']} cpus {r['cpus']} memory node {r['mem_nodes']}" for r in plan["ranks"]))

# 3. The real clone3 path on this kernel.
born = [l for l in said("dry") if l.startswith("containment:")]
if not born or "born in it (clone3 CLONE_INTO_CGROUP)" not in born[0]:
    fail(f"run --dry-run: ranks not born by clone3 in the job's cgroup: {born}")
print("ok   run --dry-run -n 2: " + born[0].split("; ")[-1])


# 4. run -n 2 --mem bind|preferred|local: each rank's 256 MiB on its own node, workers on their CPUs.
def code(tag):
    got = [l.split()[1] for l in said("code") if l.split()[0] == tag]
    if got != ["0"]:
        fail(f"{tag}: exit code {got}: " + " | ".join(said(tag)))


for mem in ["bind", "preferred", "local"]:
    tag = f"run-{mem}"
    code(tag)
    try:
        ranks = placed_ranks("\n".join(said(tag)), mem, 2, workers=True)
    except ValueError as e:
        fail(str(e))
    # One rank per CPU node, in order, on that node's CPUs.
    for r, node, _, text, cpus in ranks:
        if node != r or not expand(cpus) <= kernel[int(r)][0]:
            fail(f"{tag}: rank {r} on node {node} ({text}), cpus {cpus}")
    print(f"ok   run -n 2 --mem {mem} (256 MiB each): "
          + "; ".join(f"rank {r} {p} {s} cpus {c}" for r, _, p, s, c in sorted(ranks)) + "; workers on their planned CPUs")

# 5. One rank over both CPU nodes, interleaved: 40-60% on each, none in GPU memory.
code("interleave")
out = "\n".join(said("interleave"))
got = shares(out)
cpu_nodes = sorted(set(kernel) - set(memory_only))
if sorted(got) != cpu_nodes or any(not 40 <= v <= 60 for v in got.values()):
    fail(f"interleave: {out}")
print(f"ok   run -n 1 --policy none --mem interleave: {' '.join(f'N{k}={v}%' for k, v in sorted(got.items()))} "
      f"(the CPU nodes; none in memory-only {memory_only})")

# 6. The built-in workload (OpenMP threads, loader workers, a socket between
# ranks), and top on it while it ran: every thread and worker where the plan put it.
code("workload")
print("ok   run -n 2 -- threadwise-workload: " + next(l for l in said("workload") if "rank(s) in" in l).split("threadwise: ")[-1])
code("top")
try:
    print("ok   top --once on run -n 2 -- threadwise-workload: " + top_placement(json.loads(said("top")[0]), plan))
except ValueError as e:
    fail(str(e))

# 7. doctor names the memory-only nodes.
code("doctor")
doctor = json.loads(said("doctor")[0])
numa = next((f for f in doctor["findings"] if f["id"] == "memory.numa"), None)
if not numa or "memory only" not in numa["evidence"]:
    fail(f"doctor: {numa}")
print(f"ok   doctor: {numa['title']} ({numa['evidence']})")
up = re.search(r"up ([0-9.]+) s", uname)[1]
print(f"aarch64 guest checks passed ({uname.split(',')[0]}: booted in {up} s, checks done at {said('done')[0]} s of uptime)")
