"""`threadwise.spawn` and `threadwise.apply` against real child processes:
each child's CPUs on every one of its threads (/proc/self/task/*/status), its
memory policy (get_mempolicy and /proc/self/numa_maps), its variables, its
forked workers moved to the worker CPUs, a failing child's exception re-raised
in the parent, and the parent given back its own placement. Every figure is
checked against `threadwise plan --json` for this machine."""

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
from threadwise import _place
from test_helper import clean_env, planned, tw

# What a child records of itself: every thread's CPUs, its memory policy both
# ways, the variables the plan sets, and (when asked) a forked worker's CPUs
# once the mover has had time to see it.
PROBE = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import threadwise
    from threadwise import _place

    def masks():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[tid] = line.split()[1]
        return out

    def numa_maps_policy():
        with open("/proc/self/numa_maps") as f:
            return f.readline().split()[1]

    def forked_worker_cpus():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            before = sorted(os.sched_getaffinity(0))
            for _ in range(50):  # up to 5 s for the mover's 100 ms tick
                if sorted(os.sched_getaffinity(0)) != before:
                    break
                time.sleep(0.1)
            os.write(w, json.dumps([before, sorted(os.sched_getaffinity(0))]).encode())
            os._exit(0)
        os.close(w)
        got = json.loads(os.read(r, 4096).decode())
        os.waitpid(pid, 0)
        return got

    def record(i, out, fork_worker=False, extra=None):
        mode, nodes = _place.get_mempolicy()
        rec = {
            "i": i,
            "pid": os.getpid(),
            "masks": masks(),
            "mode": mode,
            "nodes": nodes,
            "numa_maps": numa_maps_policy(),
            "env": {k: os.environ.get(k) for k in (
                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "THREADWISE_CPUS", "THREADWISE_WORKER_CPUS",
                "THREADWISE_NUM_WORKERS", "TORCHINDUCTOR_COMPILE_THREADS", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE", "FROM_PARENT")},
            "plan": threadwise.plan(),
        }
        if fork_worker:
            rec["worker"] = forked_worker_cpus()
        rec.update(extra or {})
        with open(os.path.join(out, f"child{i}.json"), "w") as f:
            json.dump(rec, f)
    """
)


def write(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def py(script: Path, *args: str, env: Dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=env, cwd=script.parent, capture_output=True, text=True, timeout=timeout,
    )


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def env_for(tmp_path: Path, **extra: str) -> Dict[str, str]:
    env = clean_env(**extra)
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    bin_ = os.environ.get("THREADWISE_BIN")
    if bin_:
        env["THREADWISE_BIN"] = bin_
    return env


def load(tmp_path: Path, i: int) -> Dict[str, Any]:
    rec: Dict[str, Any] = json.loads((tmp_path / f"child{i}.json").read_text())
    return rec


def check_child(rec: Dict[str, Any], want: Dict[str, Any], n: int, mode: int, policy: str) -> None:
    cpus = want["cpus"]
    # Every thread, the main one and those started before and after placing.
    assert len(rec["masks"]) >= 2, rec["masks"]
    assert set(rec["masks"].values()) == {cpus}, rec["masks"]
    assert rec["mode"] == mode, rec
    assert rec["numa_maps"].startswith(policy), rec["numa_maps"]
    env = rec["env"]
    assert env["OMP_NUM_THREADS"] == want["env"]["OMP_NUM_THREADS"]
    assert env["MKL_NUM_THREADS"] == want["env"]["MKL_NUM_THREADS"]
    assert env["THREADWISE_CPUS"] == cpus
    assert env["THREADWISE_WORKER_CPUS"] == want["worker_cpus"]
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == want["env"]["TORCHINDUCTOR_COMPILE_THREADS"]
    assert env["LOCAL_RANK"] == str(rec["i"])
    assert env["LOCAL_WORLD_SIZE"] == str(n)
    assert rec["plan"]["cpus"] == cpus and rec["plan"]["threads"] == want["threads"]


SPAWN = """
    import os, sys, threading, time
    import threadwise, probe
    from threadwise import _place

    def child(i, out, fail):
        # A thread that exists before anything else of the child runs.
        t = threading.Thread(target=time.sleep, args=(0.3,))
        t.start()
        probe.record(i, out, fork_worker=True)
        t.join()
        if fail == str(i):
            raise ValueError(f"child {i} failed on purpose")
        if fail == "sleep":
            time.sleep(60)

    if __name__ == "__main__":
        out, fail, *opts = sys.argv[1:]
        mask, policy = sorted(os.sched_getaffinity(0)), _place.get_mempolicy()
        os.environ["FROM_PARENT"] = "yes"
        try:
            threadwise.spawn(child, args=(out, fail), nprocs=2, options=opts)
        except threadwise.ProcessRaisedException as e:
            print("raised", e.error_index, "child 1 failed on purpose" in str(e), "Traceback" in str(e))
        # The parent has its own placement and variables back.
        assert sorted(os.sched_getaffinity(0)) == mask
        assert _place.get_mempolicy() == policy
        assert "THREADWISE_CPUS" not in os.environ and "OMP_NUM_THREADS" not in os.environ
        print("parent restored")
"""


@pytest.mark.parametrize(
    "opts, mode, policy",
    [([], 4, "local"), (["--mem", "bind"], 2, "bind:0"), (["--mem", "interleave"], 3, "interleave:0")],
)
def test_spawn_places_every_child(tmp_path: Path, opts: List[str], mode: int, policy: str) -> None:
    want = planned(2, tmp_path)
    script = write(tmp_path, "spawn_ddp.py", SPAWN)
    out = ok(py(script, str(tmp_path), "none", *opts, env=env_for(tmp_path)))
    assert "parent restored" in out
    for i in (0, 1):
        rec = load(tmp_path, i)
        check_child(rec, want[i], 2, mode, policy)
        assert rec["env"]["FROM_PARENT"] == "yes", "the parent's own variables pass through"
        # A forked worker starts on the rank's CPUs and is moved to the worker CPUs.
        before, after = rec["worker"]
        assert before == threadwise.parse_cpulist(want[i]["cpus"])
        assert after == threadwise.parse_cpulist(want[i]["worker_cpus"]), rec["worker"]
    a, b = (set(threadwise.parse_cpulist(load(tmp_path, i)["env"]["THREADWISE_CPUS"])) for i in (0, 1))
    assert not a & b, "the children's CPUs are disjoint"


def test_spawn_reraises_a_childs_exception_and_stops_the_others(tmp_path: Path) -> None:
    script = write(tmp_path, "spawn_fail.py", SPAWN)
    out = ok(py(script, str(tmp_path), "1", env=env_for(tmp_path)))
    assert "raised 1 True True" in out, out
    assert "parent restored" in out


SPAWN_KILLED = """
    import os, signal, sys, time
    import threadwise

    def child(i):
        if i == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    if __name__ == "__main__":
        t = time.monotonic()
        try:
            threadwise.spawn(child, nprocs=2)
        except threadwise.ProcessExitedException as e:
            print("exited", e.error_index, e.exit_code, e.signal_name, time.monotonic() - t < 30)
"""


def test_a_killed_child_is_reported_with_its_signal(tmp_path: Path) -> None:
    script = write(tmp_path, "spawn_killed.py", SPAWN_KILLED)
    out = ok(py(script, env=env_for(tmp_path)))
    assert "exited 0 -9 SIGKILL True" in out, out


SPAWN_NOJOIN = """
    import sys, time
    import threadwise, probe

    def child(i, out):
        probe.record(i, out)
        time.sleep(1.0)

    if __name__ == "__main__":
        ctx = threadwise.spawn(child, args=(sys.argv[1],), nprocs=2, join=False)
        pids = ctx.pids()
        first = ctx.join(timeout=0.05)
        while not ctx.join():
            pass
        print(type(ctx).__name__, len(pids), first, ctx.join())
"""


def test_join_false_returns_a_process_context(tmp_path: Path) -> None:
    script = write(tmp_path, "spawn_nojoin.py", SPAWN_NOJOIN)
    out = ok(py(script, str(tmp_path), env=env_for(tmp_path)))
    assert "ProcessContext 2 False True" in out, out
    pids = {load(tmp_path, i)["pid"] for i in (0, 1)}
    assert len(pids) == 2


START_FORK = """
    import sys
    import threadwise, probe

    def child(i, out):
        probe.record(i, out)

    if __name__ == "__main__":
        threadwise.start_processes(child, args=(sys.argv[1],), nprocs=2, start_method="fork")
"""


def test_start_processes_with_fork(tmp_path: Path) -> None:
    want = planned(2, tmp_path)
    script = write(tmp_path, "fork.py", START_FORK)
    ok(py(script, str(tmp_path), env=env_for(tmp_path)))
    for i in (0, 1):
        check_child(load(tmp_path, i), want[i], 2, 4, "local")


def test_spawn_refuses_a_plan_the_machine_cannot_hold(tmp_path: Path) -> None:
    script = write(tmp_path, "spawn_many.py", """
        import threadwise
        def child(i):
            pass
        if __name__ == "__main__":
            try:
                threadwise.spawn(child, nprocs=64)
            except threadwise.PlacementError as e:
                print("refused:", e)
    """)
    out = ok(py(script, env=env_for(tmp_path)))
    assert "refused: bind --json --local-rank 0 --local-world-size 64" in out, out
    assert "--oversubscribe" in out, "the binary's hint comes through"


APPLY = """
    import os, sys, threading, time
    import threadwise, probe

    t = threading.Thread(target=time.sleep, args=(1.0,))
    t.start()  # a thread started before apply: it is placed too
    out, *rest = sys.argv[1:]
    args = [int(x) for x in rest]
    p = threadwise.apply(*args)
    again = threadwise.apply(*args)
    probe.record(int(os.environ["LOCAL_RANK"]), out, fork_worker=True,
                 extra={"returned": p, "again": again})
    t.join()
"""


@pytest.mark.parametrize("local_rank", [0, 1])
def test_apply_with_the_callers_rank(tmp_path: Path, local_rank: int) -> None:
    want = planned(2, tmp_path)
    script = write(tmp_path, "apply.py", APPLY)
    # A parent launcher's leftovers (Ray workers under threadwise run -n 1
    # inherit LOCAL_RANK=0): the caller's numbers win.
    ok(py(script, str(tmp_path), str(local_rank), "2", env=env_for(tmp_path, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")))
    rec = load(tmp_path, local_rank)
    check_child(rec, want[local_rank], 2, 4, "local")
    assert rec["returned"]["cpus"] == want[local_rank]["cpus"]
    assert rec["again"] == rec["returned"], "a second apply changes nothing"
    assert rec["worker"][1] == threadwise.parse_cpulist(want[local_rank]["worker_cpus"])


def test_apply_reads_the_launchers_rank(tmp_path: Path) -> None:
    want = planned(2, tmp_path)
    script = write(tmp_path, "apply.py", APPLY)
    ok(py(script, str(tmp_path), env=env_for(tmp_path, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", RANK="1", WORLD_SIZE="2")))
    check_child(load(tmp_path, 1), want[1], 2, 4, "local")


def test_apply_under_threadwise_run_keeps_runs_placement(tmp_path: Path) -> None:
    want = planned(2, tmp_path)
    script = write(tmp_path, "apply.py", APPLY)
    tw("run", "-n", "2", "-q", "--no-doctor", "--", sys.executable, str(script), str(tmp_path),
       env=env_for(tmp_path), cwd=tmp_path)
    for i in (0, 1):
        rec = load(tmp_path, i)
        check_child(rec, want[i], 2, 4, "local")
        assert rec["returned"]["cpus"] == want[i]["cpus"]


def test_apply_names_wrong_arguments() -> None:
    with pytest.raises(ValueError, match="give both"):
        threadwise.apply(1)
    with pytest.raises(ValueError, match="local_rank=2, local_world_size=2"):
        threadwise.apply(2, 2)
    with pytest.raises(ValueError, match="whole number"):
        threadwise.apply(-1, 2)


APPLY_THEN_SPAWN = """
    import os, sys
    import threadwise, probe

    def child(i, out):
        probe.record(i, out)

    if __name__ == "__main__":
        out = sys.argv[1]
        threadwise.apply(0, 2)  # this process narrowed to rank 0's CPUs
        threadwise.spawn(child, args=(out,), nprocs=2)
        print("spawned")
"""


def test_spawn_after_apply_plans_from_the_node(tmp_path: Path) -> None:
    # apply() narrowed the parent to one rank's CPUs; spawn's children are
    # still planned from the node's (before: "2 ranks need 2 physical cores
    # but only 1 are allowed" where a rank has one core).
    want = planned(2, tmp_path)
    script = write(tmp_path, "apply_spawn.py", APPLY_THEN_SPAWN)
    out = ok(py(script, str(tmp_path), env=env_for(tmp_path)))
    assert "spawned" in out
    for i in (0, 1):
        assert load(tmp_path, i)["env"]["THREADWISE_CPUS"] == want[i]["cpus"]


# The communication library stand-in (tests/support/comm-standin), loaded
# after apply: its constructor re-pins the caller and starts named threads.
STANDIN = Path(__file__).resolve().parents[2] / "tests/support/comm-standin/comm-standin.c"

HOLD = """
import ctypes, json, os, sys, time
import threadwise

out, lib, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
threadwise.apply(0, 1 if opts else 2, options=opts)
ctypes.CDLL(lib)  # STANDIN_STYLE is in the environment: its constructor runs
time.sleep(float(os.environ["STANDIN_SECONDS"]) + 0.3)
masks = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        name = f.read().strip()
    with open(f"/proc/self/task/{tid}/status") as f:
        mask = [l.split()[1] for l in f if l.startswith("Cpus_allowed_list:")][0]
    masks[tid] = (name, mask, int(tid) == os.getpid())
json.dump(masks, open(out, "w"))
"""


def standin(tmp_path: Path) -> Path:
    so = tmp_path / "comm-standin.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-pthread", "-o", str(so), str(STANDIN)], check=True)
    return so


def test_apply_puts_back_threads_a_library_moves(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no wider mask to leak")
    want = planned(2, tmp_path)
    script = write(tmp_path, "hold.py", HOLD)
    env = env_for(tmp_path, STANDIN_STYLE="2.29", STANDIN_SECONDS="1.5")
    p = py(script, str(tmp_path / "masks.json"), str(standin(tmp_path)), env=env)
    ok(p)
    report = [l for l in p.stderr.splitlines() if l.startswith("standin: ")]
    assert len(report) == 4, p.stderr
    for line in report:
        assert "(back: yes)" in line, p.stderr
        assert float(line.split("outside for ")[1].split()[0]) < 1.0, line
    assert "(comm) was on CPUs" in p.stderr and "put back on" in p.stderr, p.stderr
    masks = json.loads((tmp_path / "masks.json").read_text())
    assert {m for _, m, _ in masks.values()} == {want[0]["cpus"]}, masks


def test_apply_with_roles_places_each_thread_by_its_role(tmp_path: Path) -> None:
    doc = json.loads(tw("plan", "-n", "1", "--roles", "--json", env=env_for(tmp_path), cwd=tmp_path).stdout)
    roles = doc["ranks"][0].get("roles")
    if roles is None:
        pytest.skip("one CPU: no role layout here")
    script = write(tmp_path, "hold.py", HOLD)
    env = env_for(tmp_path, STANDIN_STYLE="2.30", STANDIN_SECONDS="1")
    p = py(script, str(tmp_path / "masks.json"), str(standin(tmp_path)), "--roles", env=env)
    ok(p)
    masks = json.loads((tmp_path / "masks.json").read_text())
    for name, mask, main in masks.values():
        role = "service" if main or name.startswith("NCCL ") else "team"
        assert mask == roles[role], (name, mask, roles, masks)
    assert "outside the rank's" not in p.stderr, p.stderr


# spawn's children hold their threads as apply does; hold=False only says.
SPAWN_HOLD = """
import ctypes, json, os, sys, time
import threadwise

def child(i, out, lib):
    ctypes.CDLL(lib)  # the stand-in's constructor widens the caller's mask
    time.sleep(float(os.environ["STANDIN_SECONDS"]) + 0.3)
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            masks[tid] = [l.split()[1] for l in f if l.startswith("Cpus_allowed_list:")][0]
    json.dump(masks, open(os.path.join(out, f"masks{i}.json"), "w"))

if __name__ == "__main__":
    out, lib, hold = sys.argv[1], sys.argv[2], sys.argv[3] == "on"
    threadwise.spawn(child, args=(out, lib), nprocs=2, hold=hold)
"""


@pytest.mark.parametrize("hold", ["on", "off"])
def test_spawn_holds_its_childrens_threads_unless_told_not_to(tmp_path: Path, hold: str) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no wider mask to leak")
    want = planned(2, tmp_path)
    script = write(tmp_path, "spawn_hold.py", SPAWN_HOLD)
    env = env_for(tmp_path, STANDIN_STYLE="2.29", STANDIN_SECONDS="1.5")
    p = py(script, str(tmp_path), str(standin(tmp_path)), hold, env=env)
    ok(p)
    report = [l for l in p.stderr.splitlines() if l.startswith("standin: ")]
    assert len(report) == 8, p.stderr
    whole = _place._cpulist(frozenset(os.sched_getaffinity(0)))
    for i in (0, 1):
        masks = json.loads((tmp_path / f"masks{i}.json").read_text())
        if hold == "on":
            # Every thread back on its child's CPUs, each one said.
            assert set(masks.values()) == {want[i]["cpus"]}, masks
        else:
            # The stand-in's threads left where the library put them.
            assert whole in set(masks.values()), (whole, masks)
    if hold == "on":
        assert all("(back: yes)" in l for l in report), p.stderr
        assert "put back on" in p.stderr and "left there" not in p.stderr, p.stderr
    else:
        assert all("(back: no)" in l for l in report), p.stderr
        assert "left there (hold off" in p.stderr and "put back on" not in p.stderr, p.stderr

