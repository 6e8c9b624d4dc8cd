#!/usr/bin/env python3
"""Ray Train with threadwise.apply(): two workers, each placed on its own CPUs.

Ray Train starts its workers as Ray actors (no torchrun) and sets their
thread count, but binds no CPU. One call at the top of the train loop gives
each worker its slice of the node's plan (the CPUs of every thread, the
memory policy, torch's intra- and inter-op threads, the thread variables):

    ctx = ray.train.get_context()
    threadwise.apply(ctx.get_local_rank(), ctx.get_local_world_size())

Each worker prints its CPUs and torch's threads before and after, and trains
a few DDP steps of a small model on gloo (Ray Train's torch backend sets up
the process group).
"""
import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import ray.train  # noqa: E402
import torch  # noqa: E402
from ray.train import ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer, prepare_model  # noqa: E402


def cpus():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return "?"


def train_loop_per_worker(config):
    import threadwise

    ctx = ray.train.get_context()
    before = f"cpus {cpus()} torch threads {torch.get_num_threads()}"
    plan = threadwise.apply(ctx.get_local_rank(), ctx.get_local_world_size())
    print(
        f"ray worker local {ctx.get_local_rank()}/{ctx.get_local_world_size()}: before {before}; "
        f"after cpus {cpus()} torch threads {torch.get_num_threads()} "
        f"interop {torch.get_num_interop_threads()} planned {plan['cpus'] if plan else None}",
        flush=True,
    )
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(config["steps"]):
        x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ray.train.report({"loss": float(loss)})


if __name__ == "__main__":
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"steps": 20},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
    )
    result = trainer.fit()
    print(f"ray train done: error {result.error}", flush=True)
