"""What the NUMA guests' checks share (scripts/numa_guest/checks.sh in the
x86_64 guests, grace_check.py for the aarch64 one)."""

import re


def expand(s):
    """The kernel's list format ("0-3,8,10-11"), read."""
    cpus = set()
    for part in filter(None, s.strip().split(",")):
        a, _, b = part.partition("-")
        cpus |= set(range(int(a), int(b or a) + 1))
    return cpus


def top_placement(top, plan):
    """`top --once --json` on a running `run -n N -- threadwise-workload`
    against `plan -n N --json`: every rank's threads ran on its planned CPUs,
    its workers were allowed and ran on its worker CPUs, and no placement
    alert (off-plan, remote-memory, exited). Not `oversubscribed`: it counts
    the threads runnable at one instant, and where a plan gives workers the
    compute threads' CPUs (CPU ranks on a small node) a busy worker makes one
    more. Returns the line to print; raises ValueError saying what is wrong."""
    planned = {r["local_rank"]: expand(r["cpus"]) for r in plan["ranks"]}
    workers = {r["local_rank"]: expand(r["worker_cpus"]) for r in plan["ranks"]}
    ranks = sorted(top["ranks"], key=lambda r: r["local_rank"])
    placement = [a for a in top["alerts"] if a["kind"] in ("off-plan", "remote-memory", "exited")]
    if len(ranks) != len(planned) or placement:
        raise ValueError(f"top: {len(ranks)} ranks of {len(planned)}, alerts {top['alerts']}")
    for r in ranks:
        i, ws = r["local_rank"], r["workers"]
        if (expand(r["planned"]) != planned[i] or not expand(r["ran_on"]) <= planned[i] or r["threads"] < 2
                or not ws or any(expand(w["allowed"]) != workers[i] or not expand(w["ran_on"]) <= workers[i] for w in ws)):
            raise ValueError(f"top: rank {i} {r}; planned {planned[i]}, workers {workers[i]}")
    return "; ".join(
        f"rank {r['local_rank']} {r['threads']} threads ran on {r['ran_on']} of {r['planned']}, "
        f"{len(r['workers'])} workers on {'/'.join(w['allowed'] for w in r['workers'])}, "
        f"{r['local_pages_pct']:.0f}% of its pages local" for r in ranks) + "; no placement alert"


def shares(text):
    """touch's "N0=49.6% N1=50.4%": {node: percent}."""
    return {int(k): float(v) for k, v in re.findall(r"N(\d+)=([0-9.]+)%", text)}


def placed_ranks(out, mem, n, workers):
    """The n ranks of scripts/numa_guest/touch.c in `out`, run with --mem
    `mem` (bind, preferred, local): each has at least 95% of its pages on its
    own nodes and the kernel holds the policy asked for (an interleave over
    one node would place pages the same); with `workers`, each rank's forked
    worker was on its planned worker CPUs. Returns [(rank, nodes, policy,
    shares, cpus)]; raises ValueError saying what is wrong."""
    ranks = re.findall(r"numa rank (\S+) nodes (\S+) policy (\S+) pages \d+ (.*?) cpus (\S+)", out)
    if len(ranks) != n:
        raise ValueError(f"{mem}: {len(ranks)} of {n} ranks reported: {out}")
    for r, node, policy, text, _ in ranks:
        # Its own nodes: a rank may span several (a package of two NUMA nodes).
        own = sum(shares(text).get(int(x), 0) for x in node.split(","))
        if own < 95:
            raise ValueError(f"{mem}: rank {r} has {own}% of its pages on its node {node}: {text}")
        want = {"bind": f"bind:{node}", "preferred": f"prefer:{node}", "local": "local"}[mem]
        if "," not in node and policy != want:  # (over several nodes numa_maps writes ranges)
            raise ValueError(f"{mem}: rank {r} runs under policy {policy}, not {want}")
    if workers:
        seen = re.findall(r"numa worker of rank (\d+) cpus (\S+) planned (\S+)", out)
        if len(seen) != n or any(expand(c) != expand(p) for _, c, p in seen):
            raise ValueError(f"{mem}: workers {seen}")
    return ranks
