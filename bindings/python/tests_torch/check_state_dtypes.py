"""Optimizer state in 8 bits and in bf16 (add_param_group's state_dtype), against the
libraries it follows, with ranks as threads over local:// at worlds 1 to 3 and stages 1
to 3:

- 8-bit AdamW and Adam (with amsgrad) against torchao's AdamW8bit and Adam8bit (0.18.0,
  whose step torch.compile builds for the CPU): after every run the params are equal
  bit for bit, for params that torchao quantizes (a whole number of 256-element blocks,
  at least 4096 elements; one of them split unevenly between ranks) and for one it
  leaves in fp32 (300 elements). Each step's gradient of a param lives on rank 0 alone
  (the other ranks' are zero), so that sx's sum over ranks is that gradient exactly,
  and torchao is given it times fp32(1 / world), as sx scales it. The same on HSDP meshes
  of 2 x 2 and 2 x 3 ranks.
- bf16 moments (Adam, Lion, SGD with momentum, RMSprop, Adagrad) against the torch
  optimizers (single-tensor loops) whose state is rounded to bf16 after every step, to
  within TOL_BF16 normwise, and at least ten times closer to it than to torch's run of
  fp32 state (so the state was bf16 indeed).

- sx.torch with torchao's AdamW8bit as its optimizer class, in one process, bit for bit
  torchao's own on a copy of the model; its state dicts against torchao's, both ways.

Run with the Python of a torch environment that has torchao, SX_LIBRARY pointing at
libsx and PYTHONPATH at the binding (run_torch_tests.py does); exits non-zero on the
first difference."""
import copy
import os
import sys

import numpy as np
import torch

import sx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _ranks import run_ranks  # noqa: E402

STEPS = 12
# name, shape, unit: "w" and "v" are quantized (32 and 17 blocks: at 2 and 3 ranks a
# shard boundary falls inside them), "b" is too small and keeps fp32 state.
PARAMS = [("w", (64, 128), 0), ("b", (300,), 0), ("v", (17, 256), 1)]
TOL_BF16 = 1e-6


def initial(name, shape):
    return np.random.default_rng(sum(map(ord, name))).uniform(-1, 1, size=shape).astype(np.float32)


def grad_of(name, shape, step):
    seed = 1000 * step + sum(map(ord, name))
    return (np.random.default_rng(seed).standard_normal(size=shape) * 0.1).astype(np.float32)


def run_sx(kind, options, world, stage, shard_size=0, steps=STEPS, grad=None, history=False):
    """Every rank's params after `steps` steps (with `history`, after each step, a list).
    Each step's gradient of a param is rank 0's alone (the others' are zero):
    grad(name, shape, param, step), the param's values before the step; grad_of by
    default."""
    def params_of(g):
        out = {}
        for u in (0, 1):  # (every rank: at stage 3 a view is of a gathered unit)
            with g.unit(u):
                for name, _, unit in PARAMS:
                    if unit == u:
                        out[name] = np.array(g.param_view(name))
        return out

    def rank_main(rank, rendezvous):
        seen = []
        with sx.ShardGroup(rendezvous, rank, world, stage=stage, backend="cpu", num_threads=1,
                           timeout_ms=60000, shard_size=shard_size) as g:
            g.add_param_group(kind, **options)
            for name, shape, unit in PARAMS:
                g.add_param(name, list(shape), unit=unit, param_group=0)
            g.finalize()
            for u in (0, 1):
                with g.unit(u):
                    for name, shape, unit in PARAMS:
                        if unit == u:
                            g.param_view(name)[...] = initial(name, shape)
            for step in range(steps):
                for u in (0, 1):
                    with g.unit(u):
                        for name, shape, unit in PARAMS:
                            if unit != u:
                                continue
                            if rank != 0:
                                g.grad_view(name)[...] = 0.0
                            elif grad is None:
                                g.grad_view(name)[...] = grad_of(name, shape, step)
                            else:
                                g.grad_view(name)[...] = grad(name, shape, np.array(g.param_view(name)), step)
                g.step()
                if history:
                    seen.append(params_of(g))
            return seen if history else params_of(g)

    return run_ranks(world, rank_main)


def run_reference(make, world, after_step=None):
    params = {name: torch.nn.Parameter(torch.from_numpy(initial(name, shape))) for name, shape, _ in PARAMS}
    opt = make(list(params.values()))
    scale = np.float32(1.0 / world)
    for step in range(STEPS):
        for name, shape, _ in PARAMS:
            params[name].grad = torch.from_numpy(grad_of(name, shape, step) * scale)
        opt.step()
        if after_step:
            after_step(opt)
    return {name: p.detach().numpy() for name, p in params.items()}


def round_state_to_bf16(opt):
    for state in opt.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.dtype == torch.float32 and value.dim() > 0:
                value.copy_(value.bfloat16().float())


def check_8bit():
    from torchao.optim import Adam8bit, AdamW8bit
    configs = [("adamw", dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95)), AdamW8bit),
               ("adam", dict(lr=3e-3, weight_decay=0.01), Adam8bit)]
    for kind, options, cls in configs:
        for world in (1, 2, 3):
            want = run_reference(lambda ps: cls(ps, **options), world)
            for stage in (1, 2, 3):
                for rank, got in enumerate(run_sx(kind, dict(options, state_dtype="8bit"), world, stage)):
                    for name in want:
                        if not np.array_equal(got[name].view(np.uint32), want[name].view(np.uint32)):
                            bad = int(np.sum(got[name].view(np.uint32) != want[name].view(np.uint32)))
                            sys.exit(f"FAIL 8-bit {kind} {options} world {world} stage {stage} rank {rank}: "
                                     f"{bad} of param {name}'s elements differ from torchao's {cls.__name__}")
                print(f"ok   8-bit {kind:5s} world {world} stage {stage}: bit for bit torchao's {cls.__name__}",
                      flush=True)
        # HSDP meshes: 2 x 2 and 2 x 3 (shard groups of 2 and 3, replicated).
        for world, shard_size in ((4, 2), (6, 3)):
            want = run_reference(lambda ps: cls(ps, **options), world)
            for rank, got in enumerate(run_sx(kind, dict(options, state_dtype="8bit"), world, 2, shard_size)):
                for name in want:
                    if not np.array_equal(got[name].view(np.uint32), want[name].view(np.uint32)):
                        sys.exit(f"FAIL 8-bit {kind} mesh {world // shard_size} x {shard_size} rank {rank}: param "
                                 f"{name} differs from torchao's {cls.__name__}")
            print(f"ok   8-bit {kind:5s} mesh {world // shard_size} x {shard_size}: bit for bit torchao's "
                  f"{cls.__name__}", flush=True)


def check_bf16():
    configs = [("adam", dict(lr=1e-2, weight_decay=0.01), lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.01,
                                                                                     foreach=False)),
               ("sgd", dict(lr=1e-2, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9,
                                                                              foreach=False)),
               ("rmsprop", dict(lr=1e-3, centered=True, momentum=0.5),
                lambda ps: torch.optim.RMSprop(ps, lr=1e-3, centered=True, momentum=0.5, foreach=False)),
               ("adagrad", dict(lr=1e-2), lambda ps: torch.optim.Adagrad(ps, lr=1e-2, foreach=False))]
    for kind, options, make in configs:
        for world in (1, 3):
            want = run_reference(make, world, round_state_to_bf16)
            fp32 = run_reference(make, world)
            for stage in (1, 3):
                got = run_sx(kind, dict(options, state_dtype="bf16"), world, stage)[0]
                err, err_fp32 = normwise(got, want), normwise(got, fp32)
                if not (err <= TOL_BF16 and err * 10 <= err_fp32):
                    sys.exit(f"FAIL bf16 {kind} world {world} stage {stage}: normwise relative error {err:.3g} "
                             f"against torch's with its state rounded to bf16, {err_fp32:.3g} against its fp32 state")
                print(f"ok   bf16  {kind:7s} world {world} stage {stage}: error {err:.2e} "
                      f"({err_fp32:.2e} against fp32 state)", flush=True)


def normwise(got, want):
    diff = np.sqrt(sum(np.sum((got[n].astype(np.float64) - want[n]) ** 2) for n in want))
    return diff / np.sqrt(sum(np.sum(want[n].astype(np.float64) ** 2) for n in want))


def check_sx_torch():
    """sx.torch with torchao's AdamW8bit as its class, one process, against AdamW8bit on a
    copy of the model: the params equal bit for bit after every step (a 64 x 128 weight in
    8-bit blocks, its bias in fp32); a block_size torchao allows but sx does not take is
    refused, and so is state_dtype on a class run through a custom optimizer."""
    import sx.torch
    from sx.errors import InvalidArgumentError, UnsupportedError
    from torchao.optim import AdamW8bit
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ref_model = copy.deepcopy(model)
    opt = sx.torch.ShardedOptimizer(model, AdamW8bit, rendezvous="local://state-dtype-torch", rank=0, world_size=1,
                                    lr=1e-2, weight_decay=0.1)
    ref = AdamW8bit(ref_model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 128, generator=g), torch.randn(16, 4, generator=g)
        for m, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
            if not torch.equal(p.detach().view(torch.int32), q.detach().view(torch.int32)):
                sys.exit(f"FAIL sx.torch with AdamW8bit: {name} differs from torchao's after step {step + 1}")
    opt.close()
    # block_size sx does not take; bf16_stochastic_round on an fp32 model (its params must
    # be bf16) or through param_dtype (whose fp32 values would seed masters).
    for bad, what, error in ((dict(block_size=128), "block_size", UnsupportedError),
                             (dict(bf16_stochastic_round=True), "bf16_stochastic_round", InvalidArgumentError),
                             (dict(bf16_stochastic_round=True, param_dtype=torch.bfloat16), "param_dtype",
                              UnsupportedError)):
        try:
            sx.torch.ShardedOptimizer(torch.nn.Linear(4, 4), AdamW8bit, rendezvous="local://state-dtype-bad",
                                      rank=0, world_size=1, **bad)
            sys.exit(f"FAIL sx.torch took AdamW8bit with {bad}")
        except error as e:
            if what not in str(e):
                sys.exit(f"FAIL sx.torch refused {bad} without naming {what}: {e}")
    check_sx_torch_stochastic_round()
    print(f"ok   sx.torch with torchao's AdamW8bit: bit for bit over {STEPS} steps; block_size=128, "
          "bf16_stochastic_round=True on fp32 params and with param_dtype refused; a bf16 model with "
          "bf16_stochastic_round=True keeps no masters and learns", flush=True)


def check_sx_torch_stochastic_round():
    """sx.torch with AdamW8bit(bf16_stochastic_round=True) on a bf16 model: the group takes the
    option, its optimizer bytes are the 8-bit moments' alone (no fp32 masters), and the loss
    falls as torchao's own does on a copy (within a tenth of torchao's decrease: the random
    bits differ, check_stochastic_round.py compares the two as samples)."""
    import sx.torch
    from torchao.optim import AdamW8bit
    torch.manual_seed(1)
    model = torch.nn.Linear(256, 64, bias=False).to(torch.bfloat16)  # 16384 elements: 64 blocks
    ref_model = copy.deepcopy(model)
    opt = sx.torch.ShardedOptimizer(model, AdamW8bit, rendezvous="local://state-dtype-torch-sr", rank=0,
                                    world_size=1, lr=1e-3, bf16_stochastic_round=True)
    ref = AdamW8bit(ref_model.parameters(), lr=1e-3, bf16_stochastic_round=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    y = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    losses = {}
    for m, o in ((model, opt), (ref_model, ref)):
        first = None
        for step in range(60):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x).float(), y.float())
            loss.backward()
            o.step()
            first = float(loss.detach()) if first is None else first
        losses[o is opt] = (first, float(torch.nn.functional.mse_loss(m(x).float(), y.float()).detach()))
    if opt.group.get_hyperparameter(0, "bf16_stochastic_round") != 1.0:
        sys.exit("FAIL sx.torch did not pass bf16_stochastic_round to sx")
    if opt.group.memory_stats().optimizer_bytes != 2 * (16384 + 64 * 4):
        sys.exit(f"FAIL sx.torch with bf16_stochastic_round: optimizer bytes "
                 f"{opt.group.memory_stats().optimizer_bytes}, not the 8-bit moments' {2 * (16384 + 64 * 4)}")
    (sx_first, sx_last), (ao_first, ao_last) = losses[True], losses[False]
    if sx_first != ao_first or abs(sx_last - ao_last) > 0.1 * (ao_first - ao_last):
        sys.exit(f"FAIL sx.torch with bf16_stochastic_round: loss {sx_first:.5f} -> {sx_last:.5f}, torchao's "
                 f"{ao_first:.5f} -> {ao_last:.5f}")
    opt.close()


def _train(model, opt, steps, first=0):
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 128, generator=g), torch.randn(16, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def _copied(sd):
    """A state dict's copy (torchao's OptimState8bit has no deepcopy: its parts are copied)."""
    from torchao.optim.subclass_8bit import OptimState8bit

    def copy_of(v):
        if isinstance(v, OptimState8bit):
            return OptimState8bit(v.codes.clone(), v.scale.clone(), v.qmap.clone(), v.signed, dtype=v.dtype)
        return v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return {"state": {i: {k: copy_of(v) for k, v in e.items()} for i, e in sd["state"].items()},
            "param_groups": [{k: copy_of(v) for k, v in g.items()} for g in sd["param_groups"]]}


def _same_state(what, mine, theirs):
    """Two state dicts' "state" entries, the same bytes: torchao's OptimState8bit by codes
    and scale, other tensors bit for bit."""
    from torchao.optim.subclass_8bit import OptimState8bit
    if sorted(mine) != sorted(theirs):
        sys.exit(f"FAIL {what}: params {sorted(mine)} and {sorted(theirs)}")
    for i in mine:
        for name in set(mine[i]) | set(theirs[i]):
            a, b = mine[i].get(name), theirs[i].get(name)
            if isinstance(a, OptimState8bit) != isinstance(b, OptimState8bit):
                sys.exit(f"FAIL {what}: param {i} {name}: {type(a).__name__} and {type(b).__name__}")
            if isinstance(a, OptimState8bit):
                same = _same_bits(a.codes, b.codes) and _same_bits(a.scale, b.scale) and a.signed == b.signed
            else:
                same = a is not None and b is not None and _same_bits(a.detach().float(), b.detach().float())
            if not same:
                sys.exit(f"FAIL {what}: param {i} {name} differs")


def _state_dicts_both_ways(cls, options, base, tag):
    """torchao's `cls` trained 3 steps, its state dict loaded into sx.torch, one more step
    each; then sx.torch trained 3 steps, its state dict loaded into a fresh `cls`, one more
    step each: params, codes and scales bit for bit."""
    import sx.torch
    from torchao.optim.subclass_8bit import OptimState8bit
    what = f"{cls.__name__}{options}"
    ref_model, model = copy.deepcopy(base), copy.deepcopy(base)
    ref = cls(ref_model.parameters(), **options)
    _train(ref_model, ref, 3)
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref_model.parameters()):
            p.copy_(q)
    opt = sx.torch.ShardedOptimizer(model, cls, rendezvous=f"local://state-dtype-sd-in-{tag}", rank=0,
                                    world_size=1, **options)
    opt.load_state_dict(_copied(ref.state_dict()))
    _same_state(f"{what}'s state dict loaded into sx.torch, then state_dict()", opt.state_dict()["state"],
                ref.state_dict()["state"])
    _train(ref_model, ref, 1, first=3)
    _train(model, opt, 1, first=3)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        if not _same_bits(p.detach(), q.detach()):
            sys.exit(f"FAIL {what}'s state dict loaded into sx.torch: {name} differs after one more step")
    mine = opt.state_dict()["state"]
    _same_state(f"{what}: one step after the load", mine, ref.state_dict()["state"])
    # sx.torch's OptimState8bit holds sx's own codes and scales; the bias keeps fp32.
    for slot in [k for k in mine[0] if k != "step"]:
        q = mine[0][slot]
        if not isinstance(q, OptimState8bit) or isinstance(mine[1][slot], OptimState8bit):
            sys.exit(f"FAIL {what}: the weight's {slot} is not an OptimState8bit, or the bias's is")
        if not (np.array_equal(q.codes.reshape(-1).numpy(), opt.group.state_view(0, slot)) and
                np.array_equal(q.scale.numpy(), opt.group.state_view(0, slot + ".scale"))):
            sys.exit(f"FAIL {what}: sx.torch's OptimState8bit {slot} does not hold sx's codes and scales")
    opt.close()

    model, ref_model = copy.deepcopy(base), copy.deepcopy(base)
    opt = sx.torch.ShardedOptimizer(model, cls, rendezvous=f"local://state-dtype-sd-out-{tag}", rank=0,
                                    world_size=1, **options)
    _train(model, opt, 3)
    with torch.no_grad():
        for p, q in zip(ref_model.parameters(), model.parameters()):
            p.copy_(q)
    ref = cls(ref_model.parameters(), **options)
    ref.load_state_dict(_copied(opt.state_dict()))
    _same_state(f"sx.torch's state dict loaded into {what}", ref.state_dict()["state"], opt.state_dict()["state"])
    _train(ref_model, ref, 1, first=3)
    _train(model, opt, 1, first=3)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        if not _same_bits(p.detach(), q.detach()):
            sys.exit(f"FAIL sx.torch's state dict loaded into {what}: {name} differs after one more step")
    _same_state(f"one step after the load into {what}", opt.state_dict()["state"], ref.state_dict()["state"])
    opt.close()


def check_sx_torch_state_dicts():
    """sx.torch's state_dict and load_state_dict of packed state against the live peer,
    torchao's AdamW8bit and Adam8bit (torchao 0.18 cannot step amsgrad), both ways
    (_state_dicts_both_ways); sx.torch's OptimState8bit holds sx's own codes and scales
    (its state views). A bf16 group's state dict holds its bf16 bits, and loading it back
    changes nothing."""
    import sx.torch
    from torchao.optim import Adam8bit, AdamW8bit
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    options = dict(lr=1e-2, weight_decay=0.1)
    _state_dicts_both_ways(AdamW8bit, options, base, "adamw")
    _state_dicts_both_ways(Adam8bit, dict(lr=1e-2, betas=(0.8, 0.99)), base, "adam")

    # bf16 state: bf16 tensors, sx's bits; loading them back changes nothing.
    model = copy.deepcopy(base)
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, rendezvous="local://state-dtype-sd-bf16", rank=0,
                                    world_size=1, state_dtype="bf16", **options)
    _train(model, opt, 2)
    sd = opt.state_dict()
    t = sd["state"][0]["exp_avg_sq"]
    if t.dtype != torch.bfloat16 or not np.array_equal(t.reshape(-1).view(torch.int16).numpy().view(np.uint16),
                                                      opt.group.state_view(0, "exp_avg_sq")):
        sys.exit(f"FAIL a bf16 group's state dict: exp_avg_sq is {t.dtype}, or not sx's bits")
    before = np.array(opt.group.state_view(0, "exp_avg"))
    opt.load_state_dict(_copied(sd))
    if not np.array_equal(before, opt.group.state_view(0, "exp_avg")):
        sys.exit("FAIL a bf16 group's state dict loaded back changed its state")
    opt.close()
    print("ok   sx.torch's state dicts of 8-bit and bf16 state: torchao's AdamW8bit's and Adam8bit's "
          "loaded into sx.torch and sx.torch's into them, one more step each bit for bit (params, codes, scales); "
          "bf16 as sx's bits", flush=True)


def main():
    check_8bit()
    check_bf16()
    check_sx_torch()
    check_sx_torch_state_dicts()


if __name__ == "__main__":
    main()
