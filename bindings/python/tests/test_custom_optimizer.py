"""Custom optimizers written in Python (sx.register_optimizer): Lion in numpy against the
built-in Lion bit for bit, at world sizes 1 and 2 (and registered in_place, at world
size 2); the pieces sx hands out; an optimizer's
own hyperparameters and slot initial values; a failing update and what its message
says in the step's error; and bad descriptions.

Registration is per process (at most SX_MAX_CUSTOM_OPTIMIZERS): this module registers
each optimizer once, at import, and the ranks (threads) share it."""
import threading
import unittest

import sx
from _ranks import run_ranks

try:
    import numpy as np
except ImportError:  # the update below is numpy code
    np = None


def lion_update(piece):
    """Lion as sx's built-in computes it: float32 arithmetic, one rounding per operation."""
    hp = piece.hyperparameters
    lr, beta1, beta2, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["weight_decay"]
    decay, neg_lr = np.float32(1.0 - lr * wd), np.float32(-lr)
    b1, omb1 = np.float32(beta1), np.float32(1.0 - beta1)
    b2, omb2 = np.float32(beta2), np.float32(1.0 - beta2)
    param, (m,) = piece.param, piece.state
    g = piece.grad * np.float32(piece.grad_scale)
    p = param * decay
    c = m * b1 + omb1 * g
    param[:] = p + neg_lr * np.sign(c)
    m[:] = m * b2 + omb2 * g


pieces = []
pieces_lock = threading.Lock()


def probe_update(piece):
    """A plain SGD with an own hyperparameter ("scale") and a slot that starts at 1.5 and
    counts the updates; records every piece."""
    with pieces_lock:
        pieces.append((piece.param_index, piece.param_group, piece.offset, piece.n, piece.step))
    scale, lr = np.float32(piece.hyperparameters["scale"]), np.float32(piece.hyperparameters["lr"])
    piece.param[:] -= lr * scale * piece.grad * np.float32(piece.grad_scale)
    piece.state[0][:] += np.float32(1.0)
    if piece.hyperparameters["fail"] != 0:
        raise RuntimeError(f"told to fail at step {piece.step}")


if np is not None:
    LION = sx.register_optimizer("py_lion", ["exp_avg"], lion_update,
                                 hyperparameters={"lr": 1e-4, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0})
    # The same Lion updating in place (SX_OPTIMIZER_IN_PLACE): no double buffers.
    LION_IN_PLACE = sx.register_optimizer("py_lion_in_place", ["exp_avg"], lion_update,
                                          hyperparameters={"lr": 1e-4, "beta1": 0.9, "beta2": 0.99,
                                                           "weight_decay": 0.0},
                                          in_place=True)
    PROBE = sx.register_optimizer("py_probe", ["count"], probe_update,
                                  hyperparameters=[("lr", 0.1), ("scale", 2.0, 0.0, 10.0), ("fail", 0.0)],
                                  slot_initial_values=[1.5])


def message_update(piece):
    """Fails as its "mode" says: 1 raises with a known message, 2 returns 5, 3 raises with
    a message longer than sx's error buffer (2-byte UTF-8 characters); 0 does nothing."""
    mode = piece.hyperparameters["mode"]
    if mode == 1:
        raise ValueError("the message test's update failed on purpose")
    if mode == 2:
        return 5
    if mode == 3:
        raise ValueError("\u00e9" * 300)
    return None


# Needs no numpy: the update touches no array.
MESSAGE = sx.register_optimizer("py_error_message", [], message_update, hyperparameters=[("mode", 0.0)])

SHAPES = {"w": [37, 53], "b": [7]}  # w spans several pieces at any sensible piece size


def grads_at(step, name, numel, rank):
    """Gradients that depend on the step, the element and the rank only."""
    k = np.arange(numel, dtype=np.float64)
    return (np.sin(k * 0.37 + step * 1.3 + rank * 0.5) * (1 + step % 3)).astype(np.float32)


def lion_twins(rank, name, world, steps, custom_lion=None):
    """One group holding every param twice: once under the built-in Lion, once under
    py_lion (or `custom_lion`), with the same values and gradients. Returns both copies'
    final values."""
    with sx.ShardGroup(name, rank, world, backend="cpu", num_threads=2, timeout_ms=60000) as g:
        hyper = dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1)
        pg_builtin = g.add_param_group("lion", **hyper)
        pg_custom = g.add_param_group(LION if custom_lion is None else custom_lion, **hyper)
        for pg, suffix in ((pg_builtin, "builtin"), (pg_custom, "custom")):
            for pname, shape in SHAPES.items():
                g.add_param(f"{pname}.{suffix}", shape, param_group=pg, unit=pg)
        g.finalize()
        for pname, shape in SHAPES.items():
            init = np.cos(np.arange(int(np.prod(shape)), dtype=np.float32)).reshape(shape)
            g.param_view(f"{pname}.builtin")[...] = init
            g.param_view(f"{pname}.custom")[...] = init
        for s in range(steps):
            if s == 10:  # a schedule reaches both alike
                g.set_lr(pg_builtin, 1e-3)
                g.set_lr(pg_custom, 1e-3)
            for pname, shape in SHAPES.items():
                grad = grads_at(s, pname, int(np.prod(shape)), rank).reshape(shape)
                g.grad_view(f"{pname}.builtin")[...] = grad
                g.grad_view(f"{pname}.custom")[...] = grad
            g.step(max_grad_norm=5.0)
        states = {st.name: st for st in (g.gather_optim_state(root=0) or [])}
        # The state bytes this rank holds, and what one exp_avg per unit takes (fp32
        # params: no masters); a double-buffered optimizer holds more.
        one_slot = sum(g.unit_info(u).shard_numel * 4 for u in (pg_builtin, pg_custom))
        return ({p: np.array(g.param_view(f"{p}.builtin")) for p in SHAPES},
                {p: np.array(g.param_view(f"{p}.custom")) for p in SHAPES}, states,
                (g.memory_stats().optimizer_bytes, one_slot))


@unittest.skipIf(np is None, "needs numpy")
class CustomLionTest(unittest.TestCase):
    def check_twins(self, world, custom_lion=None):
        results = run_ranks(world, lion_twins, world, 20, custom_lion)
        for rank, (builtin, custom, states, _) in enumerate(results):
            for pname in SHAPES:
                with self.subTest(world=world, rank=rank, param=pname):
                    self.assertFalse(np.array_equal(builtin[pname], np.cos(
                        np.arange(builtin[pname].size, dtype=np.float32)).reshape(builtin[pname].shape)))
                    # Bit for bit: the same float32 bits, not just close.
                    self.assertTrue(np.array_equal(builtin[pname].view(np.uint32), custom[pname].view(np.uint32)),
                                    f"max difference {np.max(np.abs(builtin[pname] - custom[pname]))}")
        states = results[0][2]
        for pname in SHAPES:  # the slot is the built-in's exp_avg, gathered whole
            self.assertEqual(sorted(states[f"{pname}.custom"].tensors), ["exp_avg"])
            self.assertTrue(np.array_equal(states[f"{pname}.custom"].tensors["exp_avg"],
                                           states[f"{pname}.builtin"].tensors["exp_avg"]))
            self.assertEqual(states[f"{pname}.custom"].step, 20)
        return [r[3] for r in results]

    def test_matches_the_builtin_on_one_rank(self):
        self.check_twins(1)

    def test_matches_the_builtin_on_two_ranks(self):
        for optimizer_bytes, one_slot in self.check_twins(2):
            self.assertGreater(optimizer_bytes, one_slot)  # double-buffered

    def test_in_place_matches_the_builtin_on_two_ranks(self):
        self.assertTrue(LION_IN_PLACE.in_place)
        self.assertFalse(LION.in_place)
        self.assertNotEqual(LION_IN_PLACE, LION)
        for optimizer_bytes, one_slot in self.check_twins(2, LION_IN_PLACE):
            self.assertEqual(optimizer_bytes, one_slot)  # no second slot buffer, no copy of the params
        # in_place is part of the description: the name without it is another one.
        with self.assertRaises(sx.AlreadyExistsError):
            sx.register_optimizer("py_lion_in_place", ["exp_avg"], lion_update,
                                  hyperparameters={"lr": 1e-4, "beta1": 0.9, "beta2": 0.99,
                                                   "weight_decay": 0.0})
        with self.assertRaisesRegex(sx.InvalidArgumentError, "in_place must be a bool"):
            sx.register_optimizer("py_lion_bad_flag", ["exp_avg"], lion_update, in_place=1)

    def test_the_optimizer_is_an_id(self):
        self.assertIsInstance(LION, int)
        self.assertGreaterEqual(LION, sx.SX_OPTIM_CUSTOM_FIRST)
        self.assertEqual((LION.name, LION.slots), ("py_lion", ("exp_avg",)))
        self.assertEqual(LION.own_hyperparameters, ())
        # The same description again (as every rank registers it) is the same optimizer.
        again = sx.register_optimizer("py_lion", ["exp_avg"], lion_update,
                                      hyperparameters={"lr": 1e-4, "beta1": 0.9, "beta2": 0.99,
                                                       "weight_decay": 0.0})
        self.assertIs(again, LION)


@unittest.skipIf(np is None, "needs numpy")
class ProbeTest(unittest.TestCase):
    def run_probe(self, rank, name, world):
        with sx.ShardGroup(name, rank, world, backend="cpu", num_threads=2, timeout_ms=60000) as g:
            pg = g.add_param_group("py_probe", scale=3.0)  # by name; its own hyperparameter too
            self.assertEqual(g.get_hyperparameter(pg, "scale"), 3.0)
            self.assertEqual(g.get_hyperparameter(pg, sx.SX_HP_CUSTOM), 3.0)
            self.assertEqual(g.get_hyperparameter(pg, "lr"), 0.1)  # the registered default
            g.add_param("w", SHAPES["w"], param_group=pg)
            g.finalize()
            g.grad_view("w")[...] = 1.0
            g.step()
            g.set_hyperparameter(pg, "scale", 0.5)
            g.grad_view("w")[...] = 1.0
            g.step()
            info = g.param_info("w")
            counts = g.state_view("w", "count")
            self.assertEqual(counts.size, info.shard_end - info.shard_begin)
            self.assertTrue(np.all(counts == 3.5))  # 1.5, then +1 at each of two steps
            w = np.array(g.param_view("w"))
            self.assertTrue(np.allclose(w, -0.1 * 3.0 - 0.1 * 0.5), w.ravel()[:4])
            # A failing update fails the step on every rank and changes nothing.
            g.set_hyperparameter(pg, "fail", 1.0)
            g.grad_view("w")[...] = 1.0
            with self.assertRaises(sx.OptimizerError) as cm:
                g.step()
            self.assertEqual(cm.exception.status, sx.SX_ERR_OPTIMIZER)
            self.assertIn("py_probe", cm.exception.message)
            if isinstance(cm.exception.__cause__, RuntimeError):
                self.assertIn("told to fail", str(cm.exception.__cause__))
            self.assertTrue(np.array_equal(np.array(g.param_view("w")), w))
            self.assertTrue(np.all(g.state_view("w", "count") == 3.5))
            with self.assertRaises(sx.InvalidArgumentError):
                g.set_hyperparameter(pg, "scale", 11.0)  # outside its registered range
            with self.assertRaisesRegex(sx.InvalidArgumentError, "unknown hyperparameter 'scal'"):
                g.add_param_group(PROBE, scal=1.0)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "outside"):
                g.add_param_group(PROBE, scale=20.0)
            self.assertEqual(g.num_param_groups, 1)  # the refused ones added nothing

    def test_pieces_hyperparameters_slots_and_failure(self):
        del pieces[:]
        run_ranks(2, self.run_probe, 2)
        numel = SHAPES["w"][0] * SHAPES["w"][1]
        first = sorted((off, n) for (p, pg, off, n, step) in pieces if step == 1)
        self.assertTrue(all(p == 0 and pg == 0 for (p, pg, _, _, _) in pieces))
        # The pieces of the first step cover the param once, over both ranks' shards.
        covered = 0
        for off, n in first:
            self.assertEqual(off, covered)
            self.assertGreaterEqual(n, 1)
            covered += n
        self.assertEqual(covered, numel)
        self.assertEqual({step for (_, _, _, _, step) in pieces}, {1, 2, 3})


class ErrorMessageTest(unittest.TestCase):
    """What a failing update says reaches the step's OptimizerError message (sx's
    sx_last_error_message), through the piece's error buffer."""

    def run_failures(self, rank, name, world):
        messages = []
        with sx.ShardGroup(name, rank, world, backend="cpu", num_threads=2, timeout_ms=60000) as g:
            pg = g.add_param_group(MESSAGE)
            g.add_param("w", [37, 53], param_group=pg)
            g.finalize()
            g.step()  # mode 0 succeeds
            for mode in (1, 2, 3):
                g.set_hyperparameter(pg, "mode", float(mode))
                with self.assertRaises(sx.OptimizerError) as cm:
                    g.step()
                self.assertEqual(cm.exception.status, sx.SX_ERR_OPTIMIZER)
                messages.append((cm.exception.message, cm.exception.__cause__))
        return messages

    def check(self, world):
        for rank, messages in enumerate(run_ranks(world, self.run_failures, world)):
            with self.subTest(world=world, rank=rank):
                (raised, cause), (returned, no_cause), (long, long_cause) = messages
                self.assertIn("py_error_message", raised)
                self.assertIn("ValueError: the message test's update failed on purpose", raised)
                self.assertIn("update returned 5", returned)
                self.assertIsNone(no_cause)
                # Cut to the buffer (SX_OPTIMIZER_ERROR_BYTES, its NUL included) at a character
                # boundary: "ValueError: " (12 bytes), then as many whole 2-byte characters
                # as fit (an odd number of bytes is left: the cut falls inside one).
                kept = (sx.SX_OPTIMIZER_ERROR_BYTES - 1 - len("ValueError: ")) // 2
                self.assertIn("ValueError: " + "\u00e9" * kept + ": the step", long)
                self.assertNotIn("\ufffd", long)
                # __cause__ still chains the exception (the ranks of one process share the
                # optimizer's last failure: one of two ranks takes it).
                if world == 1:
                    self.assertIsInstance(cause, ValueError)
                    self.assertIsInstance(long_cause, ValueError)
                else:
                    self.assertIn(type(cause), (ValueError, type(None)))

    def test_one_rank(self):
        self.check(1)

    def test_two_ranks(self):
        self.check(2)


@unittest.skipIf(np is None, "needs numpy")
class BadDescriptionTest(unittest.TestCase):
    def test_missing_update(self):
        with self.assertRaises(sx.InvalidArgumentError) as cm:
            sx.register_optimizer("py_bad_no_update", ["m"], None)
        self.assertIn("update", cm.exception.message)
        with self.assertRaisesRegex(sx.InvalidArgumentError, "update must be callable"):
            sx.register_optimizer("py_bad_no_update", ["m"], "not a function")

    def test_duplicate_slot_names(self):
        with self.assertRaises(sx.InvalidArgumentError) as cm:
            sx.register_optimizer("py_bad_slots", ["m", "m"], lion_update)
        self.assertIn("'m'", cm.exception.message.replace('"', "'"))

    def test_other_bad_descriptions(self):
        with self.assertRaises(sx.InvalidArgumentError):
            sx.register_optimizer("py_bad_many", ["a", "b", "c", "d"], lion_update)  # > SX_MAX_CUSTOM_SLOTS
        with self.assertRaises(sx.InvalidArgumentError):
            sx.register_optimizer("bad name!", ["m"], lion_update)
        with self.assertRaises(sx.InvalidArgumentError):
            sx.register_optimizer("py_bad_slot_name", ["m-1"], lion_update)
        with self.assertRaises(sx.InvalidArgumentError):
            sx.register_optimizer("py_bad_range", [], lion_update, hyperparameters=[("k", 5.0, 0.0, 1.0)])
        with self.assertRaises(sx.InvalidArgumentError):
            sx.register_optimizer("py_bad_hp_twice", [], lion_update, hyperparameters=[("k", 1.0), ("k", 2.0)])
        with self.assertRaisesRegex(sx.InvalidArgumentError, "single string"):
            sx.register_optimizer("py_bad_str", "exp_avg", lion_update)
        with self.assertRaisesRegex(sx.InvalidArgumentError, "slot_initial_values"):
            sx.register_optimizer("py_bad_init", ["a"], lion_update, slot_initial_values=[1.0, 2.0])
        with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
            sx.register_optimizer("py\0bad", ["a"], lion_update)
        # Another description under a taken name.
        with self.assertRaises(sx.AlreadyExistsError):
            sx.register_optimizer("py_lion", ["exp_avg", "other"], lion_update)
        self.assertNotIn("py_bad_many", [o.name for o in sx.optimizers.registered_optimizers().values()])

    def test_unknown_optimizer_names_the_custom_ones(self):
        with sx.ShardGroup(f"local://py-custom-unknown-{id(self)}", 0, 1, backend="cpu", num_threads=1) as g:
            with self.assertRaisesRegex(sx.InvalidArgumentError, "py_lion"):
                g.add_param_group("py_lino")
            with self.assertRaises(sx.InvalidArgumentError):
                g.add_param_group(sx.SX_OPTIM_CUSTOM_FIRST + 63)  # never registered


if __name__ == "__main__":
    unittest.main()
