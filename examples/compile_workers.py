#!/usr/bin/env python3
"""Count the compile workers torch.compile starts in each rank.

Run under a launcher (torchrun, `threadwise run`): each rank compiles a small
model with Inductor (CPU, g++), runs it, then counts the processes below it
that Inductor started while it compiled, and prints one line:

    rank 0: cpus 0 compile_threads 1 pool threads 0 subprocess workers 0
        (sidecars 0) compilers at once 1 compile_s 8.1

On a CPU-only torch, Inductor compiles its C++ kernels on a pool of
`compile_threads` threads, each running g++ (compilers at once); with Triton
(a GPU build) it starts a sidecar process with `compile_threads` workers.

Used by scripts/pytorch-e2e.sh to compare torchrun's default with the plan's
TORCHINDUCTOR_COMPILE_THREADS.
"""
import os
import threading
import time

import torch


def descendants(pid):
    """Every process below `pid`: (pid, parent, cmdline), from /proc."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        kids.setdefault(ppid, []).append((int(p), ppid, cmd))
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def main():
    rank = int(os.environ.get("RANK", "0"))
    from torch._inductor import config

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.Tanh()
    )
    # The pool lives while Inductor compiles (then it may quiesce): sample
    # the processes below this rank every 20 ms meanwhile, keep the most.
    seen = {"workers": 0, "sidecars": 0, "compilers": 0, "threads": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            procs = descendants(os.getpid())
            me = os.getpid()
            side = [p for p, pp, cmd in procs if "compile_worker" in cmd and pp == me]
            seen["sidecars"] = max(seen["sidecars"], len(side))
            # A sidecar's workers are its children; a thread pool's are
            # threads of this process, each running one compiler at a time.
            workers = [p for p, pp, _ in procs if pp in side]
            seen["workers"] = max(seen["workers"], len(workers))
            cc = [p for p, _, cmd in procs if os.path.basename(cmd.split(" ")[0]) in ("cc1plus", "cc1")]
            seen["compilers"] = max(seen["compilers"], len(cc))
            pool = [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")]
            seen["threads"] = max(seen["threads"], len(pool))
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    fast = torch.compile(model)
    x = torch.randn(32, 64)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            fast(x)
    compile_s = time.perf_counter() - t0
    done.set()
    t.join()
    cpus = sorted(os.sched_getaffinity(0))
    print(
        f"rank {rank}: cpus {','.join(map(str, cpus))} compile_threads {config.compile_threads} "
        f"pool threads {seen['threads']} subprocess workers {seen['workers']} "
        f"(sidecars {seen['sidecars']}) compilers at once {seen['compilers']} compile_s {compile_s:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
