#!/usr/bin/env python3
"""The GPU check's training: a torchvision ResNet-50 (--tiny: a small CNN,
for the dry mode on CPU) trained on images a DataLoader decodes from JPEGs
this script encodes itself at start (no downloads), with the augmentation
ImageNet training uses (random resized crop, flip, normalise). One rank per
GPU under any launcher (RANK, LOCAL_RANK, WORLD_SIZE; DDP when more than
one). Rank 0 prints, after the warm-up steps and --seconds of training:

    gpu_check: window <t0> <t1>                 (time.time() of the measured span)
    threadwise: throughput=<N> img/s            (all ranks' images over that span)

DataLoader workers: --workers, else THREADWISE_NUM_WORKERS (threadwise's
plan), else 8. Intra-op threads are whatever the environment gives torch.
"""
import argparse
import io
import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def make_jpegs(n, side, seed=0):
    """n JPEGs of side x side: smooth colour fields with noise, quality 90."""
    rng = np.random.default_rng(seed)
    out = []
    ys, xs = np.mgrid[0:side, 0:side].astype(np.float32) / side
    for i in range(n):
        a, b, c = rng.uniform(0, 6, 3)
        img = np.stack(
            [np.sin(a * xs + b * ys + c), np.cos(b * xs - a * ys), np.sin(c * xs * ys + a)],
            axis=-1,
        )
        img = (img * 0.5 + 0.5) * 200 + rng.normal(0, 20, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append((buf.getvalue(), i % 1000))
    return out


class Jpegs(torch.utils.data.Dataset):
    """Decode, random resized crop (scale 0.08-1, ratio 3/4-4/3), flip, normalise."""

    def __init__(self, items, size, length):
        self.items, self.size, self.length = items, size, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        data, label = self.items[i % len(self.items)]
        img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = img.size
        for _ in range(10):
            area = w * h * random.uniform(0.08, 1.0)
            ratio = np.exp(random.uniform(np.log(3 / 4), np.log(4 / 3)))
            cw, ch = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw, ch, x, y = w, h, 0, 0
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        a = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(a.transpose(2, 0, 1).copy()), label


def tiny(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="measured training time")
    ap.add_argument("--warmup-steps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--images", type=int, default=256, help="distinct JPEGs encoded at start")
    ap.add_argument("--side", type=int, default=256, help="the JPEGs' side")
    ap.add_argument("--size", type=int, default=224, help="the crop's side")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--tiny", action="store_true", help="a small CNN instead of ResNet-50")
    a = ap.parse_args()

    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local % max(torch.cuda.device_count(), 1)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    workers = a.workers
    if workers is None:
        workers = int(os.environ.get("THREADWISE_NUM_WORKERS", 8))
    if a.tiny:
        model = tiny(1000)
    else:
        import torchvision

        model = torchvision.models.resnet50(num_classes=1000)
    model = model.to(device, memory_format=torch.channels_last)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    data = Jpegs(make_jpegs(a.images, a.side, seed=rank), a.size, length=10**7)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=a.batch,
        num_workers=workers,
        pin_memory=cuda,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        drop_last=True,
    )
    print(
        f"gpu_check: rank {rank}/{world} device {device} workers {workers} "
        f"torch threads {torch.get_num_threads()} "
        f"cpus {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}",
        flush=True,
    )
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    steps, t0, images = 0, None, 0
    for x, y in loader:
        x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with amp:
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steps == a.warmup_steps:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.time()
        elif t0 is not None:
            images += a.batch
            # Every rank stops at the same step (a rank that stopped alone
            # would leave the others in a collective): rank 0's clock decides,
            # every 5 steps.
            if steps % 5 == 0:
                stop = torch.tensor([int(time.time() - t0 >= a.seconds)], device=device)
                if world > 1:
                    dist.broadcast(stop, 0)
                if stop.item():
                    break
    if cuda:
        torch.cuda.synchronize()
    t1 = time.time()
    images *= world  # every rank trained as many steps
    if rank == 0:
        print(f"gpu_check: window {t0:.3f} {t1:.3f}", flush=True)
        print(f"threadwise: throughput={images / (t1 - t0):.2f} img/s", flush=True)
    if world > 1:
        # Leave together: a rank whose peer already tore the group down
        # aborts in gloo ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
