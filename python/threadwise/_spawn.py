"""`threadwise.spawn`: `torch.multiprocessing.spawn` with each child placed.

Same signature and semantics as torch's (errors re-raised in the parent, the
remaining children stopped, a `ProcessContext` with `join=False`); when the
script has imported torch, the context and the exceptions are torch's own
classes, so `except torch.multiprocessing.ProcessRaisedException` still
catches them. Each child is born placed: before it is started, the starting
thread takes the child's CPUs and memory policy and the environment takes the
child's variables (the spawn start method execs a fresh interpreter that
inherits all three, before its imports read OMP_NUM_THREADS), then gets its
own back. In the child, before `fn` runs, every thread takes the rank's CPUs,
torch's pools their sizes, and DataLoader workers are moved to the worker CPUs.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import _place
from ._apply import apply_slot


class ProcessException(Exception):
    """A child failed (torch's `ProcessException` when torch is imported)."""

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self) -> Any:
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A child's code raised; the message holds its traceback."""


class ProcessExitedException(ProcessException):
    """A child exited with a nonzero code or was killed by a signal."""

    def __init__(
        self,
        msg: str,
        error_index: int,
        error_pid: int,
        exit_code: int,
        signal_name: Optional[str] = None,
    ):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> Any:
        return (
            type(self),
            (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name),
        )


def _torch_mp() -> Any:
    """torch.multiprocessing when the script imported torch, else None."""
    mod = sys.modules.get("torch.multiprocessing")
    return mod if mod is not None and hasattr(mod, "ProcessContext") else None


class ProcessContext:
    """The running children of `spawn(..., join=False)`, as torch's."""

    def __init__(self, processes: List[Any], error_files: List[str]):
        self.error_files = error_files
        self.processes = processes
        self.sentinels: Dict[Any, int] = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self) -> List[int]:
        return [int(p.pid) for p in self.processes]

    def _join_all(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, end - time.monotonic()))

    def join(self, timeout: Optional[float] = None, grace_period: Optional[float] = None) -> bool:
        """True when every child has exited 0, False while some still run
        (after `timeout`); when one failed, stops the others (SIGTERM, then
        SIGKILL after the grace period) and raises why it failed."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        error_index = None
        for s in ready:
            index = self.sentinels.pop(s)
            p = self.processes[index]
            p.join()
            if p.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            return not self.sentinels
        if grace_period is not None:
            self._join_all(grace_period)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        self._join_all(30 if grace_period is None else grace_period)
        for p in self.processes:
            if p.is_alive():
                p.kill()
            p.join()
        failed = self.processes[error_index]
        if not os.access(self.error_files[error_index], os.R_OK):
            code = failed.exitcode
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"<Unknown signal {-code}>"
                raise ProcessExitedException(
                    f"process {error_index:d} terminated with signal {name}",
                    error_index=error_index,
                    error_pid=failed.pid,
                    exit_code=code,
                    signal_name=name,
                )
            raise ProcessExitedException(
                f"process {error_index:d} terminated with exit code {code:d}",
                error_index=error_index,
                error_pid=failed.pid,
                exit_code=code,
            )
        with open(self.error_files[error_index], "rb") as fh:
            trace = pickle.load(fh)
        msg = f"\n\n-- Process {error_index:d} terminated with the following error:\n" + trace
        raise ProcessRaisedException(msg, error_index, failed.pid)


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGINT), as torch's children ask."""
    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGINT), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _wrap(
    fn: Callable[..., Any],
    i: int,
    args: Tuple[Any, ...],
    error_file: str,
    slot: Dict[str, Any],
    env: Dict[str, str],
    env_remove: List[str],
    move_workers: bool,
    allow_unbound: bool,
    hold: "bool | str" = True,
) -> None:
    _die_with_parent()
    parent = os.getppid()
    try:
        apply_slot(slot, env, env_remove, move_workers=move_workers, allow_unbound=allow_unbound, hold=hold)
        fn(i, *args)
    except KeyboardInterrupt:
        if os.getppid() == parent:  # not the parent's death: a failure like any other
            import traceback

            with open(error_file, "wb") as fh:
                pickle.dump(traceback.format_exc(), fh)
            sys.exit(128 + signal.SIGINT)
    except Exception:
        import traceback

        with open(error_file, "wb") as fh:
            pickle.dump(traceback.format_exc(), fh)
        sys.exit(1)


@contextlib.contextmanager
def _born_placed(
    slot: Mapping[str, Any], env: Mapping[str, str], env_remove: Sequence[str], allow_unbound: bool
) -> Iterator[None]:
    """The calling thread and the environment as the child is to have them,
    while it is started; both given back afterwards."""
    keys = set(env) | set(env_remove)
    saved = {k: os.environ.get(k) for k in keys}
    mask = os.sched_getaffinity(0)
    try:
        policy: Optional[Tuple[int, List[int]]] = _place.get_mempolicy()
    except OSError:
        policy = None
    try:
        for k in env_remove:
            os.environ.pop(k, None)
        os.environ.update(env)
        try:
            _place.place_thread(slot)
        except OSError as e:
            if not allow_unbound:
                raise _place.refused(slot, "placing the child", e) from None
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.sched_setaffinity(0, mask)
        if policy is not None:
            with contextlib.suppress(OSError):
                _place.set_mempolicy(*policy)


def start_processes(
    fn: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    options: Sequence[str] = (),
    move_workers: bool = True,
    allow_unbound: bool = False,
    hold: "bool | str" = True,
) -> Any:
    """`torch.multiprocessing.start_processes` with each child placed: any
    start method (spawn, fork, forkserver). Under fork and forkserver the
    child's runtimes may have read their thread variables before it is
    placed; torch's pools are set again in the child. Each child holds its
    threads as `apply` does: `hold=False` only says which left its CPUs."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: the number of processes is a whole number >= 1")
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start_method={start_method!r}: one of {', '.join(multiprocessing.get_all_start_methods())}"
        )
    doc = _place.bind_doc(0, nprocs, options)
    slots: List[Dict[str, Any]] = doc["placements"]
    env_remove: List[str] = list(doc.get("env_remove", []))
    mp: Any = multiprocessing.get_context(start_method)
    processes: List[Any] = []
    error_files: List[str] = []
    try:
        for i in range(nprocs):
            slot = slots[i]
            env = dict(slot["env"])
            env["LOCAL_RANK"] = str(i)
            env["LOCAL_WORLD_SIZE"] = str(nprocs)
            tf = tempfile.NamedTemporaryFile(prefix="threadwise-errorfile-", suffix=".pickle", delete=False)
            tf.close()
            os.unlink(tf.name)
            p = mp.Process(
                target=_wrap,
                args=(fn, i, args, tf.name, slot, env, env_remove, move_workers, allow_unbound, hold),
                daemon=daemon,
            )
            with _born_placed(slot, env, env_remove, allow_unbound):
                p.start()
            processes.append(p)
            error_files.append(tf.name)
    except BaseException:
        # Never a half-started job: the children started so far are stopped.
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join()
        raise
    torch_mp = _torch_mp()
    cls = torch_mp.ProcessContext if torch_mp is not None else ProcessContext
    context = cls(processes, error_files)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(
    fn: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    options: Sequence[str] = (),
    move_workers: bool = True,
    allow_unbound: bool = False,
    hold: "bool | str" = True,
) -> Any:
    """A drop-in for `torch.multiprocessing.spawn`: starts `nprocs` children
    running `fn(i, *args)`, each on its own slice of this node's plan (what
    `threadwise bind --json --local-world-size nprocs` prints: CPUs for every
    thread, memory policy, thread variables, torch's intra- and inter-op
    threads, DataLoader workers on the worker CPUs, LOCAL_RANK and
    LOCAL_WORLD_SIZE). `options` are `threadwise plan` options
    (e.g. ["--workers", "4"]). A thread a library moves off its child's
    CPUs is put back (`hold=False`: only said, as `run --hold off`).
    Returns None, or a ProcessContext when `join=False`. As torch's does, it always uses the spawn start method
    (warning otherwise); `start_processes` honours the others."""
    if start_method != "spawn":
        warnings.warn(
            f"This method only supports start_method=spawn (got: {start_method}).\n"
            "To use a different start_method use:\n\t\t threadwise.start_processes(...)",
            FutureWarning,
            stacklevel=2,
        )
    return start_processes(
        fn,
        args,
        nprocs,
        join,
        daemon,
        start_method="spawn",
        options=options,
        move_workers=move_workers,
        allow_unbound=allow_unbound,
        hold=hold,
    )
