"""bf16 params without fp32 masters (add_param_group's bf16_stochastic_round) against torchao
0.18's _AdamW(bf16_stochastic_round=True), which keeps the same bytes: bf16 params, bf16
moments, and each update rounded stochastically into the params.

torchao draws its random bits from torch's generator and sx from a hash of (param, step,
element), so the runs cannot agree bit for bit: they are compared as samples. A linear
regression (a 64 x 16 bf16 weight, 512 samples) is trained for STEPS steps from the same
start with the same gradient function (fp32 arithmetic on the bf16 weight, the gradient
rounded to bf16), by torchao under SEEDS seeds and by sx at worlds 1 and 2 (ranks as
threads over local://). At every CHECK_EVERY-th step sx's loss must lie within
LOSS_BOUND times the spread (max - min) of torchao's seeds of their mean, and at the end
sx's weight within WEIGHT_BOUND times the farthest seed's distance of the seeds' mean
weight. The same bounds are then shown to catch a run that does not round
stochastically: torchao's own _AdamW with bf16_stochastic_round=False (rounding to
nearest, which loses updates under half a bf16 step) must fall outside them. Both worlds
give sx's weight bit for bit.

Run with the Python of a torch environment that has torchao, SX_LIBRARY pointing at
libsx and PYTHONPATH at the binding (run_torch_tests.py does); exits non-zero on failure."""
import os
import sys

import numpy as np
import torch
from torchao.optim import _AdamW

import sx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _ranks import run_ranks  # noqa: E402

D_IN, D_OUT, N = 64, 16, 512
STEPS, CHECK_EVERY = 150, 10
LR, WEIGHT_DECAY = 1e-3, 0.01
SEEDS = 8
LOSS_BOUND, WEIGHT_BOUND = 2.0, 2.0

_rng = np.random.default_rng(48)
X = _rng.standard_normal((N, D_IN)).astype(np.float32)
Y = (X @ _rng.standard_normal((D_IN, D_OUT)) + 0.1 * _rng.standard_normal((N, D_OUT))).astype(np.float32)
W0 = torch.from_numpy(_rng.standard_normal((D_IN, D_OUT)).astype(np.float32)).to(torch.bfloat16)
XT, YT = torch.from_numpy(X), torch.from_numpy(Y)


def loss_of(w_bf16):
    return float(((XT @ w_bf16.float() - YT) ** 2).mean())


def grad_of(w_bf16):
    """The mean squared error's gradient at the bf16 weight, in fp32, rounded to bf16."""
    r = XT @ w_bf16.float() - YT
    return ((2.0 / r.numel()) * (XT.T @ r)).to(torch.bfloat16)


def run_torchao(seed, stochastic=True):
    torch.manual_seed(seed)
    p = torch.nn.Parameter(W0.clone())
    opt = _AdamW([p], lr=LR, weight_decay=WEIGHT_DECAY, bf16_stochastic_round=stochastic)
    losses = []
    for step in range(1, STEPS + 1):
        p.grad = grad_of(p.detach())
        opt.step()
        if step % CHECK_EVERY == 0:
            losses.append(loss_of(p.detach()))
    return np.array(losses), p.detach().float().numpy()


def bits_to_bf16(u16):
    return torch.from_numpy(np.ascontiguousarray(u16).view(np.int16)).view(torch.bfloat16)


def run_sx(world):
    def rank_main(rank, rendezvous):
        with sx.ShardGroup(rendezvous, rank, world, backend="cpu", num_threads=1, timeout_ms=60000) as g:
            g.add_param_group("adamw", lr=LR, weight_decay=WEIGHT_DECAY, state_dtype="bf16",
                              bf16_stochastic_round=True)
            g.add_param("w", [D_IN, D_OUT], dtype="bf16")
            g.finalize()
            g.param_view("w")[...] = W0.view(torch.int16).numpy().view(np.uint16)
            losses = []
            for step in range(1, STEPS + 1):
                w = bits_to_bf16(g.param_view("w"))
                grad = grad_of(w) if rank == 0 else torch.zeros(D_IN, D_OUT, dtype=torch.bfloat16)
                g.grad_view("w")[...] = grad.view(torch.int16).numpy().view(np.uint16)
                g.step(weight=1.0 if rank == 0 else 0.0)  # rank 0's gradient, exactly
                if step % CHECK_EVERY == 0:
                    losses.append(loss_of(bits_to_bf16(g.param_view("w"))))
            return np.array(losses), bits_to_bf16(g.param_view("w")).float().numpy()

    return run_ranks(world, rank_main)[0]


def within(losses, weight, mean_losses, spread, mean_weight, radius):
    loss_ok = bool(np.all(np.abs(losses - mean_losses) <= LOSS_BOUND * spread))
    weight_ok = bool(np.linalg.norm(weight - mean_weight) <= WEIGHT_BOUND * radius)
    return loss_ok, weight_ok


def main():
    runs = [run_torchao(seed) for seed in range(SEEDS)]
    losses = np.stack([r[0] for r in runs])
    weights = np.stack([r[1] for r in runs])
    mean_losses, spread = losses.mean(axis=0), losses.max(axis=0) - losses.min(axis=0)
    mean_weight = weights.mean(axis=0)
    radius = max(np.linalg.norm(w - mean_weight) for w in weights)
    print(f"torchao _AdamW(bf16_stochastic_round=True), {SEEDS} seeds: loss {losses[:, 0].mean():.5f} at step "
          f"{CHECK_EVERY} -> {mean_losses[-1]:.5f} at step {STEPS} (spread {spread[-1]:.2e}); the farthest "
          f"seed's weight is {radius:.3e} from their mean", flush=True)
    got = {world: run_sx(world) for world in (1, 2)}
    if not np.array_equal(got[1][1], got[2][1]):
        sys.exit("FAIL: sx's weight differs between worlds 1 and 2")
    sx_losses, sx_weight = got[1]
    loss_ok, weight_ok = within(sx_losses, sx_weight, mean_losses, spread, mean_weight, radius)
    worst = np.max(np.abs(sx_losses - mean_losses) / np.maximum(spread, 1e-30))
    print(f"sx bf16_stochastic_round: loss {sx_losses[-1]:.5f} at step {STEPS}; its largest loss gap is "
          f"{worst:.2f} spreads (bound {LOSS_BOUND}); its weight is {np.linalg.norm(sx_weight - mean_weight):.3e} "
          f"from torchao's mean (bound {WEIGHT_BOUND} x {radius:.3e})", flush=True)
    if not (loss_ok and weight_ok):
        sys.exit("FAIL: sx's run lies outside the spread of torchao's own runs")
    nearest_losses, nearest_weight = run_torchao(0, stochastic=False)
    print(f"torchao rounding to nearest: loss {nearest_losses[-1]:.5f} at step {STEPS}; its weight is "
          f"{np.linalg.norm(nearest_weight - mean_weight):.3e} from the stochastic runs' mean", flush=True)
    if all(within(nearest_losses, nearest_weight, mean_losses, spread, mean_weight, radius)):
        sys.exit("FAIL: the bounds do not tell rounding to nearest from stochastic rounding")
    print("ok   bf16_stochastic_round: sx tracks torchao's _AdamW within the spread of its seeds", flush=True)


if __name__ == "__main__":
    main()
