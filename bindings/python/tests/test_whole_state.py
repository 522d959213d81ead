"""Whole optimizer state through the binding (gather onto one rank, scatter into any
world size, in-place views of a rank's part), weighted steps for uneven inputs, the
warning about an all-zero gradient, param groups added after finalize, and views that
outlive an explicit close()."""
import gc
import os
import tempfile
import threading
import unittest

import sx
from _ranks import run_ranks

try:
    import numpy as np
except ImportError:  # the tests below need numpy; test_training covers the rest
    np = None


def make(rank, name, world, **kw):
    g = sx.ShardGroup(name, rank, world, backend="cpu", num_threads=1, timeout_ms=60000, **kw)
    g.add_param_group("adamw", lr=0.01, amsgrad=True)
    g.add_param_group("sgd", lr=0.1, momentum=0.9)
    g.add_param("w", [7, 11], param_group=0, unit=0)
    g.add_param("b", [13], param_group=1, unit=1)
    g.add_param("s", [], param_group=0, unit=1)
    g.finalize()
    return g


def train(g, steps, seed):
    for s in range(steps):
        for i, p in enumerate(g.params()):
            grad = g.grad_view(p.index)
            grad[...] = ((np.arange(p.numel, dtype=np.float32) * 7 + s * 3 + seed + i) % 11 - 5).reshape(p.shape) / 8
        g.step(max_grad_norm=2.0)


@unittest.skipIf(np is None, "needs numpy")
class WholeStateTest(unittest.TestCase):
    def test_gather_scatter_round_trip_across_world_sizes(self):
        def saver(rank, name):
            with make(rank, name, 3) as g:
                train(g, 3, rank)
                states = g.gather_optim_state(root=0)
                values = {p.name: np.array(g.param_view(p.index)) for p in g.params()}
                return states, values

        results = run_ranks(3, saver)
        self.assertIsNone(results[1][0])
        states, values = results[0]
        self.assertEqual([s.name for s in states], ["w", "b", "s"])
        self.assertEqual(sorted(states[0].tensors), ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
        self.assertEqual(sorted(states[1].tensors), ["momentum_buffer"])
        self.assertEqual((states[0].step, states[1].momentum_steps), (3, 3))
        self.assertTrue(np.any(states[0].tensors["exp_avg"] != 0))

        def loader(rank, name):
            with make(rank, name, 2) as g:
                for p in g.params():
                    g.param_view(p.index)[...] = values[p.name]
                by_name = {s.name: s for s in states}
                g.scatter_optim_state(by_name if rank == 1 else None, root=1)
                # Each rank's part in place equals the slice of the whole it owns.
                info = g.param_info("w")
                part = g.state_view("w", "exp_avg")
                np.testing.assert_array_equal(part, states[0].tensors["exp_avg"][info.shard_begin:info.shard_end])
                back = g.gather_optim_state(root=0)
                train(g, 1, rank)
                return back

        back = run_ranks(2, loader)[0]
        for before, after in zip(states, back):
            self.assertEqual((before.step, before.momentum_steps), (after.step, after.momentum_steps))
            for k in before.tensors:
                np.testing.assert_array_equal(before.tensors[k], after.tensors[k])

    def test_every_optimizer_gathers_and_scatters(self):
        # Each optimizer's whole state has torch's names; scattered into another world
        # size, it trains on exactly as the same state loaded from a checkpoint does
        # (NAdam's mu_product, which the whole state does not carry, included).
        kinds = {"adagrad": (dict(initial_accumulator_value=0.1), ["sum"]),
                 "rmsprop": (dict(momentum=0.5, centered=True), ["grad_avg", "momentum_buffer", "square_avg"]),
                 "adamax": ({}, ["exp_avg", "exp_inf"]),
                 "nadam": (dict(decoupled_weight_decay=True, weight_decay=0.1), ["exp_avg", "exp_avg_sq"]),
                 "radam": ({}, ["exp_avg", "exp_avg_sq"]),
                 "lion": (dict(weight_decay=0.1), ["exp_avg"]),
                 "lamb": (dict(weight_decay=0.1), ["exp_avg", "exp_avg_sq"])}
        for kind, (options, names) in kinds.items():
            with self.subTest(optimizer=kind), tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "ck")

                def group(rank, name, world):
                    g = sx.ShardGroup(name, rank, world, backend="cpu", num_threads=1, timeout_ms=60000)
                    g.add_param_group(kind, lr=0.01, **options)
                    g.add_param("w", [7, 11], unit=0)
                    g.add_param("b", [13], unit=1)
                    g.finalize()
                    return g

                def saver(rank, name):
                    with group(rank, name, 3) as g:
                        train(g, 4, rank)
                        g.save(path, synchronous=True)
                        return g.gather_optim_state(root=0), {p.name: np.array(g.param_view(p.index)) for p in g.params()}

                states, values = run_ranks(3, saver)[0]
                for st in states:
                    self.assertEqual(sorted(st.tensors), names)
                    self.assertEqual(st.step, 4)
                    # NAdam's mu_product (a product of four coefficients below 1); 0 elsewhere.
                    self.assertTrue(0 < st.mu_product < 1 if kind == "nadam" else st.mu_product == 0)

                def scattered(rank, name):
                    with group(rank, name, 2) as g:
                        for p in g.params():
                            g.param_view(p.index)[...] = values[p.name]
                        g.scatter_optim_state({s.name: s for s in states} if rank == 1 else None, root=1)
                        back = g.gather_optim_state(root=0)
                        if rank == 0:
                            self.assertEqual([s.mu_product for s in back], [s.mu_product for s in states])
                        train(g, 3, rank)
                        return [np.array(g.param_view(p.index)) for p in g.params()]

                def loaded(rank, name):
                    with group(rank, name, 2) as g:
                        g.load(path)
                        train(g, 3, rank)
                        return [np.array(g.param_view(p.index)) for p in g.params()]

                for a, b in zip(run_ranks(2, scattered)[0], run_ranks(2, loaded)[0]):
                    np.testing.assert_array_equal(a, b)

    def test_adafactor_factored_moments(self):
        # Adafactor keeps row_var and col_var of a param of two or more dimensions whole
        # on every rank, torch's [..., R, 1] and [..., 1, C] flat, and a param-shaped
        # variance of a 1-D one. Scattered into another world size, they train on exactly
        # as the same state loaded from a checkpoint does.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ck")

            def group(rank, name, world):
                g = sx.ShardGroup(name, rank, world, backend="cpu", num_threads=1, timeout_ms=60000)
                g.add_param_group("adafactor", lr=0.01, weight_decay=0.1)
                g.add_param("m", [6, 5], unit=0)
                g.add_param("t", [2, 3, 4], unit=0)
                g.add_param("v", [7], unit=1)
                g.finalize()
                return g

            def saver(rank, name):
                with group(rank, name, 3) as g:
                    train(g, 3, rank)
                    g.save(path, synchronous=True)
                    return g.gather_optim_state(root=0), {p.name: np.array(g.param_view(p.index)) for p in g.params()}

            states, values = run_ranks(3, saver)[0]
            lengths = {st.name: {k: len(v) for k, v in st.tensors.items()} for st in states}
            self.assertEqual(lengths, {"m": {"row_var": 6, "col_var": 5}, "t": {"row_var": 6, "col_var": 8},
                                       "v": {"variance": 7}})
            for st in states:
                self.assertEqual(st.step, 3)
                for k, v in st.tensors.items():
                    self.assertTrue(np.all(v > 0), f"{st.name}'s {k}: {v}")

            def scattered(rank, name):
                with group(rank, name, 2) as g:
                    for p in g.params():
                        g.param_view(p.index)[...] = values[p.name]
                    g.scatter_optim_state({s.name: s for s in states} if rank == 1 else None, root=1)
                    back = g.gather_optim_state(root=0)
                    if rank == 0:
                        for before, after in zip(states, back):
                            self.assertEqual(sorted(before.tensors), sorted(after.tensors))
                            for k in before.tensors:
                                np.testing.assert_array_equal(before.tensors[k], after.tensors[k])
                    train(g, 1, rank)
                    return [np.array(g.param_view(p.index)) for p in g.params()]

            def loaded(rank, name):
                with group(rank, name, 2) as g:
                    g.load(path)
                    train(g, 1, rank)
                    return [np.array(g.param_view(p.index)) for p in g.params()]

            for a, b in zip(run_ranks(2, scattered)[0], run_ranks(2, loaded)[0]):
                np.testing.assert_array_equal(a, b)

    def test_a_callback_and_its_exception(self):
        def rank_main(rank, name):
            with make(rank, name, 2) as g:
                train(g, 2, rank)
                seen = []
                g.gather_optim_state(root=1, fn=lambda st: seen.append((st.name, sorted(st.tensors))))
                if rank == 1:
                    self.assertEqual(seen, [("w", ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
                                            ("b", ["momentum_buffer"]),
                                            ("s", ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"])])
                before = g.gather_optim_state(root=0)

                def boom(state):
                    if state.name == "b":
                        raise KeyError("no state for b here")
                    state.tensors["exp_avg"][...] = 1.0

                if rank == 0:
                    with self.assertRaises(KeyError):
                        g.scatter_optim_state(boom, root=0)
                else:
                    with self.assertRaises(sx.CancelledError):
                        g.scatter_optim_state(None, root=0)
                after = g.gather_optim_state(root=0)
                if rank == 0:  # the failed scatter changed nothing
                    for x, y in zip(before, after):
                        for k in x.tensors:
                            np.testing.assert_array_equal(x.tensors[k], y.tensors[k])
        run_ranks(2, rank_main)

    def test_a_root_without_states_fails_every_rank(self):
        def rank_main(rank, name):
            with make(rank, name, 2) as g:
                train(g, 1, rank)
                with self.assertRaises(sx.SxError) as failure:
                    g.scatter_optim_state(None, root=1)
                if rank == 1:
                    self.assertIsInstance(failure.exception, sx.InvalidArgumentError)
                    self.assertIn("no states", str(failure.exception))
                train(g, 1, rank)  # the group goes on
        run_ranks(2, rank_main)

    def test_seeding_state_through_views(self):
        def rank_main(rank, name):
            with make(rank, name, 2) as g:
                train(g, 1, rank)
                g.state_view("b", "momentum_buffer")[...] = rank + 1.0
                with self.assertRaisesRegex(sx.InvalidArgumentError, "momentum_buffer"):
                    g.state_view("b", "exp_avg")
                whole = g.gather_optim_state(root=0)
                if rank == 0:
                    info = [g.param_info("b")]
                    buf = whole[1].tensors["momentum_buffer"]
                    mine = buf[info[0].shard_begin:info[0].shard_end]
                    self.assertTrue(np.all(mine == 1.0))
                    self.assertTrue(np.all(np.isin(buf, [1.0, 2.0])))
        run_ranks(2, rank_main)

    def test_packed_state_views_and_round_trip(self):
        # 8-bit AdamW: "w" (8192 elements, 32 blocks, 16 per rank) keeps codes and scales,
        # "small" fp32 slots; a bf16 group's "c" keeps bf16 slots.
        def rank_main(rank, name):
            with sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1, timeout_ms=60000) as g:
                g.add_param_group("adamw", lr=0.01, state_dtype="8bit")
                g.add_param_group("adamw", lr=0.01, state_dtype="bf16")
                g.add_param("w", [64, 128], param_group=0, unit=0)
                g.add_param("small", [10, 10], param_group=0, unit=0)
                g.add_param("c", [48, 100], param_group=1, unit=0)
                g.finalize()
                train(g, 2, rank)
                info = g.param_info("w")
                codes, scale = g.state_view("w", "exp_avg"), g.state_view("w", "exp_avg.scale")
                self.assertEqual((codes.dtype, codes.size), (np.uint8, info.shard_end - info.shard_begin))
                self.assertEqual((scale.dtype, scale.size), (np.float32, codes.size // 256))
                self.assertEqual(g.state_view("small", "exp_avg_sq").dtype, np.float32)
                self.assertEqual(g.state_view("c", "exp_avg").dtype, np.uint16)
                with self.assertRaisesRegex(sx.InvalidArgumentError, "exp_avg.scale"):
                    g.state_view("w", "exp_avg.scales")
                before = {(p, t): np.array(g.state_view(p, t)) for p in ("w", "small", "c")
                          for t in ("exp_avg", "exp_avg_sq")}
                before[("w", "exp_avg.scale")] = np.array(scale)
                whole = g.gather_optim_state(root=0)
                g.scatter_optim_state({s.name: s for s in whole} if rank == 0 else None, root=0)
                for (p, t), was in before.items():
                    self.assertTrue(np.array_equal(was, g.state_view(p, t)), f"{p} {t} changed")
                return whole, info.shard_begin, before[("w", "exp_avg.scale")]

        results = run_ranks(2, rank_main)
        whole = {s.name: s for s in results[0][0]}
        lowest = np.float32(-0.99296874)  # the signed map's ends: this and 1.0
        for _, begin, scale in results:
            # Each block decodes its extreme to exactly its scale times an end of the map.
            blocks = whole["w"].tensors["exp_avg"][begin:begin + scale.size * 256].reshape(-1, 256)
            ends = (blocks.max(axis=1) == scale) | (blocks.min(axis=1) == lowest * scale)
            self.assertTrue(np.all(ends) and np.all(scale > 0))


@unittest.skipIf(np is None, "needs numpy")
class UnevenInputsTest(unittest.TestCase):
    def test_weighted_average_of_gradient_sums(self):
        # Ranks hold 3, 2 and 0 samples; each adds the sum of its samples' gradients. SGD
        # with lr 1 from zero: the params become minus the mean over the 5 samples.
        samples = {0: [1.0, 2.0, 3.0], 1: [10.0, 20.0], 2: []}

        def rank_main(rank, name):
            with sx.ShardGroup(name, rank, 3, backend="cpu", num_threads=1, timeout_ms=60000) as g:
                g.add_param_group("sgd", lr=1.0)
                g.add_param("w", [4])
                g.finalize()
                g.grad_view("w")[...] = sum(samples[rank])
                result = g.step(weight=len(samples[rank]))
                self.assertFalse(result.skipped)
                got = np.array(g.param_view("w"))
                # Nobody has data: the step is skipped, nothing changes.
                skipped = g.step(weight=0)
                self.assertTrue(skipped.skipped)
                np.testing.assert_array_equal(np.array(g.param_view("w")), got)
                return got

        for got in run_ranks(3, rank_main):
            np.testing.assert_allclose(got, -(1 + 2 + 3 + 10 + 20) / 5.0, rtol=1e-6)

    def test_ranks_must_all_weigh_or_none(self):
        def rank_main(rank, name):
            with sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1, timeout_ms=60000) as g:
                g.add_param_group("sgd")
                g.add_param("w", [4])
                g.finalize()
                with self.assertRaisesRegex(sx.MismatchError, "weighted: 1 on rank 0, 0 on rank 1"):
                    g.step(weight=1.0 if rank == 0 else None)
        run_ranks(2, rank_main)


class WarningAndLifetimeTest(unittest.TestCase):
    def test_an_all_zero_gradient_is_warned_about(self):
        messages = []
        lock = threading.Lock()

        def log(level, message):
            with lock:
                messages.append((level, message))

        sx.set_log_callback(log, "warn")
        try:
            def rank_main(rank, name):
                with sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1) as g:
                    g.add_param_group("adamw")
                    g.add_param("w", [4])
                    g.finalize()
                    g.step()
            run_ranks(2, rank_main)
        finally:
            sx.set_log_callback(None)
        warned = [m for lvl, m in messages if lvl == sx.SX_LOG_WARN and "gradients of every trainable" in m]
        self.assertEqual(len(warned), 2)  # one per rank
        self.assertIn("zero_grad", warned[0])

    @unittest.skipIf(np is None, "needs numpy")
    def test_views_outlive_close(self):
        def rank_main(rank, name):
            g = make(rank, name, 1)
            w = g.param_view("w")
            w[...] = 3.0
            g.close()
            self.assertTrue(g.closed)
            self.assertEqual(g.loans, 1)
            with self.assertRaises(sx.InvalidHandleError):
                g.param_view("w")
            # The memory stays valid while the array lives.
            w += 1.0
            self.assertTrue(np.all(w == 4.0))
            del w
            gc.collect()
            self.assertEqual(g.loans, 0)
        run_ranks(1, rank_main)

    def test_param_groups_added_after_finalize(self):
        def rank_main(rank, name):
            with sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1) as g:
                g.add_param_group("sgd", lr=1.0)
                g.add_param("w", [4], unit=0)
                g.finalize()
                g.grad_view("w")[...] = 1.0
                g.step()
                late = g.add_param_group("sgd", lr=0.5)
                g.add_param("v", [3], param_group=late, unit=1)
                with self.assertRaisesRegex(sx.InvalidStateError, "call sx_finalize again"):
                    g.step()
                g.finalize()
                g.grad_view("v")[...] = 2.0
                g.step()
                return list(g.param_view("w")), list(g.param_view("v"))
        for w, v in run_ranks(2, rank_main):
            self.assertEqual(w, [-1.0] * 4)
            self.assertEqual(v, [-1.0] * 3)


if __name__ == "__main__":
    unittest.main()
