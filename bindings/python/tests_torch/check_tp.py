"""sx.torch inside a tensor-parallel trainer, under a real torchrun of 4 processes (run by
run_torch_tests.py): a Megatron-style MLP, its first weight column-parallel (split by
rows), its second row-parallel (split by columns), its output bias replicated, over
TP = 2 (the partial outputs summed by torch.distributed over each data-parallel rank's
tensor-parallel pair), with each slice's 2 data-parallel ranks one ShardedOptimizer
(AdamW, max_grad_norm) given `placements`, the two slices' groups joined to one norm
domain.
- Every step's loss and, at the end, every piece equal one torch process training the
  unsharded model on the union of the batches with torch's own clip_grad_norm_ and AdamW
  (1e-5 relative: torch's and sx's AdamW round alike, the TP sums do not).
- Each slice saves its checkpoint; the 4 processes then make TP = 4 x DP = 1 (each its
  own slice, pieces half as large) and load each piece from the TP = 2 slice whose piece
  holds it (which needs the placements recorded: a piece [4, 4] saved as a whole param
  would not load into a [2, 4] piece of [8, 4]): the values are that slice's, bit for
  bit, and a step on the same gradients keeps them equal to the reference's (the AdamW
  moments and step counts came along)."""
import os
import tempfile

import torch
import torch.distributed as dist

import sx
import sx.torch

D, H, O, B, STEPS = 4, 8, 3, 5, 4
LR, CLIP = 0.05, 0.05


def weights():
    g = torch.Generator().manual_seed(3)
    return torch.randn(H, D, generator=g) * 0.5, torch.randn(O, H, generator=g) * 0.5, torch.randn(O, generator=g) * 0.1


def batch(step, d):
    g = torch.Generator().manual_seed(101 * step + d)
    return torch.randn(B, D, generator=g), torch.randn(B, O, generator=g)


class _SumOverTP(torch.autograd.Function):
    """Megatron's row-parallel output: summed over the tensor-parallel ranks going
    forward, the gradient passed through unchanged going back."""

    @staticmethod
    def forward(ctx, y, group):
        y = y.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def loss_of(w1, w2, b, x, y, tp_group):
    part = torch.relu(x @ w1.t()) @ w2.t()
    if tp_group is not None:
        part = _SumOverTP.apply(part, tp_group)
    return 0.5 * ((part + b - y) ** 2).sum(dim=1).mean()


def slice_params(tp, t):
    w1, w2, b = weights()
    h = H // tp
    return [torch.nn.Parameter(w1[t * h:(t + 1) * h].clone()), torch.nn.Parameter(w2[:, t * h:(t + 1) * h].clone()),
            torch.nn.Parameter(b.clone())]


def make_optimizer(params, tp, t, dp, d, port, domain):
    h = H // tp
    placements = {"w1": sx.torch.Split((H, D), 0, t * h), "w2": sx.torch.Split((O, H), 1, t * h),
                  "b": sx.torch.Replicated(t, tp)}
    opt = sx.torch.ShardedOptimizer(list(zip(("w1", "w2", "b"), params)), torch.optim.AdamW,
                                    rendezvous=f"tcp://127.0.0.1:{port + t}", rank=d, world_size=dp, lr=LR,
                                    max_grad_norm=CLIP, placements=placements, timeout_ms=60000)
    opt.group.join_norm_domain(domain, t)
    return opt


def check_close(what, got, want, rtol=1e-5):
    if not torch.allclose(got, want, rtol=rtol, atol=1e-7):
        raise AssertionError(f"{what}: {got} differs from the single process's {want}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "run with --nproc-per-node=4"
    tp, dp = 2, 2
    t, d = rank % tp, rank // tp
    tp_groups = [dist.new_group([dd * tp + tt for tt in range(tp)]) for dd in range(dp)]
    base = int(os.environ["MASTER_PORT"])
    domain = sx.NormDomain(f"tcp://127.0.0.1:{base + 1}", rank, world, timeout_ms=60000)
    params = slice_params(tp, t)
    opt = make_optimizer(params, tp, t, dp, d, base + 2, domain)
    ref = [torch.nn.Parameter(w.clone()) for w in weights()]
    ref_opt = torch.optim.AdamW(ref, lr=LR)
    for step in range(STEPS):
        x, y = batch(step, d)
        opt.zero_grad()
        loss = loss_of(*params, x, y, tp_groups[d])
        loss.backward()
        opt.step()
        if step == 0 and not opt.grad_norm > CLIP:
            raise AssertionError(f"rank {rank}: the gradient norm {opt.grad_norm} does not exceed the clip {CLIP}")
        xs, ys = zip(*(batch(step, dd) for dd in range(dp)))
        ref_opt.zero_grad()
        ref_loss = sum(loss_of(*ref, xx, yy, None) for xx, yy in zip(xs, ys)) / dp
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref, CLIP)
        ref_opt.step()
        mine = [loss.detach().clone()]
        dist.all_reduce(mine[0])
        # Each slice holds every data-parallel rank's loss: the sum over the 4 is tp x theirs.
        check_close(f"rank {rank}, step {step}: the mean loss", mine[0] / world, ref_loss.detach())
    h = H // tp
    want = [ref[0][t * h:(t + 1) * h], ref[1][:, t * h:(t + 1) * h], ref[2]]
    for name, p, q in zip(("w1", "w2", "b"), params, want):
        check_close(f"rank {rank}: {name} after {STEPS} steps", p.detach(), q.detach())
    print(f"rank {rank}: TP = 2 x DP = 2 matches one process, clipped at {CLIP}", flush=True)

    # Each slice saves into a directory of its own; TP = 4 x DP = 1 loads from them.
    root = [tempfile.mkdtemp(prefix="sx-check-tp-") if rank == 0 else None]
    dist.broadcast_object_list(root, src=0)
    if d == 0:
        os.makedirs(f"{root[0]}/tp{t}")
    dist.barrier()
    opt.save(f"{root[0]}/tp{t}/step{STEPS}").wait()
    saved = [p.detach().clone() for p in params]
    dist.barrier()
    tp4, t4 = 4, rank
    pieces = slice_params(tp4, t4)
    with torch.no_grad():
        for p in pieces:
            p.fill_(-7.0)
    opt4 = make_optimizer(pieces, tp4, t4, 1, 0, base + 10, sx.NormDomain(f"tcp://127.0.0.1:{base + 9}", rank, world,
                                                                           timeout_ms=60000))
    opt4.load(f"{root[0]}/tp{t4 // 2}/step{STEPS}")
    q = H // tp4
    half = (t4 % 2) * q
    # This process's TP = 2 slice held rows (columns) [t h, (t + 1) h); the TP = 4 piece is
    # of slice t4 // 2's: the values of every slice are all-gathered to compare.
    every = [[torch.zeros_like(s) for _ in range(world)] for s in saved]
    for k, s in enumerate(saved):
        dist.all_gather(every[k], s)
    src = t4 // 2  # domain rank of (t = t4 // 2, d = 0)
    expect = [every[0][src][half:half + q], every[1][src][:, half:half + q], every[2][src]]
    for name, p, e in zip(("w1", "w2", "b"), pieces, expect):
        if not torch.equal(p.detach(), e):
            raise AssertionError(f"rank {rank}: {name} loaded at TP = 4 is {p}, not {e}")
    # A step on the reference's next gradients keeps the pieces on the reference's path.
    x, y = batch(STEPS, 0)
    opt4.zero_grad()
    four = dist.new_group(list(range(world)))
    loss_of(*pieces, x, y, four).backward()
    opt4.step()
    ref_opt.zero_grad()
    loss_of(*ref, x, y, None).backward()
    torch.nn.utils.clip_grad_norm_(ref, CLIP)
    ref_opt.step()
    want = [ref[0][t4 * q:(t4 + 1) * q], ref[1][:, t4 * q:(t4 + 1) * q], ref[2]]
    for name, p, w in zip(("w1", "w2", "b"), pieces, want):
        check_close(f"rank {rank}: {name} one step after the load at TP = 4", p.detach(), w.detach())
    print(f"rank {rank}: the TP = 2 checkpoint loads at TP = 4 x DP = 1 and goes on as one process", flush=True)
    opt4.close()
    opt.close()
    dist.barrier()
    if rank == 0:
        import shutil
        shutil.rmtree(root[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
