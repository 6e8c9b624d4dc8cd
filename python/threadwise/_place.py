"""Placing the running process: the system calls `threadwise run` makes before
it execs a rank (sched_setaffinity, set_mempolicy), made here from Python for
ranks that someone else started (`apply`, `spawn`). The slice itself always
comes from the binary (`threadwise bind --json`): one planner, not a second
one in Python."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

from ._find import find_binary

#: set_mempolicy(2) and get_mempolicy(2) by machine (asm/unistd.h).
_SYSCALLS = {
    "x86_64": (238, 239),
    "aarch64": (237, 236),
    "ppc64le": (261, 260),
    "ppc64": (261, 260),
    "s390x": (270, 269),
    "riscv64": (237, 236),
}

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4

_MODE_NAMES = {
    MPOL_DEFAULT: "default",
    MPOL_PREFERRED: "preferred",
    MPOL_BIND: "bind",
    MPOL_INTERLEAVE: "interleave",
    MPOL_LOCAL: "local",
}


class PlacementError(RuntimeError):
    """The kernel refused a binding, or the binary refused the plan; the
    message names what and says what to do."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _nodemask(nodes: Sequence[int]) -> "tuple[Any, int]":
    words = (max(nodes) // 64 + 1) if nodes else 1
    arr = (ctypes.c_ulong * words)()
    for n in nodes:
        arr[n // 64] |= 1 << (n % 64)
    return arr, words * 64 + 1


def set_mempolicy(mode: int, nodes: Sequence[int]) -> None:
    """set_mempolicy(mode, nodes) for the calling thread (inherited by the
    threads and processes it starts afterwards, kept across exec), with the
    arguments `run` passes: no node mask for local and default."""
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        raise OSError(0, f"set_mempolicy: no system call number known for {platform.machine()}")
    libc = _libc()
    if mode in (MPOL_LOCAL, MPOL_DEFAULT) or not nodes:
        r = libc.syscall(ctypes.c_long(nums[0]), ctypes.c_int(mode), None, ctypes.c_ulong(0))
    else:
        arr, maxnode = _nodemask(nodes)
        r = libc.syscall(
            ctypes.c_long(nums[0]), ctypes.c_int(mode), ctypes.byref(arr), ctypes.c_ulong(maxnode)
        )
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def get_mempolicy() -> "tuple[int, List[int]]":
    """The calling thread's memory policy: (mode, nodes)."""
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        raise OSError(0, f"get_mempolicy: no system call number known for {platform.machine()}")
    libc = _libc()
    mode = ctypes.c_int(0)
    words = 16  # 1024 nodes, the kernel's largest MAX_NUMNODES
    arr = (ctypes.c_ulong * words)()
    r = libc.syscall(
        ctypes.c_long(nums[1]),
        ctypes.byref(mode),
        ctypes.byref(arr),
        ctypes.c_ulong(words * 64),
        None,
        ctypes.c_ulong(0),
    )
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    nodes = [w * bits + b for w in range(words) for b in range(bits) if arr[w] >> b & 1]
    return mode.value, nodes


def mode_name(mode: Optional[int]) -> str:
    return "none (inherited)" if mode is None else _MODE_NAMES.get(mode, str(mode))


def threads_of(pid: "int | str" = "self") -> List[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def set_every_thread(cpus: Sequence[int], pid: "int | str" = "self") -> int:
    """The CPU mask of every thread of process `pid` (threads started later
    inherit it from the thread that starts them). Listed again until no new
    thread appears, so one started during the walk is not missed. Returns how
    many threads were set."""
    done: Set[int] = set()
    for _ in range(10):
        new = [t for t in threads_of(pid) if t not in done]
        if not new:
            break
        for tid in new:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # the thread ended meanwhile
                pass
            done.add(tid)
    return len(done)


#: This process's CPUs before `threadwise.apply` narrowed it to its rank's:
#: the node a later plan (`threadwise.spawn`'s children) is made from.
_node_cpus: Optional[Set[int]] = None


def remember_node_cpus() -> None:
    """Keep this process's CPUs as the node's, before the first narrowing."""
    global _node_cpus
    if _node_cpus is None:
        _node_cpus = set(os.sched_getaffinity(0))


def bind_doc(
    local_rank: Optional[int],
    local_world_size: Optional[int],
    options: Sequence[str],
    binary: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    """`threadwise bind --json`: the node's plan and this rank's slice, from
    the binary the wheel ships."""
    exe = binary or os.environ.get("THREADWISE_BIN") or find_binary("threadwise")
    if exe is None:
        raise PlacementError(
            "the threadwise binary is not installed beside this package: "
            "reinstall with `pip install --force-reinstall threadwise`, or set THREADWISE_BIN"
        )
    argv = [exe, "bind", "--json", *options]
    if local_rank is not None and local_world_size is not None:
        argv += ["--local-rank", str(local_rank), "--local-world-size", str(local_world_size)]
    # Planned from the node's CPUs, also where apply() narrowed this process
    # to one rank's: the binary inherits the calling thread's mask, widened
    # for the while it starts (the other threads keep theirs).
    mine = os.sched_getaffinity(0)
    node = _node_cpus
    widen = node is not None and set(mine) != node
    try:
        if node is not None and widen:
            os.sched_setaffinity(0, node)
        p = subprocess.run(
            argv,
            env=dict(env if env is not None else os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PlacementError(f"cannot run {exe}: {e}") from None
    finally:
        if widen:
            os.sched_setaffinity(0, mine)
    if p.returncode != 0:
        said = p.stderr.strip() or f"exit code {p.returncode}"
        raise PlacementError(f"{' '.join(argv[1:])}: {said}")
    doc: Dict[str, Any] = json.loads(p.stdout)
    if doc.get("schema") != "threadwise.bind/1":
        raise PlacementError(
            f"{exe} printed a {doc.get('schema')!r} document, expected threadwise.bind/1: "
            "the binary and the package come from different versions; reinstall threadwise"
        )
    # Each slot carries the table of thread names its holder reads roles by.
    for slot in doc.get("placements", []):
        slot["thread_names"] = doc.get("thread_names", [])
    return doc


def place_thread(slot: Mapping[str, Any]) -> None:
    """Bind the calling thread as the slot says (before a child is started
    from it, so the child is born placed, as `run` does before exec)."""
    cpus = slot.get("cpus")
    if cpus:
        os.sched_setaffinity(0, cpus)
    mode = slot.get("mem_mode")
    if mode is not None:
        set_mempolicy(int(mode), [int(n) for n in slot.get("mem_nodes", [])])


def refused(slot: Mapping[str, Any], what: str, e: OSError) -> PlacementError:
    cpus = slot.get("cpus")
    return PlacementError(
        f"cannot bind local rank {slot.get('local_rank')} ({what} refused for CPUs "
        f"{','.join(map(str, cpus)) if cpus else 'unbound'}, memory "
        f"{mode_name(slot.get('mem_mode'))} {slot.get('mem_nodes', [])}): {e}; "
        "a container's seccomp profile may forbid set_mempolicy (pass options=['--mem', 'none']), "
        "or pass allow_unbound=True to run unbound"
    )


def set_torch_pools(threads: int, interop: Optional[int]) -> List[str]:
    """torch's intra- and inter-op pools (and OpenCV's), when the script has
    imported them; returns what could not be set, for a warning."""
    notes: List[str] = []
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)
        if interop is not None and torch.get_num_interop_threads() != interop:
            try:
                torch.set_num_interop_threads(interop)
            except RuntimeError:
                notes.append(
                    f"torch's inter-op pool already started with {torch.get_num_interop_threads()} "
                    f"threads (the plan says {interop}): call threadwise.apply() before the first "
                    "parallel work"
                )
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(threads)
    return notes


def _exe(pid: "int | str") -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


class WorkerMover(threading.Thread):
    """What `run`'s supervisor does from outside, done from inside for ranks
    no threadwise supervises: every 100 ms, each child running this program
    (a DataLoader worker: a fork, or a re-exec of this interpreter) gets the
    worker CPUs on every thread; a child whose thread count changed is set
    again. A daemon thread: it ends with the process."""

    def __init__(self, cpus: Sequence[int], interval: float = 0.1) -> None:
        super().__init__(name="threadwise-worker-mover", daemon=True)
        self.cpus = list(cpus)
        self.interval = interval
        self.seen: Dict[int, int] = {}
        self.stopped = threading.Event()
        self.me = _exe("self")

    def children(self) -> List[int]:
        out: List[int] = []
        for tid in threads_of("self"):
            try:
                with open(f"/proc/self/task/{tid}/children") as f:
                    out += [int(p) for p in f.read().split()]
            except OSError:
                pass
        return out

    def tick(self) -> int:
        moved = 0
        alive = self.children()
        for pid in alive:
            if _exe(pid) != self.me:
                continue
            n = len(threads_of(pid))
            if self.seen.get(pid) == n:
                continue
            try:
                set_every_thread(self.cpus, pid)
                moved += 1
            except OSError:
                pass
            self.seen[pid] = n
        for gone in set(self.seen) - set(alive):
            del self.seen[gone]
        return moved

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.tick()


def thread_role(pid: int, tid: int, name: str, names: Sequence[Sequence[str]]) -> str:
    """A thread's role as the binary's table says (`bind --json`'s
    "thread_names"), with what only the process knows: Python's own threads
    by their `threading` names (the DataLoader's pin-memory thread is
    "Thread-N (_pin_memory_loop)" since Python 3.10)."""
    if tid == pid:
        return "main"
    for t in threading.enumerate():
        if t.native_id == tid and "(_pin_memory_loop)" in t.name:
            return "pin-memory"
    if "(_pin_" in name:
        return "pin-memory"
    for prefix, role in names:
        if name.startswith(prefix):
            return role
    return "unknown"


SERVICE_ROLES = ("main", "pin-memory", "comm")

#: A thread's name is read again for this many looks after it is first seen
#: (5 s at 0.2 s), as the binary's holder does (src/proc/hold.rs, NAME_TICKS):
#: runtimes name their threads just after starting them.
NAME_TICKS = 25


#: Put-backs of one thread before its next departure is a fight, as the
#: binary's holder (src/proc/hold.rs, TRIES).
TRIES = 3
#: Findings said one by one; the rest are counted (src/proc/hold.rs, SAID).
SAID = 3
#: OpenMP's binding variables (src/proc/hold.rs, BINDING_VARS).
BINDING_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def runtime_binds(env: Mapping[str, str]) -> bool:
    """Whether the OpenMP runtime binds its threads itself, as the binary
    reads the same variables (src/proc/hold.rs, runtime_binds)."""
    for k in BINDING_VARS:
        v = env.get(k, "").strip().lower()
        if not v:
            continue
        if k == "OMP_PROC_BIND" and v == "false":
            continue
        if k == "KMP_AFFINITY" and ("disabled" in v or "none" in v.split(",")):
            continue
        return True
    return False


def fight_hint(name: str) -> str:
    """What to set so that a fighting thread stops (src/proc/hold.rs, fight_hint)."""
    if name.startswith("NCCL") or name.startswith("pt_nccl"):
        return "NCCL_IGNORE_CPU_AFFINITY=1 keeps NCCL from re-pinning its threads"
    if name.startswith("gloo") or name.startswith("pt_"):
        return "torch.set_num_threads or the library's own affinity setting re-pins it"
    return "find what re-pins it (a library's affinity setting), or run with --hold always"


class ThreadHolder(threading.Thread):
    """What `run`'s supervisor does from outside (src/proc/hold.rs, the same
    rules), done from inside for ranks no threadwise supervises. Every
    200 ms: a thread seen outside the rank's CPUs twice in a row is put back
    on its role's CPUs and said, at most TRIES times; its next departure is
    a fight, said once, then left (hold="always": put back still). Inside
    the rank a mask the thread or its runtime chose is never touched: with a
    role layout, only a thread still on the mask it was born with, where
    that is the rank's whole set or a set given to another thread before it
    was first listed (and the OpenMP runtime binds nothing), goes to its
    role's CPUs; a placed thread that sets its own mask has chosen (said
    once). hold=False only says, each departure once. A daemon thread: it
    ends with the process."""

    def __init__(
        self,
        cpus: Sequence[int],
        names: Sequence[Sequence[str]],
        roles: Optional[Mapping[str, Sequence[int]]] = None,
        hold: "bool | str" = True,
        interval: float = 0.2,
        binds: Optional[bool] = None,
    ) -> None:
        super().__init__(name="threadwise-hold", daemon=True)
        self.cpus = frozenset(cpus)
        self.names = [(str(p), str(r)) for p, r in names]
        self.service = frozenset(roles["service"]) if roles else None
        self.team = frozenset(roles["team"]) if roles else None
        self.mode = "always" if hold == "always" else ("on" if hold else "off")
        self.hold = self.mode != "off"
        self.binds = runtime_binds(os.environ) if binds is None else binds
        self.interval = interval
        self.seen: Dict[int, Dict[str, Any]] = {}
        self.given: Dict["frozenset[int]", int] = {}
        self.looks = 0
        self.corrections: Dict[int, int] = {}
        self.said = 0
        self.stopped = threading.Event()

    def target(self, role: str) -> "frozenset[int]":
        if self.service is None or self.team is None:
            return self.cpus
        return self.service if role in SERVICE_ROLES else self.team

    def _line(self, tid: int, s: Dict[str, Any], what: str, mask: "frozenset[int]", target: "frozenset[int]") -> str:
        who = f"thread {tid} '{s['name']}' ({s['role']})"
        if what == "put-back":
            return f"{who} was on CPUs {_cpulist(mask)}, outside the rank's: put back on {_cpulist(target)}"
        if what == "seen":
            return (f"{who} was on CPUs {_cpulist(mask)}, outside the rank's: left there "
                    f"(hold off; its role's CPUs are {_cpulist(target)})")
        if what == "chose":
            return (f"{who} set its own CPUs {_cpulist(mask)} inside the rank after threadwise "
                    f"placed it: its choice, left there (its role's CPUs are {_cpulist(target)})")
        held_on = what == "fight-held"
        return (f"{who} left the rank's CPUs again after {TRIES} put-backs "
                f"(now on {_cpulist(mask)}): a fight with whatever re-pins it; "
                + ("put back again and held on (hold='always'), said no more"
                   if held_on else "left there now (hold='always' keeps putting it back)")
                + "; " + fight_hint(str(s["name"])))

    def decide(self, s: Dict[str, Any], mask: "frozenset[int]") -> str:
        """The binary's `decide` (src/proc/hold.rs), step for step."""
        target = self.target(s["role"])
        if not mask:
            return "leave"
        if not mask <= self.cpus:
            if s["off"] + 1 < 2:
                return "watch"
            if self.mode == "off":
                return "leave" if s["out"] else "seen"
            if s["puts"] < TRIES:
                return "correct"
            if self.mode == "always":
                return "correct" if s["fought"] else "fight-held"
            return "leave" if s["fought"] else "fight"
        if self.service is None or self.team is None:
            return "leave"
        if s["set"] is not None:
            if s["set"] == mask:
                return "place" if mask != target else "leave"
            return "leave" if s["chose"] else "chose"
        if mask != s["first"] or mask == target:
            return "leave"
        inherited = mask == self.cpus or (
            not self.binds and s["could_inherit"] and mask in (self.service, self.team))
        return "place" if inherited else "leave"

    def tick(self) -> List[str]:
        """One look at every thread; what is to be said, in words."""
        self.looks += 1
        look = self.looks
        said: List[str] = []
        pid = os.getpid()
        tids = threads_of("self")
        for gone in set(self.seen) - set(tids):
            del self.seen[gone]
        for tid in tids:
            try:
                mask = frozenset(os.sched_getaffinity(tid))
            except OSError:
                continue
            s = self.seen.get(tid)
            if s is None:
                s = self.seen[tid] = {
                    "ticks": 0, "off": 0, "set": None, "name": "", "first": mask,
                    "could_inherit": self.given.get(mask, look) < look,
                    "out": False, "puts": 0, "fought": False, "chose": False,
                }
            if s["ticks"] < NAME_TICKS:
                try:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        s["name"] = f.read().rstrip("\n")
                except OSError:
                    pass
                s["role"] = thread_role(pid, tid, s["name"], self.names)
            s["ticks"] += 1
            step = self.decide(s, mask)
            target = self.target(s["role"])
            if mask <= self.cpus:
                s["off"], s["out"] = 0, False
            if step == "watch":
                s["off"] += 1
            elif step == "place":
                if self.hold and _set(tid, target):
                    self.given.setdefault(target, look)
                    s["set"] = target
            elif step == "chose":
                s["chose"] = True
                said.append(self._line(tid, s, "chose", mask, target))
            elif step in ("seen", "correct", "fight", "fight-held"):
                s["off"] = 0
                what = step
                if step == "correct":
                    if _set(tid, target):
                        s["puts"] += 1
                        s["set"] = target
                        self.corrections[tid] = self.corrections.get(tid, 0) + 1
                        what = "put-back"
                    else:
                        what = "seen"  # the thread ended meanwhile
                elif step == "seen":
                    s["out"] = True
                else:
                    s["fought"] = True
                    if step == "fight-held" and _set(tid, target):
                        s["puts"] += 1
                        self.corrections[tid] = self.corrections.get(tid, 0) + 1
                    elif step == "fight-held":
                        what = "fight"
                line = self._line(tid, s, what, mask, target)
                if what in ("fight", "fight-held"):
                    said.append(line)
                else:
                    self.said += 1
                    if self.said <= SAID:
                        said.append(line)
        return said

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for line in self.tick():
                print(f"threadwise: warning: {line}", file=sys.stderr, flush=True)


def _set(tid: int, cpus: "frozenset[int]") -> bool:
    try:
        os.sched_setaffinity(tid, cpus)
        return True
    except OSError:
        return False


def _cpulist(cpus: "frozenset[int]") -> str:
    """A CPU list as the binary writes it: 0-3,8."""
    runs: List[List[int]] = []
    for c in sorted(cpus):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
