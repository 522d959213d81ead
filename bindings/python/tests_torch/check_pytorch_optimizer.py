"""sx.torch with pytorch-optimizer's Lamb and AdEMAMix, which sx runs with its own kernels:
Lamb's trust ratio is a norm over the whole param, wherever its pieces lie, and both
count steps per param group (their bias corrections' t, and AdEMAMix's warmup of alpha
and beta3). Over 8 steps of four params in two param groups, at world 1 and at 2 ranks
as threads (each rank's own gradients, averaged; one param's pieces on both ranks), with
the second group's params frozen for steps 3 to 5 (the class's grads None: the group
counts on, its params' updates do not), sx.torch agrees with the class run by torch on
the averaged gradients within 1e-6, normwise relative. Its state_dict() is the class's
(the tensors the class reads, and its param groups with their "step") and loads into the
class, which goes on as sx does; the class's state_dict() loads into sx.torch, which goes
on as the class does; an sx checkpoint loads into an optimizer made with other options,
whose param groups then hold the saved ones, and goes on as the class does. The options
sx does not follow are refused, naming them.

Run with the Python of a torch environment, SX_LIBRARY pointing at libsx and PYTHONPATH
at the binding (run_torch_tests.py does); exits non-zero on the first difference."""
import copy
import itertools
import os
import sys
import tempfile

import numpy as np
import torch
from pytorch_optimizer import AdEMAMix, Lamb

import sx.torch
from sx.errors import UnsupportedError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _ranks import run_ranks  # noqa: E402

TOL = 1e-6
STEPS, MORE = 8, 3
# name, shape, param group; one unit of 83 elements, so that at 2 ranks "b" (35..48)
# has a piece on each.
PARAMS = [("a", (7, 5), 0), ("b", (13,), 0), ("c", (3, 4, 2), 1), ("d", (11,), 1)]
FROZEN_GROUP, FROZEN_FROM, FROZEN_TO = 1, 3, 6
# Lamb's state the class writes at each step and never reads (the last step's norms): not
# sx's.
LAMB_DIAGNOSTICS = ("weight_norm", "adam_norm", "trust_ratio")

# The class, its constructor's options, each param group's, and other options of both for
# an optimizer that a state dict or a checkpoint must override.
CONFIGS = [
    (Lamb, dict(), [dict(lr=0.01, weight_decay=0.01),
                    dict(lr=0.005, weight_decay=0.02, weight_decouple=False, betas=(0.8, 0.99), eps=1e-8)],
     [dict(lr=0.5, weight_decay=0.0, betas=(0.5, 0.5)), dict(lr=0.5, weight_decouple=True)]),
    # alpha and beta3 still warming up at the last step (t_alpha_beta3 20), and no warmup
    # (None) with decoupled weight decay; its per-tensor loop, op for op.
    (AdEMAMix, dict(foreach=False), [dict(lr=0.01, weight_decay=0.01, t_alpha_beta3=20),
                                     dict(lr=0.005, weight_decay=0.02, weight_decouple=True,
                                          betas=(0.8, 0.99, 0.995), alpha=2.0)],
     [dict(lr=0.5, t_alpha_beta3=None, betas=(0.5, 0.5, 0.5)), dict(lr=0.5, t_alpha_beta3=7, weight_decouple=False)]),
]

_names = itertools.count()


def initial(name, shape):
    return np.random.default_rng(sum(map(ord, name))).uniform(-1, 1, size=shape).astype(np.float32)


def loss_of(params, step, rank):
    """Rank `rank`'s loss at `step` over the trainable ones of {name: param}: each param's
    gradient is 0.5 x noise + 0.1 x its values."""
    total = 0.0
    for name, shape, _ in PARAMS:
        p = params[name]
        if p.requires_grad:
            seed = 1_000_000 + 1000 * step + 10 * rank + sum(map(ord, name))
            noise = torch.from_numpy(np.random.default_rng(seed).standard_normal(size=shape).astype(np.float32))
            total = total + (0.5 * noise * p).sum() + 0.05 * (p * p).sum()
    return total


def frozen(group, step):
    return group == FROZEN_GROUP and FROZEN_FROM <= step < FROZEN_TO


def parameters(values):
    return {name: torch.nn.Parameter(torch.from_numpy(np.array(values[name]))) for name, _, _ in PARAMS}


def grouped(params, options):
    return [{"params": [(n, params[n]) for n, _, g in PARAMS if g == gi], **opts} for gi, opts in enumerate(options)]


def torch_steps(opt, params, steps, world):
    """The class's steps on the gradients of `world` ranks, averaged (a frozen group's
    params: grad None)."""
    for step in steps:
        grads = {}
        for rank in range(world):
            copies = {n: p.detach().clone().requires_grad_(not frozen(g, step)) for (n, p), (_, _, g)
                      in zip(params.items(), PARAMS)}
            loss_of(copies, step, rank).backward()
            for n, c in copies.items():
                if c.grad is not None:
                    grads.setdefault(n, []).append(c.grad.to(torch.float64))
        for name, p in params.items():
            p.grad = torch.stack(grads[name]).mean(0).to(torch.float32) if name in grads else None
        opt.step()


def sx_steps(opt, params, steps, rank):
    for step in steps:
        for name, _, g in PARAMS:
            params[name].requires_grad_(not frozen(g, step))
        opt.zero_grad()
        loss_of(params, step, rank).backward()
        opt.step()


def values(params):
    return {n: p.detach().numpy().copy() for n, p in params.items()}


def normwise(got, want):
    diff = np.sqrt(sum(np.sum((got[n].astype(np.float64) - want[n]) ** 2) for n in want))
    return diff / np.sqrt(sum(np.sum(want[n].astype(np.float64) ** 2) for n in want))


def expect_close(got, want, what):
    err = normwise(got, want)
    if not err <= TOL:
        raise SystemExit(f"FAIL {what}: normwise relative error {err:.3g}")
    print(f"ok   {what}: error {err:.2e}", flush=True)
    return err


def sx_opt(cls, ctor, params, options, rank, world, rendezvous):
    return sx.torch.ShardedOptimizer(grouped(params, options), cls, rendezvous=rendezvous, rank=rank,
                                     world_size=world, num_threads=1, timeout_ms=60000, **ctor)


def check_state_dict(mine, theirs, what):
    """sx's state dict is the class's: the same params with state, each with the tensors the
    class reads (within TOL, normwise relative) and no per-param step, and the same param
    groups (their options, "step" and params)."""
    if sorted(mine["state"]) != sorted(theirs["state"]):
        raise SystemExit(f"FAIL {what}: state of params {sorted(mine['state'])}, the class's {sorted(theirs['state'])}")
    for i, entry in theirs["state"].items():
        keys = [k for k in entry if k not in LAMB_DIAGNOSTICS]
        if list(mine["state"][i]) != keys:
            raise SystemExit(f"FAIL {what}: param {i} has {list(mine['state'][i])}, the class's {keys}")
        for key in keys:
            have, want = mine["state"][i][key].double(), entry[key].double()
            err = ((have - want).norm() / want.norm()).item()
            if have.shape != want.shape or not err <= TOL:
                raise SystemExit(f"FAIL {what}: param {i} {key}: shape {list(have.shape)} (the class's "
                                 f"{list(want.shape)}), normwise relative error {err:.3g}")
    # (torch keeps the names of params given as (name, param) pairs; sx.torch keeps them as
    # sx's names.)
    groups = [{k: v for k, v in g.items() if k != "param_names"} for g in theirs["param_groups"]]
    if mine["param_groups"] != groups:
        raise SystemExit(f"FAIL {what}: param groups {mine['param_groups']}, the class's {groups}")
    print(f"ok   {what}: the class's tensors, param groups and group steps "
          f"{[g.get('step') for g in mine['param_groups']]}", flush=True)


def check_class(cls, ctor, options, others, world, tmp):
    name = f"{cls.__name__} at world {world}"
    start = {n: initial(n, s) for n, s, _ in PARAMS}
    path = os.path.join(tmp, f"{cls.__name__}-{world}")

    # sx.torch: 8 steps, its state dict consolidated on rank 0 and a checkpoint, 3 more.
    def trained(rank, rendezvous):
        params = parameters(start)
        opt = sx_opt(cls, ctor, params, options, rank, world, rendezvous)
        if opt._kind != cls.__name__.lower():
            raise SystemExit(f"FAIL {name}: sx.torch runs it as {opt._kind!r}, not with sx's own kernels")
        sx_steps(opt, params, range(STEPS), rank)
        at = values(params)
        opt.consolidate_state_dict(to=0)
        state = opt.state_dict() if rank == 0 else None
        opt.save(path, synchronous=True)
        sx_steps(opt, params, range(STEPS, STEPS + MORE), rank)
        after = values(params)
        opt.close()
        return at, state, after

    ranks = run_ranks(world, trained)
    params = parameters(start)
    ref = cls(grouped(params, options), **ctor)
    torch_steps(ref, params, range(STEPS), world)
    for rank, (at, _, _) in enumerate(ranks):
        expect_close(at, values(params), f"{name}, rank {rank}, over {STEPS} steps against the class")
    at, mine, after = ranks[0]
    check_state_dict(mine, ref.state_dict(), f"{name}: sx's state_dict()")

    # sx's state dict into the class, which goes on as sx did.
    continued = parameters(at)
    plain = cls(grouped(continued, others), **ctor)
    plain.load_state_dict(mine)
    torch_steps(plain, continued, range(STEPS, STEPS + MORE), world)
    expect_close(values(continued), after, f"{name}: sx's state_dict() continued by the class")

    # The class's state dict, and sx's checkpoint, into sx.torch made with other options:
    # both go on as the class does.
    theirs = copy.deepcopy(ref.state_dict())  # the class's steps below change its tensors in place
    theirs_at = values(params)
    torch_steps(ref, params, range(STEPS, STEPS + MORE), world)

    def resumed(rank, rendezvous, how):
        state = parameters(theirs_at)  # a checkpoint brings its own values
        opt = sx_opt(cls, ctor, state, others, rank, world, rendezvous)
        if how == "state_dict":
            opt.load_state_dict(theirs)
        else:
            opt.load(path)
        saved = [{k: v for k, v in g.items() if k not in ("params", "step", "param_names")}
                 for g in theirs["param_groups"]]
        have = [{k: g[k] for k in s} for g, s in zip(opt.param_groups, saved)]
        if have != saved:
            raise SystemExit(f"FAIL {name}: after {how}, param groups {have}; {saved} saved")
        # The groups' step counts too, the frozen group's (ahead of its params') included.
        steps, want = [g.get("step") for g in opt.param_groups], [g.get("step") for g in theirs["param_groups"]]
        if steps != want:
            raise SystemExit(f"FAIL {name}: after {how}, the param groups' steps are {steps}; {want} saved")
        sx_steps(opt, state, range(STEPS, STEPS + MORE), rank)
        opt.close()
        return values(state)

    for how, what in (("state_dict", "the class's state_dict() continued in sx.torch"),
                      ("checkpoint", "sx's checkpoint continued in an sx.torch made with other options")):
        for rank, got in enumerate(run_ranks(world, resumed, how)):
            expect_close(got, values(params), f"{name}, rank {rank}: {what}")


def expect_refused(cls, needle, what, ctor=None, group=None):
    params = parameters({n: initial(n, s) for n, s, _ in PARAMS})
    options = [dict(lr=0.01), dict(lr=0.01, **(group or {}))]
    try:
        sx_opt(cls, ctor or {}, params, options, 0, 1, f"local://refused-{next(_names)}").close()
    except UnsupportedError as e:
        if needle not in str(e) or "sx runs" not in str(e):
            raise SystemExit(f"FAIL {what}: UnsupportedError without '{needle}': {e}")
        print(f"ok   {what}: {e}", flush=True)
        return
    raise SystemExit(f"FAIL {what}: not refused")


def check_refusals():
    for key, value in (("fixed_decay", True), ("rectify", True), ("adam", True), ("grad_averaging", False),
                       ("pre_norm", True), ("adam_debias", True), ("adanorm", True)):
        expect_refused(Lamb, f"{key}={value}", f"Lamb({key}={value})", ctor={key: value})
    expect_refused(Lamb, "rectify=True", "a Lamb param group with rectify=True", group={"rectify": True})
    for key in ("fixed_decay", "cautious", "stable_adamw"):
        expect_refused(AdEMAMix, f"{key}=True", f"AdEMAMix({key}=True)", ctor={key: True})
    expect_refused(AdEMAMix, "cautious=True", "an AdEMAMix param group with cautious=True", group={"cautious": True})


def main():
    check_refusals()
    with tempfile.TemporaryDirectory() as tmp:
        for cls, ctor, options, others in CONFIGS:
            for world in (1, 2):
                check_class(cls, ctor, options, others, world, tmp)
    print("Lamb and AdEMAMix through sx.torch agree with pytorch-optimizer's")


if __name__ == "__main__":
    main()
