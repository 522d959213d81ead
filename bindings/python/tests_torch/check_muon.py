"""sx's Muon against torch.optim.Muon, as trainers pair it: a Muon param group for the 2-D
params and an AdamW group for the rest, over 20 steps of a model of five params in two
units, with ranks as threads (worlds 1 to 4) at stages 1, 2 and 3: each rank's own
gradients (averaged, as DDP does), an lr schedule, clipping of the global norm, and a
matrix frozen for 5 steps.

- Against torch: torch's Newton-Schulz runs in bf16 with its own order of sums; sx's in
  bf16 too, its sums in ascending order, so an element of an update may round to the
  neighbouring bf16 value. The bound: after 20 steps the params' difference from torch's
  is at most 2^-8 (bf16's unit roundoff) of how far torch's params moved, normwise.
- Between sx's runs: every stage gives the same bits at a world size, and worlds 1, 2 and
  4 do where every rank has the same gradients of few significant bits and nothing is
  clipped (so that their averages are the same bits): each matrix is orthogonalised whole on one rank, in one order of operations
  wherever it is. A run saved after 10 steps resumes at another world size, stage and mesh
  within the same bound of torch.
- Mixed precision: bf16 params with fp32 masters (and fp32 gradients) end as the fp32
  run's params rounded to bf16, bit for bit, at 2 ranks, stage 2.
- A param that is not 2-D in a Muon group is refused at finalize, naming it and the rule.

Run with the Python of a torch environment, SX_LIBRARY pointing at libsx and PYTHONPATH
at the binding (run_torch_tests.py does); exits non-zero on the first difference."""
import os
import sys
import tempfile

import numpy as np
import torch

import sx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _ranks import run_ranks  # noqa: E402

TOL = 2.0 ** -8  # of the distance the params moved
STEPS = 20
MAX_NORM = 1.0
# name, shape, unit; the 2-D ones in the Muon group (0), the rest in the AdamW group (1).
# "tall" has more rows than columns (Newton-Schulz transposes it); "wide" spans ranks.
PARAMS = [("tall", (13, 6), 0), ("bias", (13,), 0), ("wide", (9, 24), 1), ("sq", (16, 16), 1), ("gain", (5,), 1)]
FROZEN, FROZEN_FROM, FROZEN_TO = "sq", 6, 11
MUON = dict(lr=0.02, weight_decay=0.05, momentum=0.9)
ADAMW = dict(lr=0.01, weight_decay=0.01)


def is_matrix(shape):
    return len(shape) == 2


def initial(name, shape):
    return np.random.default_rng(sum(map(ord, name))).uniform(-1, 1, size=shape).astype(np.float32)


def grad_of(name, shape, step, rank, p):
    noise = np.random.default_rng(1_000_000 + 1000 * step + 10 * rank + sum(map(ord, name))).standard_normal(shape)
    return (0.5 * noise.astype(np.float32) + 0.1 * p).astype(np.float32)


def lr_at(base, step):
    return base * 0.97 ** step


def run_sx(world, stage, *, shard_size=0, steps=(0, STEPS), load=None, save=None, muon=MUON, same_grads=False):
    def rank_main(rank, rendezvous):
        with sx.ShardGroup(rendezvous, rank, world, stage=stage, backend="cpu", num_threads=1,
                           timeout_ms=60000, shard_size=shard_size) as g:
            g.add_param_group("muon", **muon)
            g.add_param_group("adamw", **ADAMW)
            for name, shape, unit in PARAMS:
                g.add_param(name, list(shape), unit=unit, param_group=0 if is_matrix(shape) else 1)
            g.finalize()
            if load:
                g.load(load)
            else:
                for u in (0, 1):
                    with g.unit(u):
                        for name, shape, unit in PARAMS:
                            if unit == u:
                                g.param_view(name)[...] = initial(name, shape)
            for step in range(*steps):
                g.set_lr(0, lr_at(muon["lr"], step))
                g.set_lr(1, lr_at(ADAMW["lr"], step))
                g.set_trainable(FROZEN, not FROZEN_FROM <= step < FROZEN_TO)
                for u in (0, 1):
                    with g.unit(u):
                        for name, shape, unit in PARAMS:
                            if unit == u:
                                p = np.array(g.param_view(name))
                                grad = grad_of(name, shape, step, 0 if same_grads else rank, p)
                                if same_grads:  # 8 significant bits: sums of 4 of them are exact
                                    grad = (grad.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
                                g.grad_view(name)[...] = grad
                g.step(max_grad_norm=0.0 if same_grads else MAX_NORM)
            if save:
                g.save(save, synchronous=True)
            out = {}
            for u in (0, 1):
                with g.unit(u):
                    for name, _, unit in PARAMS:
                        if unit == u:
                            out[name] = np.array(g.param_view(name))
            return out

    return run_ranks(world, rank_main)


def run_torch(world, muon=MUON):
    worlds = world if isinstance(world, dict) else {STEPS: world}
    params = {name: torch.nn.Parameter(torch.from_numpy(initial(name, shape))) for name, shape, _ in PARAMS}
    adjust = {0: None, 1: "match_rms_adamw", 2: "spectral_unclamped"}
    torch_muon = {k: v for k, v in muon.items() if k != "adjust_lr"}
    if "adjust_lr" in muon:
        torch_muon["adjust_lr_fn"] = adjust[muon["adjust_lr"]]
    m = torch.optim.Muon([params[n] for n, s, _ in PARAMS if is_matrix(s)], **torch_muon)
    a = torch.optim.AdamW([params[n] for n, s, _ in PARAMS if not is_matrix(s)], **ADAMW)
    for step in range(STEPS):
        m.param_groups[0]["lr"] = lr_at(muon["lr"], step)
        a.param_groups[0]["lr"] = lr_at(ADAMW["lr"], step)
        for name, shape, _ in PARAMS:
            if name == FROZEN and FROZEN_FROM <= step < FROZEN_TO:
                params[name].grad = None
                continue
            p = params[name].detach().numpy()
            ranks = worlds[min(last for last in worlds if step < last)]
            mean = np.mean([grad_of(name, shape, step, r, p).astype(np.float64) for r in range(ranks)], axis=0)
            params[name].grad = torch.from_numpy(mean.astype(np.float32))
        torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], MAX_NORM)
        m.step()
        a.step()
    return {name: p.detach().numpy() for name, p in params.items()}


def moved(want):
    return np.sqrt(sum(np.sum((want[n].astype(np.float64) - initial(n, s)) ** 2) for n, s, _ in PARAMS))


def off_by(got, want):
    """The params' difference from torch's, over how far torch's moved from the start."""
    return np.sqrt(sum(np.sum((got[n].astype(np.float64) - want[n]) ** 2) for n in want)) / moved(want)


def normwise(got, want):
    diff = np.sqrt(sum(np.sum((got[n].astype(np.float64) - want[n]) ** 2) for n in want))
    return diff / np.sqrt(sum(np.sum(want[n].astype(np.float64) ** 2) for n in want))


def same_bits(a, b):
    return all(np.array_equal(a[n].view(np.uint32), b[n].view(np.uint32)) for n in a)


def main():
    worst = 0.0
    for muon in (MUON, dict(MUON, nesterov=False, adjust_lr=1, ns_steps=4)):
        for world in (1, 2, 3, 4):
            first = None
            want = run_torch(world, muon)
            for stage in (1, 2, 3):
                ranks = run_sx(world, stage, muon=muon)
                for rank, got in enumerate(ranks):
                    err = off_by(got, want)
                    worst = max(worst, err)
                    if not err <= TOL:
                        sys.exit(f"FAIL Muon {muon} world {world} stage {stage} rank {rank}: the params differ "
                                 f"from torch.optim.Muon's by {err:.3g} of how far they moved")
                    if rank > 0 and not same_bits(got, ranks[0]):
                        sys.exit(f"FAIL Muon world {world} stage {stage}: rank {rank}'s params differ from rank 0's")
                print(f"ok   Muon {muon} world {world} stage {stage}: off by {off_by(ranks[0], want):.2e} of the "
                      f"distance moved ({normwise(ranks[0], want):.2e} normwise)", flush=True)
                if first is None:
                    first = ranks[0]
                elif not same_bits(ranks[0], first):
                    sys.exit(f"FAIL Muon world {world} stage {stage}: not the same bits as stage 1")
        one = run_sx(1, 1, muon=muon, same_grads=True)[0]
        for world, stage in ((2, 3), (4, 2)):
            if not same_bits(run_sx(world, stage, muon=muon, same_grads=True)[0], one):
                sys.exit(f"FAIL Muon world {world} stage {stage} with every rank's gradients the same: not the "
                         "same bits as one rank")
        print(f"ok   Muon {muon}: worlds 1, 2 and 4 give the same bits on the same gradients", flush=True)
    print(f"Muon agrees with torch.optim.Muon within {worst:.2e} of the distance moved (bound 2^-8), the same "
          "bits at every stage")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ck")
        run_sx(3, 1, steps=(0, 10), save=path)
        for world, stage, shard_size in ((2, 3, 0), (4, 2, 2)):
            ranks = run_sx(world, stage, shard_size=shard_size, steps=(10, STEPS), load=path)
            # Steps 10 on average `world` ranks' gradients: compare with torch over the same.
            err = off_by(ranks[0], run_torch({10: 3, STEPS: world}))
            if not err <= TOL:
                sys.exit(f"FAIL Muon resumed at world {world} stage {stage}: error {err:.3g}")
            print(f"ok   Muon saved by 3 ranks at stage 1, resumed by {world} at stage {stage}"
                  f"{' as a 2 x 2 mesh' if shard_size else ''}: off by {err:.2e} of the distance moved", flush=True)

    # bf16 params, fp32 masters and gradients: the fp32 run's params rounded. The
    # gradients do not depend on the params here (the bf16 run's params are rounded).
    def bf16_bits(x):
        x = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        return ((x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)

    def mixed(dtype):
        def rank_main(rank, rendezvous):
            with sx.ShardGroup(rendezvous, rank, 2, stage=2, backend="cpu", num_threads=1, timeout_ms=60000,
                               grad_dtype="f32") as g:
                g.add_param_group("muon", **MUON)
                g.add_param_group("adamw", **ADAMW)
                for name, shape, unit in PARAMS:
                    g.add_param(name, list(shape), unit=unit, param_group=0 if is_matrix(shape) else 1,
                                dtype=dtype)
                g.finalize()
                for name, shape, _ in PARAMS:
                    start = bf16_bits(initial(name, shape))
                    g.param_view(name)[...] = start if dtype == "bf16" else (start.astype(np.uint32) << 16).view(np.float32)
                for step in range(STEPS):
                    for name, shape, _ in PARAMS:
                        g.grad_view(name)[...] = grad_of(name, shape, step, rank, np.zeros(shape, np.float32))
                    g.step()
                return {name: np.array(g.param_view(name)) for name, _, _ in PARAMS}
        return run_ranks(2, rank_main)[0]

    full, half = mixed("f32"), mixed("bf16")
    for name, _, _ in PARAMS:
        if not np.array_equal(bf16_bits(full[name]), half[name]):
            sys.exit(f"FAIL Muon with bf16 params: {name} is not the fp32 run's params rounded to bf16")
    print("ok   Muon with bf16 params and fp32 masters: the fp32 run's params rounded, bit for bit", flush=True)

    # Not 2-D: refused at finalize, naming the param and the rule.
    def refused(rank, rendezvous):
        with sx.ShardGroup(rendezvous, rank, 1, backend="cpu") as g:
            g.add_param_group("muon")
            g.add_param("cube", [2, 3, 4])
            try:
                g.finalize()
            except sx.SxError as e:
                return str(e)
            return None

    message = run_ranks(1, refused)[0]
    if not message or "'cube' has 3 dimensions" not in message or "2-D params only" not in message:
        sys.exit(f"FAIL a 3-D param in a Muon group: {message!r}")
    print(f"ok   a 3-D param refused: {message}")


if __name__ == "__main__":
    main()
