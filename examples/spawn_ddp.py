#!/usr/bin/env python3
"""The guides' mp.spawn DDP example, made to run on CPU, with one line to switch.

The guide (shared/seeds, "多进程并行训练"): `train(rank, world_size)` calls
`dist.init_process_group(..., init_method='env://', world_size=world_size,
rank=rank)`, wraps the model in DDP, and `__main__` does
`mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)`. Here the
backend is gloo (no GPU), the model and data are ddp_train.py's (a ResNet-18
layout; DataLoader workers doing per-sample CPU work as JPEG decoding would),
and MASTER_ADDR/MASTER_PORT get defaults as PyTorch's own DDP tutorial sets
them. The one line that changes:

    import torch.multiprocessing as mp        # plain
    import threadwise as mp                   # each child born placed

(`--threadwise` picks the second, so one file runs both.) Rank 0 prints
"img/s: N"; every rank prints its CPUs, torch's threads and inter-op threads.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_train import ResNetSmall, SyntheticImages, placement  # noqa: E402


def train(rank, world_size, steps, warmup, batch, workers):
    dist.init_process_group(backend="gloo", init_method="env://", world_size=world_size, rank=rank)
    print(
        f"rank {rank}/{world_size}: cpus {placement()} torch threads {torch.get_num_threads()} "
        f"interop {torch.get_num_interop_threads()} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        flush=True,
    )
    model = ResNetSmall(32)
    model = DDP(model)  # the guide: DDP(model, device_ids=[rank]) on a GPU
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = SyntheticImages((steps + warmup) * batch * world_size, 64, 4)
    loader = DataLoader(
        data,
        batch_size=batch,
        sampler=DistributedSampler(data, shuffle=False),
        num_workers=workers,
        persistent_workers=workers > 0,
        drop_last=True,
    )
    start, seen = None, 0
    for step, (x, y) in enumerate(loader):
        if step == warmup:
            dist.barrier()
            start, seen = time.perf_counter(), 0
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += x.shape[0]
    dist.barrier()
    rate = torch.tensor([seen / (time.perf_counter() - start)])
    dist.all_reduce(rate)
    if rank == 0:
        print(f"img/s: {rate.item():.1f}  world: {world_size}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threadwise", action="store_true", help="import threadwise as mp")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.threadwise:
        import threadwise as mp
    else:
        import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    world_size = args.world_size
    mp.spawn(
        train,
        args=(world_size, args.steps, args.warmup, args.batch, args.workers),
        nprocs=world_size,
        join=True,
    )
