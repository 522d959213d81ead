"""sxckpt export and import against PyTorch itself, both ways.

sx to torch: two sx ranks (threads, through the Python binding) train a model whose
param names are a torch module's (AdamW with amsgrad for some params, SGD with momentum
for the others) and save; `sxckpt export --optimizer` writes the files; torch loads the
weights with load_state_dict(strict=True) and the optimizer files into torch.optim.AdamW
and torch.optim.SGD through tools/sxckpt/sxckpt_torch.py. Every tensor, step and
hyperparameter equals sx's, and one more step in torch gives what sx's next step gave.

torch to sx: torch trains the module with AdamW and SGD; sxckpt_torch.write writes the
files; `sxckpt import --world-size 3` makes a checkpoint, which `sxckpt verify` passes
and a group of 2 sx ranks loads with hyperparameters other than torch's: the values
and hyperparameters equal torch's; the group saves again, and the export of that save
holds torch's optimizer state and steps exactly; one more step in sx gives what
torch's next step gives.

Environment (set by ctest): SXCKPT, the built sxckpt; SX_LIBRARY, the built libsx;
PYTHONPATH with bindings/python and tools/sxckpt.
"""
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

import torch

import sx
import sxckpt_torch

SXCKPT = os.environ["SXCKPT"]
STEPS = 3
ADAMW = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-7, weight_decay=0.02, amsgrad=True)
SGD = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.001)
ADAMW_PARAMS = ["embed.weight", "proj.weight", "proj.bias"]
SGD_PARAMS = ["norm.weight", "norm.bias", "scale"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(40, 6)
        self.proj = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))  # a scalar


SHAPES = {name: tuple(p.shape) for name, p in Net().named_parameters()}


def make_net(seed):
    torch.manual_seed(seed)
    return Net()


def grads(step):
    """The gradients of step `step`: fixed values, the same for torch and every sx rank."""
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        g = torch.Generator().manual_seed(1000 * step + i)
        out[name] = torch.randn(shape, generator=g) * 0.1
    return out


def torch_optimizers(net):
    named = dict(net.named_parameters())
    return (torch.optim.AdamW([named[n] for n in ADAMW_PARAMS], **ADAMW),
            torch.optim.SGD([named[n] for n in SGD_PARAMS], **SGD))


def torch_step(net, optimizers, step):
    g = grads(step)
    for name, p in net.named_parameters():
        p.grad = g[name].clone()
    for opt in optimizers:
        opt.step()


def sxckpt(*args):
    r = subprocess.run([SXCKPT, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"sxckpt {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


_rendezvous = iter(range(1 << 30))


# Each other optimizer: sx's name, its class, and its options (the binding takes torch's
# keywords; they decide the state slots sx keeps, as a load needs them).
OTHERS = [
    ("adagrad", torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
    ("rmsprop", torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True)),
    ("adamax", torch.optim.Adamax, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01)),
    ("nadam", torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.005, weight_decay=0.01, decoupled_weight_decay=True)),
    ("radam", torch.optim.RAdam, dict(lr=0.01, weight_decay=0.01)),
]
if hasattr(torch.optim, "Adafactor"):  # factored moments for the matrices, a variance for the rest
    OTHERS.append(("adafactor", torch.optim.Adafactor,
                   dict(lr=0.01, beta2_decay=-0.7, eps=(1e-6, 1e-3), d=1.2, weight_decay=0.01)))
try:
    from lion_pytorch import Lion
    OTHERS.append(("lion", Lion, dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)))
except ImportError:  # scripts/test.sh installs it; elsewhere Lion goes unchecked here
    pass
try:
    from pytorch_optimizer import AdEMAMix, Lamb
    OTHERS.append(("lamb", Lamb, dict(lr=0.01, weight_decay=0.01)))
    # Its slow moment and its warmup of alpha and beta3, still under way at the export.
    OTHERS.append(("ademamix", AdEMAMix, dict(lr=0.01, weight_decay=0.01, alpha=2.0, t_alpha_beta3=7.0)))
except ImportError:  # likewise
    pass


def run_ranks(world, fn, adamw=None, sgd=None, groups=None):
    """fn(rank, group) on `world` threads, each with a finalized group of the module's
    params: an AdamW group (0) and an SGD group (1) of the given hyperparameters (the
    binding's keywords), or `groups`, a list of (optimizer, keywords, param names);
    returns rank 0's result."""
    if groups is None:
        groups = [("adamw", adamw, ADAMW_PARAMS), ("sgd", sgd, SGD_PARAMS)]
    rv = f"local://sxckpt-torch-{os.getpid()}-{next(_rendezvous)}"
    results, errors = [None] * world, []

    def body(rank):
        try:
            with sx.ShardGroup(rv, rank, world, stage=2, backend="cpu") as g:
                for kind, options, _ in groups:
                    g.add_param_group(kind, **options)
                for name, shape in SHAPES.items():
                    g.add_param(name, shape, param_group=[i for i, grp in enumerate(groups) if name in grp[2]][0])
                g.finalize()
                results[rank] = fn(rank, g)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results[0]


def sx_values(g):
    return {name: torch.tensor(g.param_view(name)) for name in SHAPES}


def set_sx_grads(g, step):
    for name, t in grads(step).items():
        g.grad_view(name)[...] = t.numpy()


def sx_hyper(g, group, keys):
    return {k: g.get_hyperparameter(group, k) for k in keys}


class TorchRoundTrip(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sx-sxckpt-torch-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def expect_equal(self, got, want, what):
        self.assertEqual(got.shape, want.shape, what)
        self.assertTrue(torch.equal(got, want), f"{what} differs: {got} vs {want}")

    def test_sx_to_torch(self):
        init = make_net(1)
        ck = self.path("ck")

        def train_and_save(rank, g):
            for name, p in init.named_parameters():
                g.param_view(name)[...] = p.detach().numpy()
            for s in range(1, STEPS + 1):
                set_sx_grads(g, s)
                g.step()
            g.save(ck, synchronous=True).wait()
            saved = sx_values(g)
            set_sx_grads(g, STEPS + 1)
            g.step()
            return saved, sx_values(g)

        saved, after = run_ranks(2, train_and_save, ADAMW, SGD)
        weights, prefix = self.path("model.safetensors"), self.path("optim")
        sxckpt("export", "--safetensors", weights, "--optimizer", prefix, ck)

        net = make_net(2)  # other values: the load must replace them all
        state = sxckpt_torch.load_weights(weights)
        self.assertEqual(list(state), [n for n, _ in net.named_parameters()])
        net.load_state_dict(state, strict=True)
        for name, p in net.named_parameters():
            self.expect_equal(p.detach(), saved[name], name)

        doc, tensors = sxckpt_torch.read_optimizer(prefix)
        self.assertEqual(doc["step"], STEPS)
        adamw = torch.optim.AdamW(sxckpt_torch.param_groups(doc, net, "AdamW"))
        sgd = torch.optim.SGD(sxckpt_torch.param_groups(doc, net, "SGD"))
        adamw.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, tensors, "AdamW"))
        sgd.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, tensors, "SGD"))
        for key, value in ADAMW.items():
            self.assertEqual(adamw.param_groups[0][key], value, key)
        for key, value in SGD.items():
            self.assertEqual(sgd.param_groups[0][key], value, key)
        named = dict(net.named_parameters())
        for name in ADAMW_PARAMS:
            st = adamw.state[named[name]]
            self.assertEqual(sorted(st), ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"])
            self.assertEqual(float(st["step"]), STEPS)
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                self.expect_equal(st[key], tensors[f"{name}.{key}"], f"{name}.{key}")
        for name in SGD_PARAMS:
            buffer = sgd.state[named[name]]["momentum_buffer"]
            self.expect_equal(buffer, tensors[f"{name}.momentum_buffer"], name)

        # torch goes on from sx's state as sx did.
        torch_step(net, (adamw, sgd), STEPS + 1)
        for name, p in net.named_parameters():
            torch.testing.assert_close(p.detach(), after[name], msg=f"{name} after one more step")

    def test_torch_to_sx(self):
        net = make_net(3)
        optimizers = torch_optimizers(net)
        for s in range(1, STEPS + 1):
            torch_step(net, optimizers, s)
        weights, prefix, ck = self.path("t.safetensors"), self.path("t-optim"), self.path("ck")
        sxckpt_torch.write(net, optimizers, weights, prefix)
        sxckpt("import", "--safetensors", weights, "--optimizer", prefix, "--world-size", "3", ck)
        self.assertIn("OK: MANIFEST, 3 files", sxckpt("verify", ck))

        resaved = self.path("resaved")

        def load(rank, g):
            g.load(ck)
            loaded = sx_values(g)
            hypers = (sx_hyper(g, 0, ("lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize")),
                      sx_hyper(g, 1, ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")))
            g.save(resaved, synchronous=True).wait()
            set_sx_grads(g, STEPS + 1)
            g.step()
            return loaded, hypers, sx_values(g)

        # Other hyperparameters than torch's, which the load replaces; but the same state
        # kinds (amsgrad, momentum), which decide what the group keeps.
        loaded, (adamw_hyper, sgd_hyper), after = run_ranks(2, load, dict(amsgrad=True), dict(momentum=0.5))
        for name, p in net.named_parameters():
            self.expect_equal(loaded[name], p.detach(), name)
        self.assertEqual(adamw_hyper, dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-7, weight_decay=0.02,
                                           amsgrad=1.0, maximize=0.0))
        self.assertEqual(sgd_hyper, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.001,
                                         nesterov=0.0, maximize=0.0))

        # The state sx loaded, as its own save holds it, is torch's.
        w2, p2 = self.path("r.safetensors"), self.path("r-optim")
        sxckpt("export", "--safetensors", w2, "--optimizer", p2, resaved)
        doc, tensors = sxckpt_torch.read_optimizer(p2)
        adamw, sgd = optimizers
        named = dict(net.named_parameters())
        self.assertEqual(doc["step"], STEPS)
        for name in ADAMW_PARAMS:
            st = adamw.state[named[name]]
            self.assertEqual(doc["state"][name]["step"], int(st["step"]))
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                self.expect_equal(tensors[f"{name}.{key}"], st[key], f"{name}.{key}")
        for name in SGD_PARAMS:
            self.assertEqual(doc["state"][name]["momentum_steps"], STEPS)
            buffer = sgd.state[named[name]]["momentum_buffer"]
            self.expect_equal(tensors[f"{name}.momentum_buffer"], buffer, name)

        # sx goes on from torch's state as torch does.
        torch_step(net, optimizers, STEPS + 1)
        for name, p in net.named_parameters():
            torch.testing.assert_close(after[name], p.detach(), msg=f"{name} after one more step")

    def test_every_optimizer_both_ways(self):
        """Each optimizer of the table beyond SGD, Adam and AdamW, alone over the module:
        sx's save exported loads into the torch class (lion-pytorch's Lion), whose next
        step gives sx's; torch's state written and imported loads into sx, whose next step
        gives torch's."""
        for kind, cls, options in OTHERS:
            with self.subTest(optimizer=cls.__name__):
                ck = self.path(f"{kind}-ck")

                def train_and_save(rank, g):
                    for name, p in make_net(1).named_parameters():
                        g.param_view(name)[...] = p.detach().numpy()
                    for s in range(1, STEPS + 1):
                        set_sx_grads(g, s)
                        g.step()
                    g.save(ck, synchronous=True).wait()
                    set_sx_grads(g, STEPS + 1)
                    g.step()
                    return sx_values(g)

                after = run_ranks(2, train_and_save, groups=[(kind, options, list(SHAPES))])
                weights, prefix = self.path(f"{kind}.safetensors"), self.path(f"{kind}-optim")
                sxckpt("export", "--safetensors", weights, "--optimizer", prefix, ck)
                net = make_net(2)
                net.load_state_dict(sxckpt_torch.load_weights(weights), strict=True)
                doc, tensors = sxckpt_torch.read_optimizer(prefix)
                opt = cls(sxckpt_torch.param_groups(doc, net, cls.__name__))
                opt.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, tensors, cls.__name__))
                for key, value in options.items():
                    self.assertEqual(opt.param_groups[0][key], value, f"{cls.__name__} {key}")
                torch_step(net, (opt,), STEPS + 1)
                for name, p in net.named_parameters():
                    torch.testing.assert_close(p.detach(), after[name], rtol=1e-6, atol=1e-7,
                                               msg=f"{cls.__name__}: {name} after one more step in torch")

                # torch to sx: torch's state, imported, steps on in sx as in torch.
                net = make_net(3)
                opt = cls(net.parameters(), **options)
                for s in range(1, STEPS + 1):
                    torch_step(net, (opt,), s)
                weights, prefix, ck = (self.path(f"{kind}-t.safetensors"), self.path(f"{kind}-t-optim"),
                                       self.path(f"{kind}-t-ck"))
                sxckpt_torch.write(net, [opt], weights, prefix, step=STEPS)
                sxckpt("import", "--safetensors", weights, "--optimizer", prefix, "--world-size", "3", ck)

                def load_and_step(rank, g):
                    g.load(ck)
                    set_sx_grads(g, STEPS + 1)
                    g.step()
                    return sx_values(g)

                after = run_ranks(2, load_and_step, groups=[(kind, options, list(SHAPES))])
                torch_step(net, (opt,), STEPS + 1)
                for name, p in net.named_parameters():
                    torch.testing.assert_close(after[name], p.detach(), rtol=1e-6, atol=1e-7,
                                               msg=f"{cls.__name__}: {name} after one more step in sx")

    def test_muon_both_ways(self):
        """Muon over the module's matrices, AdamW over the rest, as trainers pair them: sx's
        save exported loads into torch.optim.Muon and AdamW, whose next step gives sx's
        within bf16's rounding of Newton-Schulz; torch's state imported steps on in sx."""
        matrices = [n for n, s in SHAPES.items() if len(s) == 2]
        rest = [n for n in SHAPES if n not in matrices]
        muon = dict(lr=0.02, weight_decay=0.05, momentum=0.9, ns_steps=4, adjust_lr_fn="match_rms_adamw")
        groups = [("muon", muon, matrices), ("adamw", ADAMW, rest)]

        def torch_pair(net):
            named = dict(net.named_parameters())
            return (torch.optim.Muon([named[n] for n in matrices], **muon),
                    torch.optim.AdamW([named[n] for n in rest], **ADAMW))

        def close(got, want, what):
            for name in SHAPES:  # bf16's unit roundoff of the step's change, at most
                moved = (want[name] - got[name]).abs().max().item()
                self.assertLessEqual(moved, 2.0 ** -8 * 0.02 * 2 + 1e-6, f"{what}: {name}")

        ck = self.path("muon-ck")

        def train_and_save(rank, g):
            for name, p in make_net(1).named_parameters():
                g.param_view(name)[...] = p.detach().numpy()
            for s in range(1, STEPS + 1):
                set_sx_grads(g, s)
                g.step()
            g.save(ck, synchronous=True).wait()
            set_sx_grads(g, STEPS + 1)
            g.step()
            return sx_values(g)

        after = run_ranks(2, train_and_save, groups=groups)
        weights, prefix = self.path("muon.safetensors"), self.path("muon-optim")
        sxckpt("export", "--safetensors", weights, "--optimizer", prefix, ck)
        net = make_net(2)
        net.load_state_dict(sxckpt_torch.load_weights(weights), strict=True)
        doc, tensors = sxckpt_torch.read_optimizer(prefix)
        m = torch.optim.Muon(sxckpt_torch.param_groups(doc, net, "Muon"))
        a = torch.optim.AdamW(sxckpt_torch.param_groups(doc, net, "AdamW"))
        m.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, tensors, "Muon"))
        a.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, tensors, "AdamW"))
        self.assertEqual(m.param_groups[0]["ns_steps"], 4)
        self.assertEqual(m.param_groups[0]["adjust_lr_fn"], "match_rms_adamw")
        torch_step(net, (m, a), STEPS + 1)
        close({n: p.detach() for n, p in net.named_parameters()}, after, "sx's state in torch")

        net = make_net(3)
        m, a = torch_pair(net)
        for s in range(1, STEPS + 1):
            torch_step(net, (m, a), s)
        weights, prefix, ck = self.path("muon-t.safetensors"), self.path("muon-t-optim"), self.path("muon-t-ck")
        sxckpt_torch.write(net, [m, a], weights, prefix, step=STEPS)
        sxckpt("import", "--safetensors", weights, "--optimizer", prefix, "--world-size", "3", ck)

        def load_and_step(rank, g):
            g.load(ck)
            set_sx_grads(g, STEPS + 1)
            g.step()
            return sx_values(g)

        after = run_ranks(2, load_and_step, groups=groups)
        torch_step(net, (m, a), STEPS + 1)
        close(after, {n: p.detach() for n, p in net.named_parameters()}, "torch's state in sx")

    def test_writer_refuses_what_sx_cannot_hold(self):
        net = make_net(4)
        named = dict(net.named_parameters())
        opt = torch.optim.AdamW([named[n] for n in ADAMW_PARAMS])  # the SGD params in no group
        weights, prefix = self.path("x.safetensors"), self.path("x-optim")
        with self.assertRaisesRegex(ValueError, "in no optimizer's param groups"):
            sxckpt_torch.write(net, [opt], weights, prefix)
        self.assertFalse(os.path.exists(weights))
        with self.assertRaisesRegex(ValueError, "not an optimizer sx has"):
            sxckpt_torch.write(net, [torch.optim.Adadelta(net.parameters())], weights, prefix)


if __name__ == "__main__":
    unittest.main(verbosity=2)
