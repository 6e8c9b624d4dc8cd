"""The helper against the real binary: `threadwise run`, `threadwise bind` and
`threadwise tune` start real processes that import the helper, and their
results are checked against `threadwise plan --json` for this machine.

The binary is the one installed beside the package (a venv with the wheel),
or THREADWISE_BIN (e.g. target/debug/threadwise from a source tree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

import threadwise

BIN = os.environ.get("THREADWISE_BIN") or threadwise.find_binary("threadwise")


def test_the_package_under_test_is_the_installed_one() -> None:
    if os.environ.get("THREADWISE_EXPECT_INSTALLED") == "1":
        assert "site-packages" in threadwise.__file__, threadwise.__file__
        assert threadwise.__version__ != "0+unknown"


def binary() -> str:
    if not BIN:
        pytest.fail(
            "no threadwise binary: install the wheel into this venv "
            "(scripts/test-wheel.sh does) or set THREADWISE_BIN"
        )
    return BIN


def clean_env(**extra: str) -> Dict[str, str]:
    """This environment without any launcher's or threadwise's variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("THREADWISE_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
    }
    # The helper must import in the ranks whether it was installed or is
    # run from the source tree.
    here = str(Path(threadwise.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def tw(*args: str, env: Dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [binary(), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, f"threadwise {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def planned(n: int, tmp_path: Path) -> List[Dict[str, Any]]:
    out = tw("plan", "-n", str(n), "--json", env=clean_env(), cwd=tmp_path).stdout
    ranks = json.loads(out)["ranks"]
    # Otherwise worker_init_fn would have nothing to change.
    assert any(r["worker_cpus"] != r["cpus"] for r in ranks), (
        f"these tests need a machine where {n} ranks' DataLoader workers get other "
        f"CPUs than their rank (2 or more CPUs): {ranks}"
    )
    return ranks


# A rank: records its plan as the helper reads it, then forks a worker the way
# DataLoader does; the worker starts on the rank's CPUs (inherited) and calls
# worker_init_fn.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import threadwise

    out = sys.argv[1]
    rank = os.environ.get("LOCAL_RANK", "0")
    allowed = sorted(os.sched_getaffinity(0))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        before = sorted(os.sched_getaffinity(0))
        threadwise.worker_init_fn(0)
        os.write(w, json.dumps({
            "before": before,
            "after": sorted(os.sched_getaffinity(0)),
            "omp": os.environ.get("OMP_NUM_THREADS"),
        }).encode())
        os._exit(0)
    os.close(w)
    worker = json.loads(os.read(r, 65536).decode())
    os.waitpid(pid, 0)
    line = threadwise.report(10.5 + int(rank), "img/s")
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({
            "plan": threadwise.plan(),
            "workers": threadwise.num_workers(-1),
            "affinity": sorted(os.sched_getaffinity(0)),
            "worker": worker,
            "reported": line,
        }, f)
    """
)


@pytest.fixture
def rank_script(tmp_path: Path) -> Path:
    p = tmp_path / "rank.py"
    p.write_text(RANK_SCRIPT)
    return p


def check_rank(got: Dict[str, Any], want: Dict[str, Any], local_rank: int) -> None:
    plan = got["plan"]
    assert plan is not None, "plan() is None under threadwise"
    assert plan["local_rank"] == local_rank
    assert plan["cpus"] == want["cpus"]
    assert plan["worker_cpus"] == want["worker_cpus"]
    assert plan["mem_nodes"] == want["mem_nodes"]
    assert plan["threads"] == want["threads"]
    assert plan["workers"] == want["workers"]
    assert plan["env"]["OMP_NUM_THREADS"] == want["env"]["OMP_NUM_THREADS"]
    assert got["workers"] == want["workers"]
    # The rank runs on its CPUs; its worker starts there (inherited) and ends
    # on the worker CPUs with one thread.
    assert got["affinity"] == threadwise.parse_cpulist(want["cpus"])
    assert got["worker"]["before"] == got["affinity"]
    worker_cpus = threadwise.parse_cpulist(want["worker_cpus"] or want["cpus"])
    assert got["worker"]["after"] == worker_cpus, got["worker"]
    assert got["worker"]["omp"] == "1"


def test_run_ranks_read_their_plan_and_place_their_workers(tmp_path: Path, rank_script: Path) -> None:
    want = planned(2, tmp_path)
    # --no-move-workers: only worker_init_fn moves the worker here.
    p = tw(
        "run", "-n", "2", "--no-move-workers", "--no-doctor", "--",
        sys.executable, str(rank_script), str(tmp_path),
        env=clean_env(), cwd=tmp_path,
    )
    for r in (0, 1):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        check_rank(got, want[r], r)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["reported"] == "threadwise: throughput=10.5 img/s"
    assert rank1["reported"] is None, "only local rank 0 reports"
    assert "threadwise: throughput=10.5 img/s" in p.stdout
    assert "throughput=11.5" not in p.stdout


@pytest.mark.parametrize("local_rank", [0, 1])
def test_bind_under_a_torchrun_like_launcher(tmp_path: Path, rank_script: Path, local_rank: int) -> None:
    want = planned(2, tmp_path)
    env = clean_env(
        LOCAL_RANK=str(local_rank), RANK=str(local_rank), LOCAL_WORLD_SIZE="2", WORLD_SIZE="2",
        GROUP_RANK="0", TORCHELASTIC_RUN_ID="test", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
    )
    tw("bind", "--", sys.executable, str(rank_script), str(tmp_path), env=env, cwd=tmp_path)
    got = json.loads((tmp_path / f"rank{local_rank}.json").read_text())
    check_rank(got, want[local_rank], local_rank)
    assert (got["reported"] is not None) == (local_rank == 0)


def test_tune_reads_the_reported_line_before_any_other_rate(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import threadwise
        print("Epoch: [0] [8/8] lr: 0.1 img/s: 999.0 loss: 2.3")
        print("{'train_samples_per_second': '888.0'}")
        threadwise.report(123.25, unit="img/s")
        print("100%|##########| 30/30 [00:01<00:00, 77.7it/s]")
        """
    ))
    out = tmp_path / "tune.json"
    tw(
        "tune", "-n", "1", "--runs", "1", "--strategy", "all", "--grid", "threads=1",
        "--export-json", str(out), "--", sys.executable, str(script),
        env=clean_env(), cwd=tmp_path, timeout=300,
    )
    report = json.loads(out.read_text())
    assert report["unit"] == "img/s"
    trials = [t for c in report["configs"] for t in c["trials"]]
    assert trials, report
    for t in trials:
        assert t["throughput"] == 123.25, t
        assert t["hit"]["kind"] == "canonical", t["hit"]
        assert t["hit"]["line"] == "threadwise: throughput=123.25 img/s"


@pytest.mark.skipif(
    bool(os.environ.get("THREADWISE_BIN")),
    reason="THREADWISE_BIN: a source tree, where no binary is installed beside the package",
)
def test_python_m_threadwise_is_the_binary(tmp_path: Path) -> None:
    want = tw("--version", env=clean_env(), cwd=tmp_path).stdout
    got = subprocess.run(
        [sys.executable, "-m", "threadwise", "--version"],
        env=clean_env(), capture_output=True, text=True, check=True,
    ).stdout
    assert got == want
    assert got.startswith("threadwise ")
