"""bf16_stochastic_round through the binding: a one-rank group of bf16 params keeps no
fp32 masters (the memory stats count the bf16 moments alone), steps them, reads the key
back, gives its params back from a checkpoint, and refuses an fp32 param in such a group
naming it."""
import os
import tempfile
import unittest

import sx

N = 4096


class StochasticRoundTest(unittest.TestCase):
    def test_constants(self):
        self.assertEqual(sx.SX_HP_BF16_STOCHASTIC_ROUND, 28)

    def test_a_group_without_masters_steps(self):
        with sx.ShardGroup("local://py-sr-step", 0, 1, num_threads=1) as g:
            g.add_param_group("adamw", lr=0.01, state_dtype="bf16", bf16_stochastic_round=True)
            g.add_param("w", [N], dtype="bf16")
            g.finalize()
            self.assertEqual(g.get_hyperparameter(0, "bf16_stochastic_round"), 1.0)
            w = g.param_view("w")
            w[...] = 0.5
            before = w.copy()
            g.grad_view("w")[...] = 1.0
            g.step()
            self.assertTrue((g.param_view("w") != before).any())
            # Two bf16 moments (2 bytes each) per element, and no fp32 masters.
            self.assertEqual(g.memory_stats().optimizer_bytes, 4 * N)

    def test_a_checkpoint_gives_the_params_back(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ckpt")
            with sx.ShardGroup("local://py-sr-save", 0, 1, num_threads=1) as g:
                g.add_param_group("adamw", lr=0.01, bf16_stochastic_round=True)
                g.add_param("w", [N], dtype="bf16")
                g.finalize()
                g.param_view("w")[...] = 0x3F00  # 0.5
                g.grad_view("w")[...] = 0x3F80  # 1.0
                g.step()
                saved = g.param_view("w").copy()
                f = g.save(path)
                f.wait()
                f.close()
            with sx.ShardGroup("local://py-sr-load", 0, 1, num_threads=1) as g:
                g.add_param_group("adamw", lr=0.01, bf16_stochastic_round=True)
                g.add_param("w", [N], dtype="bf16")
                g.finalize()
                g.load(path)
                self.assertTrue((g.param_view("w") == saved).all())

    def test_an_fp32_param_is_refused(self):
        with sx.ShardGroup("local://py-sr-refuse", 0, 1, num_threads=1) as g:
            g.add_param_group("adamw", bf16_stochastic_round=True)
            g.add_param("fp32_w", [8])
            with self.assertRaisesRegex(sx.InvalidArgumentError, "fp32_w"):
                g.finalize()


if __name__ == "__main__":
    unittest.main()
