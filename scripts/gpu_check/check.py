#!/usr/bin/env python3
"""The GPU check (scripts/gpu-check.sh runs it): what threadwise sees on this
machine, then the seeds' comparison on real hardware. Six configurations of
one training job (train.py beside this file), in rounds, each round in a
shuffled order:

  unset           N plain processes (RANK, WORLD_SIZE...; no thread variable)
  torchrun        python -m torch.distributed.run --standalone --nproc-per-node N
  torchrun-numa   the same with --numa-binding node (where torchrun has it)
  threadwise      threadwise run -n N
  roles           threadwise run -n N --roles (main, pin-memory and NCCL's
                  threads on a core of their own, the team on the rest)
  tuned           threadwise run --plan, the plan threadwise tune chose here

Per run: images/s (train.py's own line), GPU utilisation (NVML, sampled
every 0.25 s inside train.py's measured window), CPU utilisation of the
whole machine (/proc/stat, the same window). Intervals: throughput from one
model of the table (log images/s = round + configuration + noise, as tune's),
GPU and CPU % as mean +- t sd/sqrt(n). Every step that the machine refuses
(affinity, memory policy, cgroups, NVML) is a line in the report, not an abort.

Writes OUT/report.md, OUT/report.json, OUT/tune.json, OUT/topo.txt,
OUT/doctor.txt, OUT/plan.txt, OUT/logs.txt.
"""
import argparse
import ctypes
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Every command's environment: the chosen Python first on PATH (doctor and
# tune look for python3 there).
ENV = dict(os.environ)
SCHEMA = "threadwise.gpu-check/1"


# ---- statistics -------------------------------------------------------------
def t_central(t, df):
    """P(|T| < t), Student's t with whole df (Abramowitz & Stegun 26.7.3/4)."""
    th = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(th), math.cos(th) ** 2
    if df % 2 == 1:
        total, term, k = (1.0 if df > 1 else 0.0), 1.0, 2
        while k < df - 1:
            term *= c2 * k / (k + 1)
            total += term
            k += 2
        return 2 / math.pi * (th + s * math.cos(th) * total)
    total, term, k = 1.0, 1.0, 1
    while k < df - 1:
        term *= c2 * k / (k + 1)
        total += term
        k += 2
    return s * total


def t_quantile(p, df):
    if df <= 0:
        return math.inf
    lo, hi = 0.0, 1.0
    while t_central(hi, df) < 2 * p - 1:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_central(mid, df) < 2 * p - 1 else (lo, mid)
    return (lo + hi) / 2


def mean_interval(v, level=0.95, log=False, bounds=(-math.inf, math.inf)):
    """Mean +- t sd/sqrt(n) (log: of the logs, so a rate's interval stays
    positive; the mean is then geometric), clipped to `bounds`."""
    v = [x for x in v if x is not None and (x > 0 or not log)]
    if not v:
        return None
    f, g = (math.log, math.exp) if log else ((lambda x: x), (lambda x: x))
    w = [f(x) for x in v]
    m = sum(w) / len(w)
    if len(w) < 2:
        return {"mean": g(m), "low": None, "high": None, "n": len(w)}
    sd = math.sqrt(sum((x - m) ** 2 for x in w) / (len(w) - 1))
    h = t_quantile(1 - (1 - level) / 2, len(w) - 1) * sd / math.sqrt(len(w))
    lo, hi = bounds
    return {"mean": g(m), "low": max(lo, g(m - h)), "high": min(hi, g(m + h)), "n": len(w)}


def solve_inverse(m):
    """The inverse of a small square matrix (Gauss-Jordan, partial pivoting);
    None when singular."""
    n = len(m)
    a = [row[:] + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(m)]
    scale = max((abs(x) for row in m for x in row), default=1.0) or 1.0
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-10 * scale:
            return None
        a[c], a[p] = a[p], a[c]
        d = a[c][c]
        a[c] = [x / d for x in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0.0:
                f = a[r][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [row[n:] for row in a]


def block_model(cells, names, reference, level=0.95):
    """cells: {(round, name): images/s}. Least squares of log images/s =
    round + configuration + noise (tune's model, unweighted); each
    configuration against `reference`: exp(estimate) with its interval.
    Returns ({name: {speedup, low, high}}, {df, noise}) ({} and None where
    nothing can be compared). Pure Python: no numpy needed."""
    rounds = sorted({r for r, _ in cells})
    present = [n for n in names if any(k[1] == n for k in cells)]
    if reference not in present or len(present) < 2:
        return {}, None
    others = [n for n in present if n != reference]
    rows, y = [], []
    for (r, n), v in sorted(cells.items()):
        rows.append([1.0 if r == rr else 0.0 for rr in rounds] + [1.0 if n == o else 0.0 for o in others])
        y.append(math.log(v))
    k = len(rows[0])
    xtx = [[sum(row[i] * row[j] for row in rows) for j in range(k)] for i in range(k)]
    inv = solve_inverse(xtx)
    if inv is None:
        return {}, None
    xty = [sum(row[i] * yy for row, yy in zip(rows, y)) for i in range(k)]
    beta = [sum(inv[i][j] * xty[j] for j in range(k)) for i in range(k)]
    df = len(y) - k
    ss = sum((yy - sum(b * x for b, x in zip(beta, row))) ** 2 for row, yy in zip(rows, y))
    sigma = math.sqrt(ss / df) if df > 0 else math.inf
    t = t_quantile(1 - (1 - level) / 2, df) if df > 0 else math.inf
    out = {reference: {"speedup": 1.0, "low": None, "high": None}}
    for i, n in enumerate(others):
        j = len(rounds) + i
        se = sigma * math.sqrt(max(inv[j][j], 0.0))
        ok = math.isfinite(se) and math.isfinite(t)
        out[n] = {
            "speedup": math.exp(beta[j]),
            "low": math.exp(beta[j] - t * se) if ok else None,
            "high": math.exp(beta[j] + t * se) if ok else None,
        }
    return out, {"df": df, "noise": (math.exp(sigma) - 1) if math.isfinite(sigma) else None}


# ---- what the machine allows ----------------------------------------------
def probe_kernel():
    """What the kernel (or a sandbox's) allows: one line each, never fatal."""
    lines = []
    try:
        cur = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cur)
        lines.append(("sched_setaffinity", True, f"allowed ({len(cur)} CPUs in this process's mask)"))
    except Exception as e:  # noqa: BLE001 - any refusal is the finding
        lines.append(("sched_setaffinity", False, f"refused: {e}"))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": 238, "aarch64": 237}.get(os.uname().machine)
        if nr is None:
            lines.append(("set_mempolicy", False, f"not probed on {os.uname().machine}"))
        else:
            rc = libc.syscall(nr, 0, None, 0)  # MPOL_DEFAULT: changes nothing
            err = ctypes.get_errno()
            lines.append(("set_mempolicy", rc == 0, "allowed" if rc == 0 else f"refused: {os.strerror(err)}"))
    except Exception as e:  # noqa: BLE001
        lines.append(("set_mempolicy", False, f"could not probe: {e}"))
    nodes = [d for d in os.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", d)] if os.path.isdir("/sys/devices/system/node") else []
    lines.append(("NUMA in /sys", bool(nodes), f"{len(nodes)} node(s)" if nodes else "/sys/devices/system/node missing"))
    pci = "/sys/bus/pci/devices"
    n = len(os.listdir(pci)) if os.path.isdir(pci) else 0
    lines.append(("PCI devices in /sys", n > 0, f"{n} device(s)" if n else f"{pci} missing or empty"))
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        ctl = open("/sys/fs/cgroup/cgroup.controllers").read().split()
        lines.append(("cgroups", True, "v2: " + " ".join(ctl)))
    elif os.path.isdir("/sys/fs/cgroup"):
        lines.append(("cgroups", True, "v1 or hybrid: " + " ".join(sorted(os.listdir("/sys/fs/cgroup"))[:8])))
    else:
        lines.append(("cgroups", False, "/sys/fs/cgroup missing"))
    try:
        with open("/proc/stat") as f:
            ok = f.readline().startswith("cpu ")
        lines.append(("/proc/stat", ok, "readable" if ok else "no cpu line"))
    except OSError as e:
        lines.append(("/proc/stat", False, str(e)))
    lines.append(("kernel", True, " ".join(os.uname()[2:4])))
    return [{"what": w, "ok": ok, "detail": d} for w, ok, d in lines]


class Nvml:
    """The NVML calls the sampler needs, through ctypes (threadwise's stand-in
    where THREADWISE_NVML_LIBRARY names it). `error` says why not."""

    def __init__(self):
        self.lib, self.handles, self.error, self.names = None, [], None, []
        path = os.environ.get("THREADWISE_NVML_LIBRARY", "libnvidia-ml.so.1")
        try:
            lib = ctypes.CDLL(path)
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            n = ctypes.c_uint()
            lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
            for i in range(n.value):
                h = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0:
                    self.handles.append(h)
                    name = ctypes.create_string_buffer(96)
                    lib.nvmlDeviceGetName(h, name, 96)
                    self.names.append(name.value.decode(errors="replace"))
            self.lib = lib
        except OSError as e:
            self.error = f"{path}: {e}"

    def utilization(self):
        """Mean GPU % over the devices, or None."""

        class U(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        if not self.lib or not self.handles:
            return None
        v = []
        for h in self.handles:
            u = U()
            if self.lib.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0:
                v.append(u.gpu)
        return sum(v) / len(v) if v else None


def cpu_times():
    try:
        with open("/proc/stat") as f:
            x = [int(v) for v in f.readline().split()[1:]]
        idle = x[3] + (x[4] if len(x) > 4 else 0)
        return sum(x[:8]) - idle, sum(x[:8])
    except (OSError, ValueError, IndexError):
        return None


class Sampler(threading.Thread):
    """(time, GPU %, CPU busy, CPU total) every 0.25 s until stopped."""

    def __init__(self, nvml):
        super().__init__(daemon=True)
        self.nvml, self.samples, self.stop = nvml, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            c = cpu_times()
            self.samples.append((time.time(), self.nvml.utilization(), *(c or (None, None))))
            self.stop.wait(0.25)

    def within(self, t0, t1):
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        gpu = [x[1] for x in s if x[1] is not None]
        cpu = None
        c = [x for x in s if x[2] is not None]
        if len(c) >= 2 and c[-1][3] > c[0][3]:
            cpu = 100.0 * (c[-1][2] - c[0][2]) / (c[-1][3] - c[0][3])
        return (sum(gpu) / len(gpu) if gpu else None), cpu


# ---- running ------------------------------------------------------------------
def run(cmd, timeout, env=None):
    env = env or ENV
    t = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env, text=True, errors="replace")
        return p.returncode, p.stdout, time.time() - t
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout} s)", time.time() - t
    except OSError as e:
        return 127, str(e), time.time() - t


def plain_ranks(n, cmd, timeout):
    """`unset`: n processes started as mp.spawn would, no thread variable."""
    env = {k: v for k, v in ENV.items() if not k.startswith("THREADWISE_") or k.startswith("THREADWISE_NVML")}
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(k, None)
    port = str(29500 + random.randrange(400))
    procs, outs = [], []
    t = time.time()
    for i in range(n):
        e = dict(env, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e, text=True, errors="replace"))
    rc = 0
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, timeout - (time.time() - t)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            rc = 124
        outs.append(out)
        rc = rc or p.returncode
    return rc, "\n".join(outs), time.time() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dry", action="store_true", help="CPU, a tiny model, short runs")
    ap.add_argument("--tw", default="threadwise")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per run")
    ap.add_argument("--tune-args", default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--budget", type=float, default=420, help="no round starts after this many seconds")
    a = ap.parse_args()
    ENV["PATH"] = os.path.dirname(os.path.abspath(a.python)) + os.pathsep + ENV.get("PATH", "")
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="gpu-check.")
    started = time.time()
    rounds = a.rounds or (2 if a.dry else 3)
    seconds = a.seconds or (2.0 if a.dry else 8.0)
    seed = a.seed if a.seed is not None else int(started)
    train = [a.python, os.path.join(HERE, "train.py"), "--seconds", str(seconds)]
    if a.dry:
        train += ["--tiny", "--size", "64", "--side", "80", "--batch", "16", "--images", "64", "--warmup-steps", "3"]
    tune_args = (a.tune_args or ("--runs 1 --max-runs 1 --grid workers=0,1" if a.dry else "--runs 1 --max-runs 1 --grid workers=auto,8")).split()
    notes, logs = [], []
    report = {"schema": SCHEMA, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dry": a.dry, "seed": seed, "rounds": rounds, "seconds": seconds, "command": train[1:]}

    # What threadwise sees.
    facts = {}
    for name, cmd in [
        ("topo", [a.tw, "topo"]),
        ("doctor", [a.tw, "doctor"]),
        ("plan", [a.tw, "plan", "-n", "gpu"]),
    ]:
        rc, out, _ = run(cmd, 120)
        facts[name] = {"rc": rc, "command": " ".join(cmd[1:])}
        with open(os.path.join(a.out, f"{name}.txt"), "w") as f:
            f.write(f"$ threadwise {' '.join(cmd[1:])}   (exit {rc})\n{out}")
        if rc != 0:
            notes.append(f"`threadwise {' '.join(cmd[1:])}` exited {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}")
    rc, out, _ = run([a.tw, "plan", "-n", "gpu", "--json"], 60)
    nproc = None
    if rc == 0:
        try:
            plan = json.loads(out)
            facts["plan_json"] = {"ranks": [{k: r.get(k) for k in ("local_rank", "cpus", "mem_nodes", "gpu", "threads", "workers")} for r in plan.get("ranks", [])]}
            nproc = len(plan.get("ranks", [])) or None
        except ValueError as e:
            notes.append(f"plan -n gpu --json: not JSON ({e})")
    nvml = Nvml()
    facts["nvml"] = {"gpus": nvml.names, "error": nvml.error}
    if nvml.error:
        notes.append(f"NVML did not load ({nvml.error}): no GPU utilisation")
    if nproc is None:
        nproc = max(len(nvml.names), 1)
        notes.append(f"threadwise planned no GPU ranks here; {nproc} rank(s), one per NVML device (or one)")
    report["facts"] = facts
    topo = open(os.path.join(a.out, "topo.txt")).read().splitlines()
    report["topo_gpus"] = [l.rstrip() for l in topo if re.match(r"\s*(gpu |gpus:|  /proc/driver|  device nodes|  NVML|  CUDA_|  NVIDIA_|  SLURM_)", l)][:24]
    doctor = open(os.path.join(a.out, "doctor.txt")).read().splitlines()
    report["doctor_findings"] = [l.rstrip() for l in doctor if re.match(r"\s+(warn|fail) ", l) or re.search(r"\d+ fail, \d+ warn", l)]
    report["kernel"] = probe_kernel()
    report["nproc"] = nproc

    # Where the kernel refuses the binding (a sandbox without affinity or
    # memory policy), threadwise stops with a hint; the check runs its
    # configurations unbound then, and says so.
    unbound = []
    rc, out, _ = run([a.tw, "run", "-n", str(nproc), "-q", "--", "true"], 60)
    if rc != 0 and "--allow-unbound" in out:
        unbound = ["--allow-unbound"]
        why = next((l for l in out.splitlines() if l.startswith("error:")), out.strip()[-200:])
        notes.append(f"the kernel refused threadwise's binding ({why[len('error: '):] if why.startswith('error: ') else why}): "
                     "threadwise and tuned ran with --allow-unbound; tune's placed rows could not run")
    elif rc != 0:
        notes.append(f"`threadwise run -n {nproc} -- true` exited {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}")
    report["unbound"] = bool(unbound)

    # The configurations.
    torchrun = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    rc, helptext, _ = run(torchrun[:3] + ["--help"], 60)
    configs = {
        "unset": ("plain", None),
        "torchrun": ("cmd", torchrun + train[1:]),
        "torchrun-numa": ("cmd", torchrun + ["--numa-binding", "node"] + train[1:]) if "--numa-binding" in helptext else None,
        "threadwise": ("cmd", [a.tw, "run", "-n", str(nproc), "-q", *unbound, "--"] + train),
        "roles": ("cmd", [a.tw, "run", "-n", str(nproc), "-q", "--roles", *unbound, "--"] + train),
        "tuned": None,
    }
    if configs["torchrun-numa"] is None:
        notes.append("torchrun here has no --numa-binding: torchrun-numa not run")
    # threadwise tune's winner.
    plan_file = os.path.join(scratch, "tuned-plan.json")
    t = time.time()
    rc, out, took = run([a.tw, "tune", "-n", str(nproc), *tune_args, "--seed", str(seed), "--save-plan", plan_file, "--export-json", os.path.join(a.out, "tune.json"), "--"] + train, max(60, a.budget))
    report["tune"] = {"args": tune_args, "rc": rc, "seconds": round(took, 1)}
    if rc == 0 and os.path.exists(plan_file):
        configs["tuned"] = ("cmd", [a.tw, "run", "-n", str(nproc), "-q", *unbound, "--plan", plan_file, "--"] + train)
        try:
            report["tune"]["winner"] = json.load(open(os.path.join(a.out, "tune.json"))).get("winner")
        except (OSError, ValueError):
            pass
    else:
        notes.append(f"threadwise tune exited {rc}: tuned not run")
        logs.append(("tune", out))

    # Rounds, each in a shuffled order.
    names = [n for n, c in configs.items() if c is not None]
    rng = random.Random(seed)
    sampler = Sampler(nvml)
    sampler.start()
    trials = []
    per_run_limit = seconds + (90 if a.dry else 240)
    for r in range(rounds):
        if r > 0 and time.time() - started > a.budget:
            notes.append(f"stopped after {r} round(s): the budget of {a.budget:.0f} s is spent (--budget)")
            break
        order = names[:]
        rng.shuffle(order)
        for n in order:
            kind, cmd = configs[n]
            if kind == "plain":
                rc, out, wall = plain_ranks(nproc, train, per_run_limit)
            else:
                rc, out, wall = run(cmd, per_run_limit)
            m = re.findall(r"threadwise: throughput=([0-9.]+) img/s", out)
            w = re.findall(r"gpu_check: window ([0-9.]+) ([0-9.]+)", out)
            thr = float(m[-1]) if rc == 0 and m else None
            gpu = cpu = None
            if w:
                gpu, cpu = sampler.within(float(w[-1][0]), float(w[-1][1]))
            line = re.findall(r"threadwise: throughput=[0-9.]+ img/s", out)
            trials.append({"round": r, "config": n, "rc": rc, "wall_s": round(wall, 2), "images_per_s": thr,
                           "line": line[-1] if line else None, "gpu_util_pct": gpu, "cpu_util_pct": cpu})
            if thr is None:
                logs.append((f"{n} round {r} (exit {rc})", out))
            print(f"gpu-check: round {r} {n}: {thr if thr is not None else 'failed'} img/s, GPU {gpu}, CPU {cpu}", file=sys.stderr, flush=True)
        # A report after every round: a run cut short still leaves one.
        write(a.out, report, names, trials, notes, logs, nvml, started)
    sampler.stop.set()
    shutil.rmtree(scratch, ignore_errors=True)
    for n in names:
        mine = [t for t in trials if t["config"] == n]
        if mine and all(t["images_per_s"] is None for t in mine):
            last = [out for what, out in logs if what.startswith(f"{n} round")]
            why = last[-1].strip().splitlines()[-1] if last and last[-1].strip() else "no output"
            notes.append(f"{n}: every run failed: {why} (logs.txt)")

    write(a.out, report, names, trials, notes, logs, nvml, started)
    print(open(os.path.join(a.out, "report.md")).read())
    return 0 if any(t["images_per_s"] for t in trials) else 1


def write(out, report, names, trials, notes, logs, nvml, started):
    """The figures and the report files, from the trials so far."""
    cells = {(t["round"], t["config"]): t["images_per_s"] for t in trials if t["images_per_s"]}
    model, fit = block_model(cells, names, "unset")
    rows = []
    for n in names:
        mine = [t for t in trials if t["config"] == n]
        thr = [t["images_per_s"] for t in mine if t["images_per_s"]]
        rows.append({
            "config": n,
            "runs": len(mine),
            "failed": sum(1 for t in mine if t["images_per_s"] is None),
            "images_per_s": mean_interval(thr, log=True),
            "vs_unset": model.get(n),
            "gpu_util_pct": mean_interval([t["gpu_util_pct"] for t in mine if t["images_per_s"]], bounds=(0, 100)),
            "cpu_util_pct": mean_interval([t["cpu_util_pct"] for t in mine if t["images_per_s"]], bounds=(0, 100)),
        })
    report.update({"configs": rows, "trials": trials, "model": fit, "notes": notes, "seconds_total": round(time.time() - started, 1)})
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "logs.txt"), "w") as f:
        for what, text in logs:
            f.write(f"== {what}\n" + "\n".join(text.strip().splitlines()[-30:]) + "\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report, nvml))


def fmt(iv, unit="", digits=0):
    if not iv:
        return "n/a"
    s = f"{iv['mean']:.{digits}f}{unit}"
    if iv.get("low") is not None:
        s += f" [{iv['low']:.{digits}f}-{iv['high']:.{digits}f}]"
    return s


def markdown(r, nvml):
    host = os.uname()
    out = [
        f"# threadwise GPU check{' (dry run: CPU, NVML stand-in, tiny model)' if r['dry'] else ''}",
        "",
        f"{r['date']}, {host.nodename}, {host.machine}, kernel {host.release}, {os.cpu_count()} CPUs; "
        f"GPUs (NVML): {', '.join(nvml.names) or 'none'}; {r['nproc']} rank(s); "
        f"{r['rounds']} round(s) of {r['seconds']:.0f} s measured per run, orders shuffled from seed {r['seed']}; "
        f"{r['seconds_total']:.0f} s in all. Reproduce: `scripts/gpu-check.sh{' --dry' if r['dry'] else ''} OUT`.",
        "",
        "| configuration | images/s geometric mean [95%] | vs unset [95%, block model] | GPU % [95%] | CPU % [95%] | runs (failed) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in r["configs"]:
        v = c["vs_unset"]
        vs = "n/a" if not v else (f"{v['speedup']:.2f}x" + (f" [{v['low']:.2f}-{v['high']:.2f}]" if v.get("low") else ""))
        out.append(f"| {c['config']} | {fmt(c['images_per_s'], digits=1)} | {vs} | {fmt(c['gpu_util_pct'])} | {fmt(c['cpu_util_pct'])} | {c['runs']} ({c['failed']}) |")
    m = r.get("model")
    out += ["", f"Throughput intervals against `unset` come from log images/s = round + configuration + noise "
            f"({m['df']} degrees of freedom, noise {m['noise'] * 100:.1f}% per run)." if m and m.get("noise") is not None else "",
            "", f"tune: `threadwise tune {' '.join(r['tune']['args'])}` exited {r['tune']['rc']} in {r['tune']['seconds']} s; winner: {r['tune'].get('winner', 'none')}.", "",
            "## What the machine allows", "", "| check | ok | detail |", "|---|---|---|"]
    for k in r["kernel"]:
        out.append(f"| {k['what']} | {'yes' if k['ok'] else 'NO'} | {k['detail']} |")
    out += ["", "## What threadwise sees", ""]
    for name, f in r["facts"].items():
        if "rc" in f:
            out.append(f"- `threadwise {f['command']}`: exit {f['rc']} ({name}.txt)")
    out += ["", "GPUs (`threadwise topo`):", "", "```"] + r.get("topo_gpus", []) + ["```"]
    ranks = r["facts"].get("plan_json", {}).get("ranks", [])
    if ranks:
        out += ["", "The plan (`threadwise plan -n gpu`):", "", "| rank | CPUs | memory nodes | GPU | threads | workers |", "|---:|---|---|---|---:|---:|"]
        for k in ranks:
            out.append(f"| {k['local_rank']} | {k['cpus']} | {k['mem_nodes']} | {k['gpu']} | {k['threads']} | {k['workers']} |")
    if r.get("doctor_findings"):
        out += ["", "`threadwise doctor` (warn and fail):", "", "```"] + r["doctor_findings"] + ["```"]
    if r["notes"]:
        out += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
