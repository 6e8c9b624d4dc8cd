"""The helper's own rules, without a launcher: parsing, and doing nothing
outside threadwise."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import threadwise


def test_parse_cpulist() -> None:
    assert threadwise.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert threadwise.parse_cpulist("5") == [5]
    assert threadwise.parse_cpulist("3,1-2,2") == [1, 2, 3]
    assert threadwise.parse_cpulist("") == []
    assert threadwise.parse_cpulist("0-1\x00") == [0, 1]
    with pytest.raises(ValueError, match="THREADWISE_CPUS='a-b'"):
        threadwise.parse_cpulist("a-b", "THREADWISE_CPUS")
    with pytest.raises(ValueError, match="empty or negative"):
        threadwise.parse_cpulist("3-1")


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("THREADWISE_") or k in ("LOCAL_RANK", "OMP_NUM_THREADS"):
            monkeypatch.delenv(k)


def test_outside_threadwise_nothing_changes(outside: None) -> None:
    before = os.sched_getaffinity(0)
    threadwise.worker_init_fn(3)
    assert os.sched_getaffinity(0) == before
    assert "OMP_NUM_THREADS" not in os.environ
    assert threadwise.num_workers(5) == 5
    assert threadwise.num_workers() == 0
    assert threadwise.plan() is None


def test_report_prints_the_canonical_line_on_local_rank_0(
    outside: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = io.StringIO()
    assert threadwise.report(41.5, file=buf) == "threadwise: throughput=41.5 samples/s"
    assert threadwise.report(2, "img/s", file=buf) == "threadwise: throughput=2.0 img/s"
    assert buf.getvalue().splitlines() == [
        "threadwise: throughput=41.5 samples/s",
        "threadwise: throughput=2.0 img/s",
    ]
    monkeypatch.setenv("LOCAL_RANK", "1")
    quiet = io.StringIO()
    assert threadwise.report(41.5, file=quiet) is None
    assert quiet.getvalue() == ""
    assert threadwise.report(41.5, all_ranks=True, file=quiet) is not None
    assert quiet.getvalue() == "threadwise: throughput=41.5 samples/s\n"


@pytest.mark.parametrize(
    "value,unit",
    [(float("nan"), "img/s"), (float("inf"), "img/s"), (-1.0, "img/s"), (1.0, ""),
     (1.0, "img per s"), (1.0, "x" * 33)],
)
def test_report_refuses_what_tune_could_not_read(value: float, unit: str) -> None:
    with pytest.raises(ValueError, match="report"):
        threadwise.report(value, unit, file=io.StringIO())


def test_num_workers_names_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADWISE_NUM_WORKERS", "four")
    with pytest.raises(ValueError, match="THREADWISE_NUM_WORKERS='four'"):
        threadwise.num_workers(2)
    monkeypatch.setenv("THREADWISE_NUM_WORKERS", "-1")
    with pytest.raises(ValueError, match="negative"):
        threadwise.num_workers(2)


def test_worker_init_fn_applies_the_worker_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a forked child, so the test process keeps its own mask.
    allowed = sorted(os.sched_getaffinity(0))
    target = allowed[-1:]
    monkeypatch.setenv("THREADWISE_CPUS", ",".join(map(str, allowed)))
    monkeypatch.setenv("THREADWISE_WORKER_CPUS", str(target[0]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        threadwise.worker_init_fn(0)
        mask = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        os.write(w, f"{mask};{os.environ.get('OMP_NUM_THREADS')}".encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert got == f"{target[0]};1"


def test_the_keyword_arguments_in_docs_spawn_md_are_the_functions() -> None:
    """docs/spawn.md's table names every keyword argument of spawn,
    start_processes and apply, with its default, and nothing else."""
    import inspect
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "spawn.md").read_text()
    table = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", doc, re.M)}
    for fn in (threadwise.spawn, threadwise.start_processes, threadwise.apply):
        kw = {
            name: repr(p.default)
            for name, p in inspect.signature(fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }
        assert kw == table, (fn.__name__, kw, table)


def test_cpu_lists_are_written_as_the_binary_writes_them() -> None:
    from threadwise._place import _cpulist

    for cpus, want in [({0, 1, 2, 3, 8}, "0-3,8"), ({5}, "5"), ({0, 2, 4}, "0,2,4"), ({1, 2, 5, 6, 7, 9}, "1-2,5-7,9")]:
        assert _cpulist(frozenset(cpus)) == want


def _holder(**kw: object) -> "threadwise._place.ThreadHolder":
    from threadwise import _place

    return _place.ThreadHolder([4, 5, 6, 7], [], {"service": [4], "team": [5, 6, 7]}, binds=False, **kw)  # type: ignore[arg-type]


def _thread(first: "frozenset[int]", **kw: object) -> "dict[str, object]":
    s: "dict[str, object]" = {
        "ticks": 1, "off": 0, "set": None, "name": "x", "first": first, "role": "unknown",
        "could_inherit": False, "out": False, "puts": 0, "fought": False, "chose": False,
    }
    s.update(kw)
    return s


def test_the_helpers_holder_decides_as_the_binary_does() -> None:
    """src/proc/hold.rs's `decide`, case for case (its unit tests)."""
    wide, rank = frozenset(range(16)), frozenset([4, 5, 6, 7])
    h = _holder()
    assert h.decide(_thread(rank), wide) == "watch"
    assert h.decide(_thread(rank, off=1), wide) == "correct"
    # A fight: bounded at three put-backs, said once.
    assert h.decide(_thread(rank, off=1, puts=3), wide) == "fight"
    assert h.decide(_thread(rank, off=1, puts=3, fought=True), wide) == "leave"
    always = _holder(hold="always")
    assert always.decide(_thread(rank, off=1, puts=3), wide) == "fight-held"
    assert always.decide(_thread(rank, off=1, puts=9, fought=True), wide) == "correct"
    # hold=False: a departure seen once.
    off = _holder(hold=False)
    assert off.decide(_thread(rank, off=1), wide) == "seen"
    assert off.decide(_thread(rank, off=1, out=True), wide) == "leave"
    # Inside the rank: only an inherited mask is placed.
    assert h.decide(_thread(rank, role="main"), rank) == "place"
    four = frozenset([4])
    assert h.decide(_thread(four, could_inherit=True), four) == "place"
    assert h.decide(_thread(four), four) == "leave"  # its own pin
    assert h.decide(_thread(rank), four) == "leave"  # changed, not by us
    assert _holder().decide(_thread(four, could_inherit=True), four) == "place"
    from threadwise import _place

    binds = _place.ThreadHolder([4, 5, 6, 7], [], {"service": [4], "team": [5, 6, 7]}, binds=True)
    assert binds.decide(_thread(four, could_inherit=True), four) == "leave"
    # Placed, then its own choice: said once.
    team = frozenset([5, 6, 7])
    assert h.decide(_thread(rank, set=team), rank) == "chose"
    assert h.decide(_thread(rank, set=team, chose=True), rank) == "leave"
    assert h.decide(_thread(rank, set=team, role="comm"), team) == "place"


def test_the_binding_variables_are_read_as_the_binary_reads_them() -> None:
    from threadwise import _place

    assert _place.runtime_binds({"OMP_PROC_BIND": "close"})
    assert not _place.runtime_binds({"OMP_PROC_BIND": "false"})
    assert _place.runtime_binds({"OMP_PLACES": "{1},{0}"})
    assert not _place.runtime_binds({"KMP_AFFINITY": "disabled"})
    assert not _place.runtime_binds({})
