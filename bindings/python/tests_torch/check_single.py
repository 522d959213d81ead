"""sx.torch in one process, against torch.optim on a copy of the same model: what a
trainer migrating from torch does besides the plain loop (param groups added while
training, params frozen and unfrozen, params a step does not reach, state dicts taken
again after more steps or loaded with other hyperparameters) and what it must be told
clearly (params sx cannot hold, copies of the optimizer). Run directly, not under
torchrun; exits non-zero on the first difference."""
import copy
import itertools
import pickle

import torch

import sx.torch
from sx.errors import UnsupportedError

_names = itertools.count()
TOL = 1e-6


def sx_opt(params, cls=torch.optim.AdamW, **kw):
    return sx.torch.ShardedOptimizer(params, cls, rendezvous=f"local://single-{next(_names)}", rank=0,
                                     world_size=1, **kw)


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def data(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


def loss_of(model, i):
    x, y = data(i)
    return torch.nn.functional.mse_loss(model(x), y)


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def expect_close(a, b, what):
    d = max_diff(a, b)
    if not d <= TOL:
        raise SystemExit(f"FAIL {what}: params differ from torch's by {d}")
    print(f"ok   {what} (max difference {d:.2e})")


def expect_raises(kind, needle, fn, what):
    try:
        fn()
    except kind as e:
        if needle not in str(e):
            raise SystemExit(f"FAIL {what}: {kind.__name__} without '{needle}': {e}")
        print(f"ok   {what}: {e}")
        return
    raise SystemExit(f"FAIL {what}: no {kind.__name__}")


def train(model, opt, steps, first=0, every=None):
    for i in range(first, first + steps):
        opt.zero_grad()
        (every(model, i) if every else loss_of(model, i)).backward()
        opt.step()


def check_param_group_added_while_training():
    a, b = net(), net()
    ta = torch.optim.AdamW(list(a[0].parameters()), lr=1e-2)
    sa = sx_opt(list(b[0].parameters()), lr=1e-2)  # the default bucket: one unit for all
    train(a, ta, 3)
    train(b, sa, 3)
    ta.add_param_group({"params": list(a[2].parameters()), "lr": 5e-3, "weight_decay": 0.3})
    sa.add_param_group({"params": list(b[2].parameters()), "lr": 5e-3, "weight_decay": 0.3})
    train(a, ta, 3, first=3)
    train(b, sa, 3, first=3)
    expect_close(a, b, "a param group added after 3 steps, then 3 more")


def check_failed_param_group_changes_nothing():
    a, b = net(), net()
    ta = torch.optim.AdamW(list(a[0].parameters()), lr=1e-2)
    sa = sx_opt(list(b[0].parameters()), lr=1e-2)
    bad = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    expect_raises(UnsupportedError, "float64", lambda: sa.add_param_group({"params": [bad]}), "a float64 param")
    expect_raises(Exception, "lrr", lambda: sa.add_param_group({"params": list(b[2].parameters()), "lrr": 1}),
                  "a misspelt key")
    empty = torch.nn.Parameter(torch.zeros(0, 5))
    expect_raises(UnsupportedError, "(0, 5)", lambda: sa.add_param_group({"params": [empty]}), "a param of 0 elements")
    assert len(sa.param_groups) == 1, sa.param_groups
    train(a, ta, 3)
    train(b, sa, 3)
    expect_close(a, b, "steps after three refused param groups")


def check_unfrozen_later():
    a, b = net(), net()
    for m in (a, b):
        for p in m.parameters():
            p.requires_grad_(False)
    ta = torch.optim.SGD(a.parameters(), lr=0.1)
    sa = sx_opt(b, torch.optim.SGD, lr=0.1)
    for m in (a, b):
        m[2].weight.requires_grad_(True)
    for i in range(3):  # a discarded backward each time: zero_grad must clear it
        for m, o in ((a, ta), (b, sa)):
            o.zero_grad()
            loss_of(m, 50 + i).backward()
            o.zero_grad()
            loss_of(m, i).backward()
            o.step()
    expect_close(a, b, "params frozen at construction, one unfrozen later, a backward discarded")


def check_unreached_params_are_skipped():
    def branchy(m, i):
        x, y = data(i)
        h = m[0](x)
        if i < 2:
            h = h + 0.5 * m[1](h)  # the extra branch takes part only in the first two steps
        return torch.nn.functional.mse_loss(m[2](torch.tanh(h)), y)

    def build():
        torch.manual_seed(1)
        return torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 2)])

    a, b = build(), build()
    ta = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    sa = sx_opt(b, lr=1e-2, weight_decay=0.1)
    train(a, ta, 6, every=branchy)
    train(b, sa, 6, every=branchy)
    expect_close(a, b, "a branch the backward stops reaching (torch skips its params)")
    ta.zero_grad()
    sa.zero_grad()
    ta.step()
    sa.step()
    expect_close(a, b, "a step with no backward since zero_grad (nothing moves)")


def check_state_dict_follows_steps():
    b = net()
    sa = sx_opt(b, lr=1e-2)
    train(b, sa, 3)
    first = sa.state_dict()
    train(b, sa, 4, first=3)
    sa.param_groups[0]["lr"] = 0.5
    again = sa.state_dict()
    step = again["state"][0]["step"].item()
    if step != 7 or again["param_groups"][0]["lr"] != 0.5 or first["state"][0]["step"].item() != 3:
        raise SystemExit(f"FAIL state_dict after more steps: step {step}, lr {again['param_groups'][0]['lr']}")
    print("ok   state_dict() taken again after more steps has their step count and lr")


def check_loaded_hyperparameters():
    for cls, theirs, mine in ((torch.optim.SGD, dict(lr=1e-2, momentum=0.9), dict(lr=0.5)),
                              (torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True), dict(lr=0.5)),
                              (torch.optim.Adam, dict(lr=1e-2, amsgrad=True), dict(lr=1e-3))):
        a, b = net(), net()
        ta = cls(a.parameters(), **theirs)
        train(a, ta, 4)
        b.load_state_dict(a.state_dict())
        sa = sx_opt(b, cls, **mine)  # other hyperparameters: the dict's must win
        sa.load_state_dict(ta.state_dict())
        train(a, ta, 3, first=4)
        train(b, sa, 3, first=4)
        expect_close(a, b, f"{cls.__name__}{theirs} loaded into one made with {mine}")


def check_no_copies():
    sa = sx_opt(net(), lr=1e-2)
    expect_raises(TypeError, "cannot be pickled or copied", lambda: pickle.dumps(sa), "pickle")
    expect_raises(TypeError, "cannot be pickled or copied", lambda: copy.deepcopy(sa), "deepcopy")


def check_overlap_with_frozen_param():
    a, b = net(), net()
    for m in (a, b):
        m[0].weight.requires_grad_(False)
    ta = torch.optim.AdamW([p for p in a.parameters() if p.requires_grad], lr=1e-2)
    sa = sx_opt(b, lr=1e-2, overlap=True, bucket_mb=1 / 4096)
    train(a, ta, 3)
    train(b, sa, 3)
    expect_close(a, b, "overlap with a frozen param")


# Every other class sx runs with its own kernels, with options that change the maths.
OTHER_CLASSES = [(torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
                 (torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True)),
                 (torch.optim.Adamax, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01)),
                 (torch.optim.NAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True)),
                 (torch.optim.RAdam, dict(lr=0.01, weight_decay=0.01)),
                 # run by the class itself on sx's shards (sx has no kernel for them)
                 (torch.optim.Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.01, maximize=True)),
                 (torch.optim.Rprop, dict(lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 1.0)))]
try:
    from lion_pytorch import Lion
    OTHER_CLASSES.append((Lion, dict(lr=1e-3, weight_decay=0.1)))
except ImportError:
    Lion = None


def check_every_class():
    for cls, kw in OTHER_CLASSES:
        a, b = net(), net()
        ta, sa = cls(a.parameters(), **kw), sx_opt(b, cls, **kw)
        train(a, ta, 15)
        train(b, sa, 15)
        expect_close(a, b, f"{cls.__name__} over 15 steps")
        # Its consolidated state loads into torch's class, which goes on as sx does.
        c = net()
        c.load_state_dict(b.state_dict())
        tc = cls(c.parameters(), **kw)
        tc.load_state_dict(sa.state_dict())
        train(c, tc, 5, first=15)
        train(b, sa, 5, first=15)
        expect_close(c, b, f"{cls.__name__}: sx's state_dict() continued in torch")
        # And torch's state loads into sx, which goes on as torch does.
        d = net()
        d.load_state_dict(a.state_dict())
        sd = sx_opt(d, cls, **kw)
        sd.load_state_dict(ta.state_dict())
        train(a, ta, 5, first=15)
        train(d, sd, 5, first=15)
        expect_close(a, d, f"{cls.__name__}: torch's state_dict() continued in sx")
    # Adafactor and Muon sx runs itself; LBFGS's line search it does not.
    expect_raises(UnsupportedError, "needs each param whole", lambda: sx_opt(net(), torch.optim.LBFGS),
                  "torch.optim.LBFGS")
    expect_raises(UnsupportedError, "keeps per-param state sx cannot shard by elements (eta, mu)",
                  lambda: sx_opt(net(), torch.optim.ASGD), "torch.optim.ASGD")


def check_muon():
    """torch.optim.Muon on a model of matrices: within bf16's rounding of its
    Newton-Schulz updates (2^-8 of how far the params moved), its state dicts both ways."""
    def mats(seed=0):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 2, bias=False))

    def off_by(m, ref, start):
        diff = sum(((p - q) ** 2).sum() for p, q in zip(m.parameters(), ref.parameters())).sqrt()
        moved = sum(((q - s) ** 2).sum() for q, s in zip(ref.parameters(), start.parameters())).sqrt()
        return (diff / moved).item()

    kw = dict(lr=0.02, weight_decay=0.05, ns_steps=4, adjust_lr_fn="match_rms_adamw")
    a, b, start = mats(), mats(), mats()
    ta, sa = torch.optim.Muon(a.parameters(), **kw), sx_opt(b, torch.optim.Muon, **kw)
    train(a, ta, 15)
    train(b, sa, 15)
    err = off_by(b, a, start)
    if not err <= 2.0 ** -8:
        raise SystemExit(f"FAIL Muon over 15 steps: {err:.3g} of the distance moved from torch's")
    print(f"ok   Muon over 15 steps ({err:.2e} of the distance moved from torch's)")
    c = mats()
    c.load_state_dict(b.state_dict())
    tc = torch.optim.Muon(c.parameters(), **kw)
    tc.load_state_dict(sa.state_dict())
    before = copy.deepcopy(b)
    train(c, tc, 5, first=15)
    train(b, sa, 5, first=15)
    err = off_by(c, b, before)
    if not err <= 2.0 ** -8:
        raise SystemExit(f"FAIL Muon: sx's state_dict() continued in torch: {err:.3g} of the distance moved")
    print(f"ok   Muon: sx's state_dict() continued in torch ({err:.2e} of the distance moved)")
    expect_raises(sx.errors.InvalidArgumentError, "Muon orthogonalises 2-D params only",
                  lambda: sx_opt(net(), torch.optim.Muon), "torch.optim.Muon over a model with biases")


def check_adafactor():
    """torch.optim.Adafactor on a matrix, a stack of matrices, a vector and a scalar: sx's
    state_dict() is torch's (row_var [..., R, 1], col_var [..., 1, C], a param-shaped
    variance, a float32 step), and each loads the other's, which goes on as it does."""
    kw = dict(lr=0.01, weight_decay=0.01)

    def params(seed=0):
        torch.manual_seed(seed)
        return [(n, torch.nn.Parameter(torch.randn(shape)))
                for n, shape in (("m", (6, 5)), ("t", (2, 3, 4)), ("v", (5,)), ("s", ()))]

    def step(named, opt, i):
        g = torch.Generator().manual_seed(200 + i)
        opt.zero_grad()
        sum(((p - torch.randn(p.shape, generator=g)) ** 2).sum() for _, p in named).backward()
        opt.step()

    def close(a, b, what):
        d = max((p - q).abs().max().item() for (_, p), (_, q) in zip(a, b))
        if not d <= TOL:
            raise SystemExit(f"FAIL {what}: params differ by {d}")
        print(f"ok   {what} (max difference {d:.2e})")

    a, b = params(), params()
    ta, sa = torch.optim.Adafactor([p for _, p in a], **kw), sx_opt(b, torch.optim.Adafactor, **kw)
    for i in range(6):
        step(a, ta, i)
        step(b, sa, i)
    close(a, b, "Adafactor over 6 steps")
    mine, theirs = sa.state_dict(), ta.state_dict()
    if sorted(mine["state"]) != sorted(theirs["state"]):
        raise SystemExit(f"FAIL Adafactor state_dict: params {sorted(mine['state'])}, torch's {sorted(theirs['state'])}")
    for i, entry in theirs["state"].items():
        got = mine["state"][i]
        if list(got) != list(entry):
            raise SystemExit(f"FAIL Adafactor state_dict: param {i} has {list(got)}, torch's {list(entry)}")
        for key, want in entry.items():
            have = got[key]
            if have.shape != want.shape or have.dtype != want.dtype:
                raise SystemExit(f"FAIL Adafactor state_dict: param {i} {key} is {have.dtype} {list(have.shape)}, "
                                 f"torch's {want.dtype} {list(want.shape)}")
            rel = ((have - want).abs() / want.abs().clamp_min(1e-30)).max().item()
            if not rel <= TOL:
                raise SystemExit(f"FAIL Adafactor state_dict: param {i} {key} differs by {rel:.3g}, relative")
    if mine["param_groups"] != theirs["param_groups"]:
        raise SystemExit(f"FAIL Adafactor state_dict: param groups {mine['param_groups']}, torch's "
                         f"{theirs['param_groups']}")
    print("ok   Adafactor: sx's state_dict() is torch's (names, shapes, dtypes, values, param groups)")
    # Each loads the other's, and both go on as the original does.
    c, d = params(1), params(2)
    for (_, p), (_, q), (_, r) in zip(c, d, a):
        p.data.copy_(r.data)
        q.data.copy_(r.data)
    tc = torch.optim.Adafactor([p for _, p in c], **kw)
    tc.load_state_dict(mine)
    sd = sx_opt(d, torch.optim.Adafactor, lr=0.5)
    sd.load_state_dict(theirs)
    for i in range(6, 10):
        for named, opt in ((a, ta), (b, sa), (c, tc), (d, sd)):
            step(named, opt, i)
    close(c, b, "Adafactor: sx's state_dict() continued in torch")
    close(d, a, "Adafactor: torch's state_dict() continued in sx")
    # A row_var of the param's shape is not torch's: refused, naming the shape it has.
    wrong = copy.deepcopy(theirs)
    wrong["state"][0]["row_var"] = torch.ones(6, 5)
    expect_raises(ValueError, "torch keeps it in shape [6, 1]", lambda: sd.load_state_dict(wrong),
                  "an Adafactor row_var of the param's shape")


def check_placements_are_checked():
    """placements: a key that names no param, and a value that is no Split or Replicated,
    are refused naming them; a piece that does not fit is refused by sx, naming it."""
    from sx.errors import InvalidArgumentError
    model = net()
    split = sx.torch.Split((32, 8), 0, 16)
    expect_raises(InvalidArgumentError, "'0.wieght'", lambda: sx_opt(model, placements={"0.wieght": split}),
                  "a placement for no param")
    expect_raises(InvalidArgumentError, "sx.torch.Split(global_shape, dim, offset)",
                  lambda: sx_opt(model, placements={"0.weight": ((32, 8), 0, 16)}), "a tuple for a placement")
    expect_raises(InvalidArgumentError, "does not fit",
                  lambda: sx_opt(model, placements={"0.weight": sx.torch.Split((32, 8), 0, 24)}), "a piece too far")
    opt = sx_opt(model, placements={"0.weight": split, model[2].bias: sx.torch.Replicated(1, 2)})
    train(model, opt, 2)
    opt.close()


def check_openmp_threads():
    """By default sx.torch steps on torch's own OpenMP team where torch's parallel backend
    is OpenMP (this wheel's), and the params end on the bits of a step on sx's pool."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        raise SystemExit("FAIL this torch's parallel backend is not OpenMP: the check needs a wheel whose is")

    def big(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                                   torch.nn.Tanh(), torch.nn.Linear(512, 2))

    a, b = big(3), big(3)
    oa, ob = sx_opt(a, num_threads=2), sx_opt(b, num_threads=2, openmp_threads=False)
    if not oa.openmp_threads or ob.openmp_threads:
        raise SystemExit(f"FAIL openmp_threads: default {oa.openmp_threads}, asked False {ob.openmp_threads}")
    for model, opt in ((a, oa), (b, ob)):
        train(model, opt, 3)
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    if not same:
        raise SystemExit(f"FAIL openmp_threads: params differ from sx's pool's by {max_diff(a, b)}")
    print("ok   sx.torch steps on torch's OpenMP team, the same bits as on sx's pool")
    oa.close()
    ob.close()


def main():
    check_every_class()
    check_muon()
    check_adafactor()
    check_param_group_added_while_training()
    check_failed_param_group_changes_nothing()
    check_unfrozen_later()
    check_unreached_params_are_skipped()
    check_state_dict_follows_steps()
    check_loaded_hyperparameters()
    check_no_copies()
    check_overlap_with_frozen_param()
    check_placements_are_checked()
    check_openmp_threads()


if __name__ == "__main__":
    main()
