#!/usr/bin/env python3
"""An elastic PyTorch DDP job (gloo) for threadwise's and torchrun's
--nnodes MIN:MAX: it checkpoints every few steps and resumes from the
checkpoint whatever the world size, so the nodes may come and go.

    python elastic_train.py DIR STEPS

DIR is shared by every node (checkpoint, step log, starts log). Every rank
appends its start (time, world, rank, restart count) to DIR/starts.log.
Rank 0 logs each step's loss to DIR/steps.log; on resume it first drops the
lines of steps after the checkpoint (they are redone), so in the end every
step's loss is there exactly once. Each step is one all-reduce of the
gradients (the loss is the mean over the world), slowed to ~0.2 s.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

d, steps = sys.argv[1], int(sys.argv[2])
every = 5
ckpt, log = os.path.join(d, "ckpt.pt"), os.path.join(d, "steps.log")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(d, "starts.log"), "a") as f:
    f.write(f"{time.time():.3f} world {world} rank {rank} restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}\n")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
if rank == 0 and os.path.exists(log):
    def before(line):
        w = line.split()
        return line.endswith("\n") and len(w) == 6 and int(w[1]) < start

    kept = [l for l in open(log) if before(l)]
    with open(log + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(log + ".tmp", log)
ddp = DDP(model)
for step in range(start, steps):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(64, 32, generator=g)
    y = x[:, :1] * 2 + 1
    loss = nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    time.sleep(0.2)
    if rank == 0:
        with open(log, "a") as f:
            f.write(f"step {step} world {world} loss {mean.item():.5f}\n")
        if (step + 1) % every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(f"elastic: trained {steps} steps, final world {world}")
