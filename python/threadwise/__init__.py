"""threadwise's helper for training scripts.

The `threadwise` binary (installed by the same wheel) plans each rank's CPUs,
threads and DataLoader workers and hands the plan to the rank in its
environment (THREADWISE_CPUS, THREADWISE_WORKER_CPUS, THREADWISE_NUM_WORKERS,
...), under `threadwise run`, `threadwise bind` or any launcher that runs
`bind`. This module reads that environment; outside threadwise every function
is a no-op or returns the caller's default (but `report`, which prints its one
line anywhere), so a script that uses it runs unchanged anywhere.

    loader = DataLoader(ds, num_workers=threadwise.num_workers(4),
                        worker_init_fn=threadwise.worker_init_fn)
    threadwise.report(images_per_second, unit="img/s")

No dependencies; torch is used only when the script already imported it.
"""

from __future__ import annotations

import math
import os
import sys
from typing import IO, Any, Dict, List, Mapping, Optional, Set

__all__ = [
    "PlacementError",
    "ProcessContext",
    "ProcessExitedException",
    "ProcessRaisedException",
    "__version__",
    "apply",
    "find_binary",
    "num_workers",
    "parse_cpulist",
    "plan",
    "report",
    "spawn",
    "start_processes",
    "worker_init_fn",
]

try:
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("threadwise")
    except PackageNotFoundError:  # run from a source tree
        __version__ = "0+unknown"
except ImportError:  # pragma: no cover - Python < 3.8
    __version__ = "0+unknown"

from ._find import find_binary

#: The line `threadwise tune` reads before any other rate a script prints.
CANONICAL_PREFIX = "threadwise: throughput="

#: Thread-count variables a worker sets to 1 for what it starts itself.
_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

#: The plan's variables for the other pools a rank starts.
_POOL_VARS = (
    "TORCHINDUCTOR_COMPILE_THREADS",
    "OPENCV_FOR_THREADS_NUM",
    "POLARS_MAX_THREADS",
    "RAYON_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def parse_cpulist(text: str, name: str = "cpulist") -> List[int]:
    """CPU ids of a Linux cpulist such as "0-3,8,10-11" (the kernel's and
    threadwise's format), sorted. An empty string is an empty list. `name`
    says where the text came from, for the error message."""
    cpus: Set[int] = set()
    for part in text.strip().strip("\x00").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(
                f"{name}={text!r} is not a CPU list (expected e.g. '0-3,8')"
            ) from None
        if first < 0 or last < first:
            raise ValueError(f"{name}={text!r}: range {part!r} is empty or negative")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _under_threadwise(env: Mapping[str, str]) -> bool:
    return bool(env.get("THREADWISE_CPUS"))


def worker_init_fn(worker_id: int) -> None:
    """A DataLoader `worker_init_fn`: puts this worker on the rank's worker
    CPUs (THREADWISE_WORKER_CPUS, else the rank's own THREADWISE_CPUS) and
    sets its threads to 1 (torch.set_num_threads when torch is imported, and
    the thread variables for anything it starts). Outside threadwise it does
    nothing. `threadwise run` also moves workers from outside; under `bind`
    (srun, mpirun, torchrun --no-python) this is what moves them."""
    del worker_id  # every worker of a rank shares the rank's worker CPUs
    env = os.environ
    if not _under_threadwise(env):
        return
    name = "THREADWISE_WORKER_CPUS"
    spec = env.get(name, "")
    if not spec.strip():
        name, spec = "THREADWISE_CPUS", env["THREADWISE_CPUS"]
    cpus = parse_cpulist(spec, name)
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:  # none of them allowed here (another cpuset)
            print(
                f"threadwise: warning: worker keeps its CPUs: {name}={spec} refused ({e})",
                file=sys.stderr,
            )
    for var in _THREAD_VARS:
        env[var] = "1"
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(1)


def num_workers(default: int = 0) -> int:
    """The DataLoader worker count the plan gives this rank
    (THREADWISE_NUM_WORKERS), or `default` outside threadwise."""
    raw = os.environ.get("THREADWISE_NUM_WORKERS", "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"THREADWISE_NUM_WORKERS={raw!r} is not a whole number"
        ) from None
    if n < 0:
        raise ValueError(f"THREADWISE_NUM_WORKERS={raw!r} is negative")
    return n


def report(
    value: float,
    unit: str = "samples/s",
    *,
    all_ranks: bool = False,
    file: Optional[IO[str]] = None,
) -> Optional[str]:
    """Print the canonical speed line `threadwise tune` reads before any other
    rate in the output: `threadwise: throughput=<value> <unit>`. Only local
    rank 0 prints (LOCAL_RANK unset or 0) unless `all_ranks`. Returns the line
    printed, or None when this rank stays quiet."""
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"report(value={value!r}): a throughput is finite and >= 0")
    if not unit or any(c.isspace() for c in unit) or len(unit) > 32:
        raise ValueError(
            f"report(unit={unit!r}): one word of at most 32 characters, e.g. 'img/s'"
        )
    local_rank = os.environ.get("LOCAL_RANK", "0").strip() or "0"
    if not all_ranks and local_rank != "0":
        return None
    line = f"{CANONICAL_PREFIX}{v!r} {unit}"
    print(line, file=file if file is not None else sys.stdout, flush=True)
    return line


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    raw = env.get(name, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def plan() -> Optional[Dict[str, Any]]:
    """This rank's plan as a dict, from the environment the launcher set
    (the field names of `threadwise plan --json`), for logging; None outside
    threadwise."""
    env = os.environ
    if not _under_threadwise(env):
        return None
    nodes = env.get("THREADWISE_NUMA_NODES", "")
    thread_env = {
        k: v
        for k, v in sorted(env.items())
        if k in _THREAD_VARS
        or k.startswith(("OMP_", "KMP_", "GOMP_"))
        or k in _POOL_VARS
        or k in ("MALLOC_CONF", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")
    }
    return {
        "rank": _int(env, "RANK"),
        "local_rank": _int(env, "LOCAL_RANK"),
        "world_size": _int(env, "WORLD_SIZE"),
        "local_world_size": _int(env, "LOCAL_WORLD_SIZE"),
        "cpus": env["THREADWISE_CPUS"],
        "mem_nodes": [int(n) for n in nodes.split(",") if n.strip().isdigit()],
        "gpu": env.get("THREADWISE_GPU") or None,
        "threads": _int(env, "THREADWISE_NUM_THREADS"),
        "interop_threads": _int(env, "THREADWISE_NUM_INTEROP_THREADS"),
        "workers": _int(env, "THREADWISE_NUM_WORKERS"),
        "worker_cpus": env.get("THREADWISE_WORKER_CPUS", ""),
        "env": thread_env,
    }


from ._apply import apply  # noqa: E402  (they use the functions above)
from ._place import PlacementError  # noqa: E402
from ._spawn import (  # noqa: E402
    ProcessContext,
    ProcessExitedException,
    ProcessRaisedException,
    spawn,
    start_processes,
)
