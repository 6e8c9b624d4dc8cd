"""`threadwise.apply`: this rank's slice applied to the running process, for
ranks started by anything but threadwise (Ray Train's workers, a notebook
launcher's processes, mp.spawn, torchrun without `bind`)."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import _place

#: This process's worker mover (by pid: a fork does not inherit the thread).
_movers: Dict[int, _place.WorkerMover] = {}
#: This process's thread holder (by pid, likewise).
_holders: Dict[int, _place.ThreadHolder] = {}


def _warn(msg: str) -> None:
    print(f"threadwise: warning: {msg}", file=sys.stderr, flush=True)


def apply_slot(
    slot: Mapping[str, Any],
    env: Mapping[str, str],
    env_remove: Sequence[str],
    *,
    move_workers: bool = True,
    allow_unbound: bool = False,
    hold: "bool | str" = True,
) -> None:
    """Apply one rank's slot (an entry of `bind --json`'s "placements") to
    this process: its memory policy for the calling thread (and what it starts
    afterwards), then its CPUs for every thread, its variables, torch's and
    OpenCV's pools, and a mover for DataLoader workers when the worker CPUs
    differ. Nothing is changed when a binding is refused (unless
    `allow_unbound`: then it runs unbound, with a warning)."""
    cpus: Optional[List[int]] = slot.get("cpus")
    mode = slot.get("mem_mode")
    before: Optional["tuple[int, List[int]]"] = None
    if mode is not None:
        try:
            before = _place.get_mempolicy()
            _place.set_mempolicy(int(mode), [int(n) for n in slot.get("mem_nodes", [])])
        except OSError as e:
            if not allow_unbound:
                raise _place.refused(slot, "set_mempolicy", e) from None
            _warn(f"memory policy not set ({e}); running with the inherited one")
    if cpus:
        _place.remember_node_cpus()
        try:
            _place.set_every_thread(cpus)
        except OSError as e:
            if not allow_unbound:
                if before is not None:
                    _place.set_mempolicy(*before)
                raise _place.refused(slot, "sched_setaffinity", e) from None
            _warn(f"CPUs not set ({e}); running unbound")
    for k in env_remove:
        os.environ.pop(k, None)
    os.environ.update(env)
    interop = env.get("THREADWISE_NUM_INTEROP_THREADS", "")
    for note in _place.set_torch_pools(
        int(slot.get("threads") or 1), int(interop) if interop.isdigit() else None
    ):
        _warn(note)
    workers: List[int] = list(slot.get("worker_cpus") or [])
    pid = os.getpid()
    old = _movers.pop(pid, None)
    if old is not None:
        old.stopped.set()
    # Under a role layout a worker forked by the main thread would inherit the
    # service core: moved even where its CPUs are the rank's.
    if move_workers and cpus and workers and (sorted(workers) != sorted(cpus) or slot.get("roles")):
        m = _place.WorkerMover(workers)
        m.start()
        _movers[pid] = m
    old_holder = _holders.pop(pid, None)
    if old_holder is not None:
        old_holder.stopped.set()
    if cpus:
        # Threads a library moves off the rank's CPUs are put back (hold=False:
        # said only); with a role layout, each goes to its role's CPUs.
        h = _place.ThreadHolder(
            cpus, slot.get("thread_names") or [], slot.get("roles"), hold=hold
        )
        h.tick()
        h.start()
        _holders[pid] = h


def _placed_by_threadwise(
    env: Mapping[str, str], local_rank: Optional[int], local_world_size: Optional[int]
) -> bool:
    """Whether `threadwise run`/`bind` (or an earlier apply) placed this
    process already as the rank asked for: its variables are there and its
    CPUs are within THREADWISE_CPUS."""
    spec = env.get("THREADWISE_CPUS", "").strip()
    if not spec:
        return False
    if local_rank is not None and (
        env.get("LOCAL_RANK") != str(local_rank)
        or env.get("LOCAL_WORLD_SIZE") != str(local_world_size)
    ):
        return False
    from . import parse_cpulist

    try:
        cpus = set(parse_cpulist(spec, "THREADWISE_CPUS"))
    except ValueError:
        return False
    return set(os.sched_getaffinity(0)) <= cpus


def apply(
    local_rank: Optional[int] = None,
    local_world_size: Optional[int] = None,
    *,
    options: Sequence[str] = (),
    move_workers: bool = True,
    allow_unbound: bool = False,
    hold: "bool | str" = True,
) -> Dict[str, Any]:
    """Place this process as local rank `local_rank` of `local_world_size`
    ranks on this node, and return its plan (`threadwise.plan()`).

    Without arguments the rank and size are read as `threadwise bind` reads
    them (torchrun's LOCAL_RANK/LOCAL_WORLD_SIZE, Slurm, Open MPI, MPICH,
    Cray PALS); give them for Ray Train (`ray.train.get_context()`), a
    notebook launcher's index, or any starter that sets none. The slice comes
    from the binary (`threadwise bind --json`, with `options` such as
    ["--workers", "4"]), so every sibling computes the same node plan.

    Applied: the CPUs of every thread (threads started later inherit them),
    the memory policy of the calling thread (and of what it starts; pages
    already touched stay where they are), the plan's variables (for what the
    process starts from now on: DataLoader workers, subprocesses), torch's
    intra- and inter-op threads and OpenCV's when imported, and DataLoader
    workers moved to the worker CPUs, and a holder thread that puts back a
    thread a library moves off the rank's CPUs (`hold=False`: said only) and,
    with `--roles` among the options, places each thread by its role. Under
    `threadwise run` or `bind` the process is placed (and held) already: only
    torch's pools are set. Call it first
    thing, before torch does parallel work: a runtime that read
    OMP_NUM_THREADS at import keeps its pool, which torch.set_num_threads
    then resizes."""
    if (local_rank is None) != (local_world_size is None):
        raise ValueError(
            "apply(local_rank=..., local_world_size=...): give both (this process's index "
            "among the ranks of this node, and their number) or neither"
        )
    if local_rank is not None and local_world_size is not None:
        for name, v in (("local_rank", local_rank), ("local_world_size", local_world_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"apply({name}={v!r}): a whole number >= 0")
        if local_rank >= local_world_size:
            raise ValueError(
                f"apply(local_rank={local_rank}, local_world_size={local_world_size}): "
                "a local rank is 0 to local_world_size - 1"
            )
    from . import plan

    env = os.environ
    if _placed_by_threadwise(env, local_rank, local_world_size):
        threads = env.get("THREADWISE_NUM_THREADS", "")
        interop = env.get("THREADWISE_NUM_INTEROP_THREADS", "")
        for note in _place.set_torch_pools(
            int(threads) if threads.isdigit() else 1, int(interop) if interop.isdigit() else None
        ):
            _warn(note)
        p = plan()
        assert p is not None
        return p
    doc = _place.bind_doc(local_rank, local_world_size, options)
    k = int(doc["local_rank"])
    slot = doc["placements"][k]
    child_env = dict(doc["env"])
    if local_rank is not None:
        # The caller's numbers, over what a parent's launcher left behind.
        child_env["LOCAL_RANK"] = str(local_rank)
        child_env["LOCAL_WORLD_SIZE"] = str(local_world_size)
    apply_slot(
        slot,
        child_env,
        doc.get("env_remove", []),
        move_workers=move_workers,
        allow_unbound=allow_unbound,
        hold=hold,
    )
    p = plan()
    assert p is not None
    return p
