#!/usr/bin/env python3
"""A DDP job (gloo) that fails once: on its first attempt
(TORCHELASTIC_RESTART_COUNT 0) rank 1 exits 5 right after the process group
forms, leaving rank 0 waiting in an all-reduce; on a later attempt every
rank all-reduces and exits 0. For `--max-restarts` under torchrun and under
threadwise run alike (scripts/pytorch-e2e.sh).

    python restart_train.py
"""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank}/{world} restart {count} of {os.environ['TORCHELASTIC_MAX_RESTARTS']}", flush=True)
if count == 0 and rank == 1:
    sys.exit(5)
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank}/{world} restart {count} all-reduce {t.item():.0f}", flush=True)
dist.destroy_process_group()
