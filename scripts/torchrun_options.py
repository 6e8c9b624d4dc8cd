#!/usr/bin/env python3
"""Every option of the installed torchrun, read from its own parser, given to
`threadwise run --dry-run` in each spelling (and through PET_<DEST> where
torchrun reads one): each must be accepted and none taken for the script.
Then every abbreviation argparse takes (a prefix no other option string
shares) must be taken too, and every prefix it refuses as ambiguous refused. A
torchrun that grows an option fails here, not in a user's job.

    python scripts/torchrun_options.py THREADWISE
"""
import os
import subprocess
import sys
import tempfile

from torch.distributed.argparse_util import check_env, env
from torch.distributed.run import get_args_parser

tw = sys.argv[1]
SAMPLE = {
    "nnodes": "1", "nproc_per_node": "1", "rdzv_backend": "c10d",
    "rdzv_endpoint": "localhost:29400", "rdzv_id": "x", "rdzv_conf": "join_timeout=60",
    "max_restarts": "1", "monitor_interval": "0.1", "role": "r", "log_dir": "logs",
    "redirects": "3", "tee": "3", "log_line_prefix_template": "${rank}: ",
    "local_ranks_filter": "0", "duplicate_stdout_filters": "a", "duplicate_stderr_filters": "b",
    "node_rank": "0", "master_addr": "127.0.0.1", "master_port": "29511",
    "local_addr": "127.0.0.1", "logs_specs": "default", "signals_to_handle": "SIGTERM",
    "shutdown_timeout": "5", "event_log_handler": "null",
}
d = tempfile.mkdtemp()
script = os.path.join(d, "train.py")
with open(script, "w") as f:
    f.write("#!/bin/sh\necho hi\n")
os.chmod(script, 0o755)


def argv_of(out):
    for line in out.splitlines():
        if line.strip().startswith("argv: "):
            return line.strip()[len("argv: "):]
    return None


def check(args, extra_env, dest, what):
    e = dict(os.environ, **extra_env)
    e.pop("SLURM_JOB_ID", None)
    r = subprocess.run([tw, "run", "--dry-run", *args], cwd=d, env=e, capture_output=True, text=True)
    if dest == "print_completion":
        ok = r.returncode == 0 and "_threadwise" in r.stdout
    else:
        want = {"module": "python -u -m train.py --lr 0.1", "no_python": f"{script} --lr 0.1"}.get(
            dest, "python -u train.py --lr 0.1")
        ok = r.returncode == 0 and argv_of(r.stdout) == want
    if not ok:
        sys.exit(f"FAIL torchrun's {what}: exit {r.returncode}, argv {argv_of(r.stdout)!r}\n{r.stderr}")


n = pets = 0
for a in get_args_parser()._actions:
    if not a.option_strings or a.dest == "help":
        continue
    n += 1
    switch = a.nargs == 0
    value = [] if switch else [a.choices[0] if a.choices else SAMPLE.get(a.dest, "1")]
    target = script if a.dest == "no_python" else "train.py"
    for flag in a.option_strings:
        check([flag, *value, target, "--lr", "0.1"], {}, a.dest, flag)
    if isinstance(a, (env, check_env)):
        pets += 1
        var = "PET_" + a.dest.upper()
        check([target, "--lr", "0.1"], {var: "1" if switch else value[0]}, a.dest, var)
print(f"{'torchrun options (its own parser)':<44} {n} options in every spelling, {pets} PET_ variables: all accepted, none taken for the script")


# torchrun's abbreviations: argparse takes a prefix of exactly one option string.
strings = [s for a in get_args_parser()._actions for s in a.option_strings if s.startswith("--")]
taken = refused = 0
for a in get_args_parser()._actions:
    if not a.option_strings or a.dest in ("help", "print_completion"):
        continue
    switch = a.nargs == 0
    value = [] if switch else [a.choices[0] if a.choices else SAMPLE.get(a.dest, "1")]
    target = script if a.dest == "no_python" else "train.py"
    for flag in (f for f in a.option_strings if f.startswith("--")):
        for k in range(3, len(flag)):
            pre = flag[:k]
            if pre in strings:
                continue
            hits = [s for s in strings if s.startswith(pre)]
            if len(hits) == 1:
                taken += 1
                check([pre, *value, target, "--lr", "0.1"], {}, a.dest, f"abbreviation {pre}")
            else:
                refused += 1
                e = dict(os.environ)
                e.pop("SLURM_JOB_ID", None)
                r = subprocess.run([tw, "run", "--dry-run", pre, *value, target], cwd=d, env=e,
                                   capture_output=True, text=True)
                if r.returncode != 2 or "ambiguous option" not in r.stderr:
                    sys.exit(f"FAIL torchrun refuses {pre} (could be {hits}); threadwise: exit "
                             f"{r.returncode}\n{r.stderr}")
print(f"{'torchrun abbreviations':<44} {taken} taken as torchrun takes them, {refused} ambiguous ones refused")
