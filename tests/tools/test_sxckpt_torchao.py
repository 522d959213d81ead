"""sxckpt export and import of 8-bit optimizer state against torchao 0.18's AdamW8bit
itself, both ways.

sx to torchao: two sx ranks (threads, through the Python binding) train params of 32 and
17 blocks of 256 and one of 300 elements (which torchao and sx keep in fp32) with 8-bit
AdamW and save; `sxckpt export --state-format torchao` writes the files, which
sxckpt_torch.torchao_state_dict turns into AdamW8bit's state: its codes and scales are the
exported ones, and each slot's dequantize() equals the default export's fp32 tensor bit
for bit. One more step of AdamW8bit equals one more step of sx from the checkpoint on
the same gradient, params bit for bit, and the state sx saves after it is AdamW8bit's,
codes and scales.

torchao to sx: sxckpt_torch.write takes the AdamW8bit; `sxckpt import` makes a checkpoint
whose state, exported again, is AdamW8bit's codes and scales; sx loads it, and its next
step equals AdamW8bit's, bit for bit.

Environment (set by ctest): SXCKPT, the built sxckpt; SX_LIBRARY, the built libsx;
PYTHONPATH with bindings/python and tools/sxckpt.
"""
import os
import shutil
import tempfile
import threading
import unittest

import numpy as np
import torch
from torchao.optim import AdamW8bit
from torchao.optim.subclass_8bit import OptimState8bit

import sx
import sxckpt_torch
from test_sxckpt_torch import sxckpt  # noqa: E402 (this directory is on sys.path)

STEPS = 3
OPTIONS = dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-8)
SHAPES = {"w": (64, 128), "b": (300,), "v": (17, 256)}
SLOTS = ("exp_avg", "exp_avg_sq")
_rendezvous = iter(range(1 << 30))


def initial(name):
    return np.random.default_rng(sum(map(ord, name))).uniform(-1, 1, size=SHAPES[name]).astype(np.float32)


def grad(name, step):
    seed = 1000 * step + sum(map(ord, name))
    return (np.random.default_rng(seed).standard_normal(size=SHAPES[name]) * 0.1).astype(np.float32)


def run_sx(world, fn):
    """fn(rank, group) on `world` threads over a finalized group of 8-bit AdamW; rank 0's
    result."""
    rv = f"local://sxckpt-torchao-{os.getpid()}-{next(_rendezvous)}"
    results, errors = [None] * world, []

    def body(rank):
        try:
            with sx.ShardGroup(rv, rank, world, stage=2, backend="cpu", num_threads=1, timeout_ms=60000) as g:
                g.add_param_group("adamw", state_dtype="8bit", **OPTIONS)
                for name, shape in SHAPES.items():
                    g.add_param(name, list(shape), param_group=0)
                g.finalize()
                results[rank] = fn(rank, g)
        except BaseException as e:  # noqa: B036 (reported on the main thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results[0]


def sx_load_step_save(ck, step, save):
    """One rank loads `ck`, takes step `step`'s gradient, saves into `save`; its params."""
    def fn(rank, g):
        g.load(ck)
        for name in SHAPES:
            g.grad_view(name)[...] = grad(name, step)
        g.step()
        g.save(save, synchronous=True).wait()
        return {name: torch.tensor(np.array(g.param_view(name))) for name in SHAPES}
    return run_sx(1, fn)


def torchao_step(params, opt, step):
    for name, p in params.items():
        p.grad = torch.from_numpy(grad(name, step))
    opt.step()


def same_bits(a, b):
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.shape == b.shape and torch.equal(a, b)


class TorchaoRoundTrip(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sx-sxckpt-torchao-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def export(self, ck, tag, state_format):
        weights, prefix = self.path(f"{tag}.safetensors"), self.path(f"{tag}-optim")
        sxckpt("export", "--safetensors", weights, "--optimizer", prefix, "--state-format", state_format, ck)
        return weights, prefix

    def expect_torchao_state(self, tensors, opt, params, what):
        """The exported codes and scales (torchao's form) are opt's state, bit for bit."""
        for name in ("w", "v"):
            for slot in SLOTS:
                st = opt.state[params[name]][slot]
                self.assertIsInstance(st, OptimState8bit, f"{what}: {name}.{slot}")
                self.assertEqual(st.signed, slot == "exp_avg")
                self.assertTrue(same_bits(tensors[f"{name}.{slot}.codes"], st.codes), f"{what}: {name}.{slot} codes")
                self.assertTrue(same_bits(tensors[f"{name}.{slot}.scale"], st.scale), f"{what}: {name}.{slot} scale")
        for slot in SLOTS:
            self.assertTrue(same_bits(tensors[f"b.{slot}"], opt.state[params["b"]][slot]), f"{what}: b.{slot}")

    def test_sx_to_torchao_and_back(self):
        ck = self.path("ck")

        def train(rank, g):
            for name in SHAPES:
                g.param_view(name)[...] = initial(name)
            for s in range(STEPS):
                for name in SHAPES:  # rank 0's gradient alone: sx's sum is it exactly
                    g.grad_view(name)[...] = grad(name, s) if rank == 0 else np.zeros(SHAPES[name], np.float32)
                g.step()
            g.save(ck, synchronous=True).wait()

        run_sx(2, train)
        weights, prefix = self.export(ck, "ao", "torchao")
        _, deq_prefix = self.export(ck, "deq", "torch")
        doc, tensors = sxckpt_torch.read_optimizer(prefix)
        self.assertEqual(doc["param_groups"][0]["state_dtype"], "8bit")
        self.assertEqual(tensors["w.exp_avg.codes"].dtype, torch.uint8)
        params = {n: torch.nn.Parameter(t) for n, t in sxckpt_torch.load_weights(weights).items()}
        opt = AdamW8bit(sxckpt_torch.torchao_param_groups(doc, params, "AdamW"))
        opt.load_state_dict(sxckpt_torch.torchao_state_dict(doc, tensors, "AdamW"))
        self.expect_torchao_state(tensors, opt, params, "loaded")
        self.assertEqual(float(opt.state[params["w"]]["step"]), STEPS)
        self.assertEqual(opt.param_groups[0]["betas"], OPTIONS["betas"])

        # The default export is torchao's dequantize(), bit for bit.
        _, deq = sxckpt_torch.read_optimizer(deq_prefix)
        for name in SHAPES:
            for slot in SLOTS:
                st = opt.state[params[name]][slot]
                value = st.dequantize() if isinstance(st, OptimState8bit) else st
                self.assertTrue(same_bits(deq[f"{name}.{slot}"], value), f"dequantized {name}.{slot}")
        # ... which torch.optim.AdamW loads as plain state.
        deq_doc = sxckpt_torch.read_optimizer(deq_prefix)[0]
        plain = torch.optim.AdamW(sxckpt_torch.param_groups(deq_doc, params, "AdamW"))
        plain.load_state_dict(sxckpt_torch.optimizer_state_dict(deq_doc, deq, "AdamW"))
        self.assertTrue(same_bits(plain.state[params["w"]]["exp_avg"], deq["w.exp_avg"]))

        # One more step: torchao's from the exported state, sx's from the checkpoint.
        torchao_step(params, opt, STEPS)
        after = sx_load_step_save(ck, STEPS, self.path("after"))
        for name in SHAPES:
            self.assertTrue(same_bits(params[name], after[name]), f"{name} after one more step")
        _, after_prefix = self.export(self.path("after"), "after", "torchao")
        self.expect_torchao_state(sxckpt_torch.read_optimizer(after_prefix)[1], opt, params, "after one more step")

        # torchao to sx: its state written, imported, exported again: its codes and scales.
        w2, p2, ck2 = self.path("t.safetensors"), self.path("t-optim"), self.path("ck2")
        sxckpt_torch.write(params, [opt], w2, p2)
        doc2, t2 = sxckpt_torch.read_optimizer(p2)
        self.assertEqual(doc2["param_groups"][0]["state_dtype"], "8bit")
        sxckpt("import", "--safetensors", w2, "--optimizer", p2, "--world-size", "3", ck2)
        self.assertIn("OK", sxckpt("verify", ck2))
        _, back_prefix = self.export(ck2, "back", "torchao")
        self.expect_torchao_state(sxckpt_torch.read_optimizer(back_prefix)[1], opt, params, "imported")
        # ... and sx steps on from it as torchao does.
        after = sx_load_step_save(ck2, STEPS + 1, self.path("after2"))
        torchao_step(params, opt, STEPS + 1)
        for name in SHAPES:
            self.assertTrue(same_bits(params[name], after[name]), f"{name} after a step from the imported state")

    def test_refusals(self):
        params = {n: torch.nn.Parameter(torch.zeros(s)) for n, s in SHAPES.items()}
        with self.assertRaisesRegex(ValueError, "blocks of 256"):
            sxckpt_torch.write(params, [AdamW8bit(params.values(), block_size=128)], self.path("x.safetensors"),
                               self.path("x"))
        doc = {"param_groups": [{"optimizer": "AdamW", "lr": 0.1, "betas": [0.9, 0.99], "eps": 1e-8,
                                 "weight_decay": 0.0, "amsgrad": False, "maximize": False, "params": ["w"]}],
               "state": {"w": {"step": 1}}}
        with self.assertRaisesRegex(ValueError, "torchao keeps param 'w' in 8 bits"):
            sxckpt_torch.torchao_state_dict(doc, {"w.exp_avg": torch.zeros(64, 128),
                                                  "w.exp_avg_sq": torch.zeros(64, 128)}, "AdamW")
        doc["param_groups"][0]["maximize"] = True
        with self.assertRaisesRegex(ValueError, "no maximize"):
            sxckpt_torch.torchao_param_groups(doc, params, "AdamW")


if __name__ == "__main__":
    unittest.main(verbosity=2)
