"""Uneven inputs under a real torchrun of 3 processes (run by run_torch_tests.py): ranks
hold 3, 2 and 0 batches. At each step a rank with a batch backpropagates the sum of its
samples' losses and passes its sample count as the step's weight; a rank without one
passes 0 and only shadows the collectives. The params must follow one torch process
that, at each step, takes the mean loss over the union of the batches the ranks had
(1e-5 relative)."""
import torch
import torch.distributed as dist

import sx.torch

BATCHES = {0: 3, 1: 2, 2: 0}
SIZES = {0: 4, 1: 7, 2: 5}  # samples per batch differ too


def mlp():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch(step, rank):
    g = torch.Generator().manual_seed(77 * step + rank)
    return torch.randn(SIZES[rank], 5, generator=g), torch.randn(SIZES[rank], 2, generator=g)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 3, "run with --nproc-per-node=3"
    model, reference = mlp(), mlp()
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=0.05)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.05)
    for step in range(max(BATCHES.values())):
        opt.zero_grad()
        if step < BATCHES[rank]:
            x, y = batch(step, rank)
            torch.nn.functional.mse_loss(model(x), y, reduction="sum").backward()
            opt.step(weight=y.numel())  # the reference's mean is over every output of every sample
        else:
            opt.step(weight=0)
        have = [r for r in range(world) if step < BATCHES[r]]
        xs, ys = zip(*(batch(step, r) for r in have))
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if not torch.allclose(p.detach(), q.detach(), rtol=1e-5, atol=1e-7):
                raise AssertionError(f"rank {rank}, step {step}: {name} differs from the single process")
    print(f"rank {rank}: uneven inputs match one process over the union", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
