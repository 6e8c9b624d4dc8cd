#!/usr/bin/env python3
"""A small PyTorch DDP training run for threadwise's examples and tests.

ResNet-style CNN on synthetic images, gloo on CPU (nccl when CUDA is there),
a DataLoader whose workers do real CPU work per sample (as JPEG decoding and
augmentation would), num_workers from THREADWISE_NUM_WORKERS. Prints the
placement each rank sees, then a torchvision-style line with "img/s: N" from rank 0.

Runs under torchrun, `threadwise run`, or `torchrun --no-python threadwise bind`.
With --helper it adopts the threadwise Python package (pip install threadwise)
the two-line way: num_workers and worker_init_fn from the plan, and each
DataLoader worker prints the CPUs and threads it runs with.
"""
import argparse
import functools
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNetSmall(nn.Module):
    """ResNet-18's layout (2 blocks per stage) at a width the CPU can train."""

    def __init__(self, width=32, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        chans = [width, width * 2, width * 4, width * 8]
        layers, cin = [], width
        for i, c in enumerate(chans):
            for j in range(2):
                layers.append(Block(cin, c, 2 if (j == 0 and i > 0) else 1))
                cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SyntheticImages(Dataset):
    """Images made on the fly with per-sample CPU work, like decode + augment."""

    def __init__(self, n, size, work):
        self.n, self.size, self.work = n, size, work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, self.size * 2, self.size * 2, generator=g)
        for _ in range(self.work):  # "decoding": a few passes of real arithmetic
            img = torch.sqrt(img * img + 0.1)
        img = F.interpolate(img[None], size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        if i % 2:
            img = torch.flip(img, dims=[2])
        return img, i % 10


def placement():
    cpus = "?"
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                cpus = line.split()[1]
    return cpus


def report_worker(local, init, worker_id):
    """A worker_init_fn: the helper's, then one line of what the worker got."""
    init(worker_id)
    line = (
        f"worker {worker_id} of local {local}: cpus {placement()} torch threads {torch.get_num_threads()} "
        f"expected {os.environ.get('THREADWISE_WORKER_CPUS') or os.environ.get('THREADWISE_CPUS')}\n"
    )
    # One write: the workers share the rank's stdout, and print() writes the
    # line and its newline apart, so two workers' lines could interleave.
    os.write(1, line.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--work", type=int, default=4, help="per-sample CPU work in the DataLoader")
    ap.add_argument("--workers", type=int, default=None, help="default: THREADWISE_NUM_WORKERS, else 2")
    ap.add_argument("--helper", action="store_true", help="use the threadwise package's worker_init_fn")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    init_fn = None
    if args.helper:
        import threadwise

        workers = threadwise.num_workers(2) if args.workers is None else args.workers
        init_fn = functools.partial(report_worker, local, threadwise.worker_init_fn)
    else:
        workers = args.workers if args.workers is not None else int(os.environ.get("THREADWISE_NUM_WORKERS", 2))
    print(
        f"rank {rank}/{world} local {local}: cpus {placement()} torch threads {torch.get_num_threads()} "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} workers {workers}",
        flush=True,
    )

    model = ResNetSmall(args.width).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    total = (args.steps + args.warmup) * args.batch * world
    data = SyntheticImages(total, args.image_size, args.work)
    loader = DataLoader(
        data,
        batch_size=args.batch,
        sampler=DistributedSampler(data, shuffle=False),
        num_workers=workers,
        persistent_workers=workers > 0,
        drop_last=True,
        worker_init_fn=init_fn,
    )
    start, seen = None, 0
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            dist.barrier()
            start, seen = time.perf_counter(), 0
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += x.shape[0]
    dist.barrier()
    elapsed = time.perf_counter() - start
    rate = torch.tensor([seen / elapsed])
    dist.all_reduce(rate)
    if rank == 0:
        # The torchvision reference scripts' shape (MetricLogger), numbers of
        # other keys included: tune's default rules must read img/s, not lr.
        print(
            f"Epoch: [0]  [{args.steps}/{args.steps}]  lr: 0.05  img/s: {rate.item():.1f}  "
            f"loss: {loss.item():.4f}  world: {world}",
            flush=True,
        )
    # DDP all-reduces the gradients: every rank of one job ends with the same
    # parameters and gradients (the multi-node check compares these).
    with torch.no_grad():
        psum = sum(float(p.double().sum()) for p in model.parameters())
        gsum = sum(float(p.grad.double().sum()) for p in model.parameters() if p.grad is not None)
    print(f"rank {rank}/{world} checksum params {psum:.10e} grads {gsum:.10e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
