"""sx for PyTorch users: a small torch model trained by sx.torch.ShardedOptimizer on the
processes torchrun starts (docs/torch.md walks through it).

    torchrun --standalone --nproc-per-node=2 samples/python/train_torch_mlp.py [--stage N] [STEPS] [CKPT_DIR] [RESUME_FROM]

Each process keeps the whole model and its own batches; sx averages the gradients over
the processes, clips them, updates this process's shard of the AdamW state (ZeRO stage 2)
and gathers the params. The model is not wrapped: only the optimizer changes. With
CKPT_DIR, the run saves an sx checkpoint there at the end (loadable into any number of
processes), the model's buffers (its BatchNorm's running statistics, which are the
model's, not the optimizer's) in the checkpoint's user blob, and writes the consolidated
optimizer state in torch's format beside it. With RESUME_FROM (such a checkpoint, saved
by any number of processes), the run starts from its params, optimizer state and buffers.
Every process starts from rank 0's model (sx.torch broadcasts it). With --stage 3 the
params are sharded too (gathered around each layer's forward and backward), and the run
prints the most param bytes a process held at once against the model's.
"""
import os
import pickle
import sys

import torch

import sx
import sx.torch


def main():
    args = sys.argv[1:]
    stage = 2
    if args[:1] == ["--stage"]:
        stage, args = int(args[1]), args[2:]
    steps = int(args[0]) if len(args) > 0 else 50
    ckpt = args[1] if len(args) > 1 and args[1] else None
    resume = args[2] if len(args) > 2 else None
    torch.manual_seed(0)  # reproducible runs (sx.torch gives every process rank 0's model anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1))
    # At stage 3 each layer a unit of its own (bucket_mb: about 4 KiB).
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0,
                                    stage=stage, bucket_mb=4.5 / 1024 if stage == 3 else 25.0)
    buffer_names = [name for name, _ in model.named_buffers()]
    if resume:
        opt.load(resume)  # params and optimizer state, resharded to this many processes
        model.load_state_dict(pickle.loads(sx.read_user_blob(resume)), strict=False)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    rank, world = opt.group.rank, opt.group.world_size
    teacher = torch.Generator().manual_seed(123)
    w_true = torch.randn(16, 1, generator=teacher)
    data = torch.Generator().manual_seed(1000 + rank)  # each process its own batches
    losses = []
    for step in range(steps):
        x = torch.randn(32, 16, generator=data)
        y = torch.tanh(x @ w_true)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    # Mean losses of the first and the last few steps (one batch's loss is noisy).
    k = max(1, min(5, steps // 4))
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    print(f"rank {rank} of {world}: loss {first:.4f} -> {last:.4f} after {steps} steps "
          f"(grad norm {opt.grad_norm:.4f}, lr {sched.get_last_lr()[0]:.2e})", flush=True)
    if stage == 3:
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"rank {rank}: param bytes held at once: {opt.group.memory_stats().peak_param_bytes} by sx (its "
              f"shards and the units gathered), {opt.peak_param_bytes} in the layers; the model has {model_bytes}",
              flush=True)
    if ckpt:
        os.makedirs(ckpt, exist_ok=True)
        with opt.full_params():  # stage 3: the buffers only, but state_dict() reads the params too
            buffers = {k: v.clone() for k, v in model.state_dict().items() if k in buffer_names}
        opt.save(os.path.join(ckpt, f"step-{steps}"), pickle.dumps(buffers), synchronous=True).wait()
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save(opt.state_dict(), os.path.join(ckpt, f"optimizer-step-{steps}.pt"))
    if not last < first:
        sys.exit("the loss did not fall")


if __name__ == "__main__":
    main()
