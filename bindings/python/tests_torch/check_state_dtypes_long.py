"""8-bit AdamW over 200 steps against torchao's AdamW8bit (0.18.0), with gradients that
depend on the params (a least-squares pull towards a target, plus noise), so that any
difference would grow instead of washing out.

The bound sx is held to is torchao's own run-to-run spread, measured here: torchao's
compiled CPU step is deterministic, so two runs of it from the same start agree bit for
bit, and the bound is 0. sx must then equal torchao bit for bit after every one of the 200
steps, unsharded (1 rank) and sharded (2 ranks at stage 1, 3 ranks at stage 3: shard
boundaries cut the quantized params between blocks), for params in 8-bit blocks and one in
fp32.

Run as check_state_dtypes.py is (run_torch_tests.py); exits non-zero on the first
difference."""
import os
import sys

import numpy as np
import torch


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import check_state_dtypes  # noqa: E402
from check_state_dtypes import PARAMS, initial  # noqa: E402

STEPS = 200
OPTIONS = dict(lr=3e-3, weight_decay=0.1, betas=(0.9, 0.99))


def target(name, shape):
    return np.random.default_rng(7 + sum(map(ord, name))).uniform(-0.5, 0.5, size=shape).astype(np.float32)


def grad(name, shape, param, step):
    """d/dp of 0.5 * 0.1 * |p - target|^2, plus noise: fp32 numpy, the same on both sides."""
    noise = np.random.default_rng(100000 + 1000 * step + sum(map(ord, name))).standard_normal(size=shape)
    return (np.float32(0.1) * (param - target(name, shape)) + np.float32(0.01) * noise.astype(np.float32))


def run_torchao(world):
    """torchao's params after every step, each gradient times fp32(1 / world): what sx's
    mean over `world` ranks gives when rank 0 alone has the gradient."""
    from torchao.optim import AdamW8bit
    params = {name: torch.nn.Parameter(torch.from_numpy(initial(name, shape))) for name, shape, _ in PARAMS}
    opt = AdamW8bit(list(params.values()), **OPTIONS)
    scale = np.float32(1.0 / world)
    history = []
    for step in range(STEPS):
        for name, shape, _ in PARAMS:
            g = grad(name, shape, params[name].detach().numpy(), step)
            params[name].grad = torch.from_numpy(g * scale)
        opt.step()
        history.append({name: p.detach().numpy().copy() for name, p in params.items()})
    return history


def run_sx(world, stage):
    """Rank 0's params after every step, its gradients grad(...) (the other ranks' are
    zero), so that sx's mean over ranks is exactly what run_torchao(world) gives torchao."""
    return check_state_dtypes.run_sx("adamw", dict(OPTIONS, state_dtype="8bit"), world, stage, steps=STEPS,
                                     grad=grad, history=True)[0]


def first_difference(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        for name in b:
            if not np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)):
                return step + 1, name, float(np.max(np.abs(a[name].astype(np.float64) - b[name])))
    return None


def main():
    want = {1: run_torchao(1)}
    again = run_torchao(1)
    spread = max(float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) for a, b in zip(want[1], again) for n in b)
    if spread != 0.0:
        sys.exit(f"FAIL torchao's AdamW8bit is not deterministic here (two runs differ by up to {spread:g}); "
                 "the bit-for-bit bound below assumes it is")
    moved = max(float(np.max(np.abs(want[1][-1][n] - initial(n, s)))) for n, s, _ in PARAMS)
    print(f"ok   torchao's AdamW8bit run to run: identical over {STEPS} steps (bound 0); params moved up to "
          f"{moved:.3f}", flush=True)
    if not moved > 0.05:
        sys.exit(f"FAIL the params barely moved in {STEPS} steps ({moved:g}): the comparison would prove little")
    for world, stage in ((1, 2), (2, 1), (3, 3)):
        if world not in want:
            want[world] = run_torchao(world)
        got = run_sx(world, stage)
        diff = first_difference(got, want[world])
        if diff:
            step, name, size = diff
            sys.exit(f"FAIL 8-bit AdamW world {world} stage {stage}: param {name} differs from torchao's after step "
                     f"{step} (by up to {size:g}; torchao's own bound is 0)")
        print(f"ok   8-bit AdamW world {world} stage {stage}: bit for bit torchao's AdamW8bit after each of "
              f"{STEPS} steps", flush=True)


if __name__ == "__main__":
    main()
