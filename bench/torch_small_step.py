"""Steps per second of a small model's training step under torchrun: sx.torch's
ShardedOptimizer (AdamW, ZeRO stage 2, clipping) against DDP + torch's
ZeroRedundancyOptimizer (AdamW, gloo) with torch's clipping, on the MLP of
samples/python/train_torch_mlp.py, in the same processes, rounds alternating.

    torchrun --standalone --nproc-per-node=2 bench/torch_small_step.py [STEPS] [ROUNDS]

(PYTHONPATH with bindings/python and SX_LIBRARY as for the samples.) Rank 0 prints the
median over rounds of each side's steps per second and their ratio, and one JSON line.
Run it again with SX_SHARED_MEMORY=0 for sx over TCP.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import sx.torch


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randn(32, 16, generator=data) for _ in range(16)]
    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(123))

    sx_model = model()
    sx_opt = sx.torch.ShardedOptimizer(sx_model, torch.optim.AdamW, lr=1e-3, weight_decay=0.01, max_grad_norm=1.0,
                                       num_threads=1)
    ddp_model = DistributedDataParallel(model())
    ddp_opt = ZeroRedundancyOptimizer(ddp_model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                      weight_decay=0.01)

    def sx_steps():
        for s in range(steps):
            x = batches[s % len(batches)]
            sx_opt.zero_grad()
            torch.nn.functional.mse_loss(sx_model(x), torch.tanh(x @ w_true)).backward()
            sx_opt.step()

    def ddp_steps():
        for s in range(steps):
            x = batches[s % len(batches)]
            ddp_opt.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x), torch.tanh(x @ w_true)).backward()
            torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), 1.0)
            ddp_opt.step()

    rates = {"sx": [], "ddp": []}
    for r in range(rounds + 1):
        for name, fn in (("sx", sx_steps), ("ddp", ddp_steps)) if r % 2 == 0 else (("ddp", ddp_steps), ("sx", sx_steps)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slower rank's
            if r > 0:  # round 0 warms up
                rates[name].append(steps / took.item())
    if rank == 0:
        sx_rate, ddp_rate = statistics.median(rates["sx"]), statistics.median(rates["ddp"])
        shm = os.environ.get("SX_SHARED_MEMORY", "1") != "0"
        print(f"small step, {dist.get_world_size()} processes, {steps} steps x {rounds} rounds: sx.torch "
              f"{sx_rate:.0f} steps/s ({'shared memory' if shm else 'TCP'}), DDP + ZeroRedundancyOptimizer "
              f"{ddp_rate:.0f} steps/s: {sx_rate / ddp_rate:.2f}x")
        print(json.dumps({"bench": "torch_small_step", "ranks": dist.get_world_size(), "shared_memory": shm,
                          "sx_steps_per_s": round(sx_rate, 1), "ddp_zero_steps_per_s": round(ddp_rate, 1),
                          "ratio": round(sx_rate / ddp_rate, 3)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
