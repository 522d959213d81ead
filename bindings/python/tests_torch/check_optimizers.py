"""Every optimizer of sx's table that torch.optim lacks the SGD/Adam tests of: Adagrad,
RMSprop, Adamax, NAdam, RAdam (against torch.optim's classes), Lion (against
lion-pytorch's), LAMB (against pytorch-optimizer's Lamb, whose norms span the pieces
of a param on several ranks), AdEMAMix (against pytorch-optimizer's, three moments and
its warmup of alpha and beta3) and Adafactor (against torch.optim.Adafactor, whose row and
column means span them too), over 100 steps of a model of four params in two param groups and two
units, with ranks as threads (worlds 1 to 4) at stages 1, 2 and 3: each rank's own
gradients (averaged, as DDP does), an lr schedule, clipping of the global norm, a param
frozen for 30 steps (torch: its grad None, so its step count stops too) and weight decay.
After every run the params agree with torch's within 1e-6, normwise relative; so do
runs saved after 50 steps and resumed at another world size, stage and mesh.

Run with the Python of a torch environment, SX_LIBRARY pointing at libsx and PYTHONPATH
at the binding (run_torch_tests.py does); exits non-zero on the first difference."""
import itertools
import os
import sys
import tempfile

import numpy as np
import torch
from lion_pytorch import Lion
from pytorch_optimizer import AdEMAMix, Lamb

import sx

# The binding's test helper: ranks as threads over local://, the first real error raised.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _ranks import run_ranks  # noqa: E402

TOL = 1e-6
STEPS = 100
MAX_NORM = 1.0
# name, shape, unit, param group
PARAMS = [("a", (7, 5), 0, 0), ("b", (13,), 1, 0), ("c", (3, 4, 2), 0, 1), ("d", (11,), 1, 1)]
FROZEN, FROZEN_FROM, FROZEN_TO = "c", 30, 60

# sx's name, the reference class, and each config's two param groups' options.
CONFIGS = [
    ("adagrad", torch.optim.Adagrad,
     [dict(lr=0.05, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1),
      dict(lr=0.02, maximize=True, initial_accumulator_value=0.1)]),
    ("rmsprop", torch.optim.RMSprop,
     [dict(lr=0.01, alpha=0.9, momentum=0.9, centered=True, weight_decay=0.01), dict(lr=0.005)]),
    ("rmsprop", torch.optim.RMSprop,
     [dict(lr=0.01, centered=True, maximize=True), dict(lr=0.003, momentum=0.5, weight_decay=0.02)]),
    ("adamax", torch.optim.Adamax,
     [dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01), dict(lr=0.004, maximize=True)]),
    ("nadam", torch.optim.NAdam,
     [dict(lr=0.01, momentum_decay=0.005, weight_decay=0.01, decoupled_weight_decay=True),
      dict(lr=0.003, weight_decay=0.02)]),
    ("radam", torch.optim.RAdam,
     [dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True), dict(lr=0.003, weight_decay=0.02, betas=(0.9, 0.99))]),
    ("lion", Lion, [dict(lr=1e-3, weight_decay=0.1), dict(lr=3e-4, betas=(0.95, 0.98))]),
    # Decoupled weight decay (Lamb's weight_decouple, its default) and L2 on the
    # direction; the frozen param's group counts its steps on (Lamb's step size
    # lr / (1 - beta1^t) has the group's t). (Lamb's maximize is its constructor's, not a
    # group's: sx's is tested against the other optimizers'.)
    ("lamb", Lamb, [dict(lr=0.01, weight_decay=0.01), dict(lr=0.005, weight_decay=0.02, decoupled_weight_decay=False,
                                                      betas=(0.8, 0.99), eps=1e-8)]),
    # Factored moments for "a" (7 x 5, its rows split between ranks) and "c" (three 4 x 2
    # matrices), a variance per element for "b" and "d"; torch's eps1 of None (fp32's
    # machine epsilon) and a given one, the update's RMS clipped at d.
    ("adafactor", torch.optim.Adafactor,
     [dict(lr=0.01, weight_decay=0.01), dict(lr=0.005, beta2_decay=-0.6, eps=(1e-6, 1e-2), d=1.5, maximize=True)]),
    # L2 weight decay with alpha and beta3 warming up over 40 steps (the paper's
    # schedulers), and decoupled decay with other betas and alpha and no warmup; the
    # frozen param's group counts its steps on (bias corrections and warmup at the
    # group's step). (AdEMAMix's maximize is its constructor's, not a group's.)
    ("ademamix", AdEMAMix,
     [dict(lr=0.01, weight_decay=0.01, t_alpha_beta3=40),
      dict(lr=0.005, weight_decay=0.02, decoupled_weight_decay=True, betas=(0.8, 0.99, 0.995), alpha=2.0)]),
]
# sx's names of options the reference classes name otherwise.
TORCH_NAMES = {Lamb: {"decoupled_weight_decay": "weight_decouple"},
               AdEMAMix: {"decoupled_weight_decay": "weight_decouple"}}
# Every config at every world size and stage; the second RMSprop config at two of them.
WORLDS_STAGES = list(itertools.product((1, 2, 3, 4), (1, 2, 3)))


def initial(name, shape):
    seed = sum(map(ord, name))
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def grad_of(name, shape, step, rank, p):
    """Rank `rank`'s gradient of param `name` at `step`, given the param's values."""
    seed = 1_000_000 + 1000 * step + 10 * rank + sum(map(ord, name))
    noise = np.random.default_rng(seed).standard_normal(size=shape).astype(np.float32)
    return (0.5 * noise + 0.1 * p).astype(np.float32)


def lr_at(base, step):
    return base * 0.98 ** step


def run_sx(kind, groups, world, stage, *, shard_size=0, steps=(0, STEPS), load=None, save=None):
    """Steps [steps[0], steps[1]) at `world` ranks (a mesh of shard groups of
    `shard_size` ranks, if not 0), starting from the initial params or from the
    checkpoint `load`, and saving into `save` at the end; returns each rank's params."""
    def rank_main(rank, rendezvous):
        with sx.ShardGroup(rendezvous, rank, world, stage=stage, backend="cpu", num_threads=1,
                           timeout_ms=60000, shard_size=shard_size) as g:
            for options in groups:
                g.add_param_group(kind, **options)
            for name, shape, unit, group in PARAMS:
                g.add_param(name, list(shape), unit=unit, param_group=group)
            g.finalize()
            if load:
                g.load(load)
            else:
                for u in (0, 1):
                    with g.unit(u):
                        for name, shape, unit, _ in PARAMS:
                            if unit == u:
                                g.param_view(name)[...] = initial(name, shape)
            for step in range(*steps):
                for i, options in enumerate(groups):
                    g.set_lr(i, lr_at(options["lr"], step))
                g.set_trainable(FROZEN, not FROZEN_FROM <= step < FROZEN_TO)
                for u in (0, 1):
                    with g.unit(u):
                        for name, shape, unit, _ in PARAMS:
                            if unit == u:
                                p = np.array(g.param_view(name))
                                g.grad_view(name)[...] = grad_of(name, shape, step, rank, p)
                g.step(max_grad_norm=MAX_NORM)
            if save:
                g.save(save, synchronous=True)
            out = {}
            for u in (0, 1):
                with g.unit(u):
                    for name, _, unit, _ in PARAMS:
                        if unit == u:
                            out[name] = np.array(g.param_view(name))
            return out

    return run_ranks(world, rank_main)


def run_torch(cls, groups, world):
    """torch's run; `world` is the number of ranks whose gradients each step averages,
    or {last_step: world, ...} for a number that changes (steps before 50 at 3 ranks)."""
    worlds = world if isinstance(world, dict) else {STEPS: world}
    params = {name: torch.nn.Parameter(torch.from_numpy(initial(name, shape))) for name, shape, _, _ in PARAMS}
    # torch's Adagrad fills every group's sum from its constructor's
    # initial_accumulator_value, whatever a group says: pass it there.
    init = {"initial_accumulator_value": groups[0]["initial_accumulator_value"]} if cls is torch.optim.Adagrad else {}
    if cls is AdEMAMix:
        init = {"foreach": False}  # its per-tensor loop, op for op
    names = TORCH_NAMES.get(cls, {})
    opt = cls([{"params": [params[n] for n, _, _, grp in PARAMS if grp == i],
                **{names.get(k, k): v for k, v in options.items()}}
               for i, options in enumerate(groups)], **init)
    for step in range(STEPS):
        for group, options in zip(opt.param_groups, groups):
            group["lr"] = lr_at(options["lr"], step)
        for name, shape, _, _ in PARAMS:
            if name == FROZEN and FROZEN_FROM <= step < FROZEN_TO:
                params[name].grad = None  # torch skips it: no update, no step counted
                continue
            p = params[name].detach().numpy()
            ranks = worlds[min(last for last in worlds if step < last)]
            mean = np.mean([grad_of(name, shape, step, r, p).astype(np.float64) for r in range(ranks)], axis=0)
            params[name].grad = torch.from_numpy(mean.astype(np.float32))
        torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], MAX_NORM)
        opt.step()
    return {name: p.detach().numpy() for name, p in params.items()}


def normwise(got, want):
    diff = np.sqrt(sum(np.sum((got[n].astype(np.float64) - want[n]) ** 2) for n in want))
    norm = np.sqrt(sum(np.sum(want[n].astype(np.float64) ** 2) for n in want))
    return diff / norm


def main():
    torch.manual_seed(0)
    checked = 0
    # Arguments, if any, name the optimizers to check (sx's names).
    only = set(sys.argv[1:])
    for index, (kind, cls, groups) in enumerate(CONFIGS):
        if only and kind not in only:
            continue
        runs = WORLDS_STAGES if index != 2 else [(2, 2), (3, 3)]
        for world in sorted({w for w, _ in runs}):
            want = run_torch(cls, groups, world)
            for stage in [s for w, s in runs if w == world]:
                ranks = run_sx(kind, groups, world, stage)
                for rank, got in enumerate(ranks):
                    err = normwise(got, want)
                    if not err <= TOL:
                        sys.exit(f"FAIL {cls.__name__} {groups} world {world} stage {stage} rank {rank}: "
                                 f"normwise relative error {err:.3g} against {cls.__module__}.{cls.__name__}")
                moved = normwise({n: initial(n, s) for n, s, _, _ in PARAMS}, want)
                print(f"ok   {cls.__name__:8s} world {world} stage {stage}: error {normwise(ranks[0], want):.2e} "
                      f"(the params moved {moved:.2e} from their start)", flush=True)
                checked += 1
    print(f"{checked} runs of {STEPS} steps agree with torch within {TOL}")

    # A checkpoint of each, saved by 3 ranks at stage 1 after 50 steps and resumed by 2
    # ranks at stage 3 and by a 2 x 2 mesh at stage 2: the state, the per-param steps
    # (the frozen param's are behind) and NAdam's mu_product go through it.
    with tempfile.TemporaryDirectory() as tmp:
        for index, (kind, cls, groups) in enumerate(CONFIGS):
            if only and kind not in only:
                continue
            path = os.path.join(tmp, f"{index}-{kind}")
            run_sx(kind, groups, 3, 1, steps=(0, 50), save=path)
            for world, stage, shard_size in ((2, 3, 0), (4, 2, 2)):
                ranks = run_sx(kind, groups, world, stage, shard_size=shard_size, steps=(50, STEPS), load=path)
                # The resumed run's ranks average world ranks' gradients from step 50 on:
                # compare with torch's run that does the same.
                want = run_torch(cls, groups, {50: 3, STEPS: world})
                for rank, got in enumerate(ranks):
                    err = normwise(got, want)
                    if not err <= TOL:
                        sys.exit(f"FAIL {cls.__name__} resumed at world {world} stage {stage} shard_size "
                                 f"{shard_size} rank {rank}: normwise relative error {err:.3g}")
                print(f"ok   {cls.__name__:8s} saved by 3 ranks at stage 1, resumed by {world} at stage {stage}"
                      f"{' as a 2 x 2 mesh' if shard_size else ''}: error {normwise(ranks[0], want):.2e}", flush=True)
        # A checkpoint of one optimizer does not load into another: the error names both.
        if only:
            return
        other = os.path.join(tmp, "1-rmsprop")
        try:
            run_sx("adamax", CONFIGS[3][2], 1, 1, steps=(50, 51), load=other)
        except sx.MismatchError as e:
            if "RMSprop" not in str(e) or "Adamax" not in str(e):
                sys.exit(f"FAIL loading RMSprop's checkpoint into Adamax: the error names not both: {e}")
            print(f"ok   an RMSprop checkpoint refused by Adamax: {e}")
        else:
            sys.exit("FAIL an RMSprop checkpoint loaded into an Adamax group")


if __name__ == "__main__":
    main()
