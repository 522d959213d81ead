"""Real training over local:// with ranks as threads: views, steps, freezing,
checkpoints (with resharding), futures and their callbacks."""
import ctypes
import math
import json
import os
import struct
import tempfile
import threading
import unittest

import sx
from _ranks import fill, rendezvous, run_ranks, tolist

WORLD = 4


def make_group(rank, name, world=WORLD, optimizer="sgd", **hyper):
    # A short timeout: a test that goes wrong fails in a minute instead of five.
    g = sx.ShardGroup(name, rank, world, stage=2, backend="cpu", num_threads=1, timeout_ms=60000)
    g.add_param_group(optimizer, **hyper)
    g.add_param("w", [3, 5], unit=0)
    g.add_param("b", [5], unit=1)
    g.finalize()
    return g


class ViewTest(unittest.TestCase):
    def test_views_are_shaped_zero_copy_and_seen_by_sx(self):
        def rank_main(rank, name):
            with make_group(rank, name, lr=1.0) as g:
                w, dw = g.param_view("w"), g.grad_view(0)
                self.assertEqual(tuple(w.shape), (3, 5))
                self.assertEqual(tuple(g.param_view(1).shape), (5,))
                if sx.HAVE_NUMPY:
                    import numpy
                    self.assertIsInstance(w, numpy.ndarray)
                    self.assertEqual(w.dtype, numpy.float32)
                    self.assertEqual(w.ctypes.data, g.raw_view("w").data)
                else:
                    self.assertIsInstance(w, memoryview)
                    self.assertEqual(w.format, "f")
                self.assertEqual(tolist(w), [0.0] * 15)
                # Every rank adds (rank + 1) to every gradient; sx averages over ranks.
                fill(dw, [rank + 1.0] * 15)
                result = g.step()  # SGD, lr 1: w -= mean gradient = 2.5
                self.assertEqual(result.step, 1)
                self.assertFalse(result.skipped)
                # The grads written through the view reached sx: the norm is of them.
                self.assertAlmostEqual(result.grad_norm, math.sqrt(15 * 2.5 ** 2), places=5)
                # The update is visible through the array taken before the step.
                self.assertEqual(tolist(w), [-2.5] * 15)
                self.assertEqual(tolist(dw), [0.0] * 15)  # zeroed after the step
                # Writing through the param view is seen by sx too.
                fill(w, [1.0] * 15)
                fill(dw, [2.0] * 15)
                g.step(keep_grads=True)
                self.assertEqual(tolist(g.param_view("w")), [-1.0] * 15)
                self.assertNotIn(0.0, tolist(dw))  # keep_grads: not zeroed
                return g.rank, g.world_size, g.stage, g.num_params, g.num_units
        results = run_ranks(WORLD, rank_main)
        self.assertEqual(results, [(r, WORLD, 2, 2, 2) for r in range(WORLD)])


def quadratic_loss_run(rank, name, steps):
    """Each rank pulls the params towards its own target; returns the losses."""
    losses = []
    with make_group(rank, name, optimizer="adam", lr=0.1) as g:
        w, dw = g.param_view("w"), g.grad_view("w")
        target = [(rank + k) % 7 / 7.0 for k in range(15)]
        for _ in range(steps):
            values = tolist(w)
            diff = [v - t for v, t in zip(values, target)]
            losses.append(sum(d * d for d in diff) / len(diff))
            fill(dw, [2.0 * d / len(diff) for d in diff])
            g.step(max_grad_norm=10.0)
    return losses


class TrainingTest(unittest.TestCase):
    def test_loss_falls(self):
        losses = run_ranks(WORLD, quadratic_loss_run, 25)
        for rank, rank_losses in enumerate(losses):
            self.assertLess(rank_losses[-1], 0.5 * rank_losses[0], f"rank {rank}: {rank_losses}")

    def test_queries_and_info(self):
        def rank_main(rank, name):
            with make_group(rank, name, optimizer="adamw", lr=0.01, betas=(0.8, 0.9)) as g:
                self.assertEqual(g.get_hyperparameter(0, "beta1"), 0.8)
                g.set_hyperparameter(0, "lr", 0.25)
                self.assertEqual(g.get_hyperparameter(0, sx.SX_HP_LR), 0.25)
                g.set_lr(0, 0.5)
                self.assertEqual(g.get_hyperparameter(0, "lr"), 0.5)
                self.assertEqual(g.num_param_groups, 1)
                info = g.param_info("w")
                self.assertEqual((info.index, info.name, info.shape, info.numel), (0, "w", (3, 5), 15))
                self.assertEqual(g.param_index("b"), 1)
                self.assertEqual([p.name for p in g.params()], ["w", "b"])
                unit = g.unit_info(0)
                self.assertEqual(unit.numel, 15)
                self.assertEqual(unit.padded_numel, unit.shard_numel * WORLD)
                self.assertEqual(unit.shard_begin, rank * unit.shard_numel)
                g.step()
                stats = g.memory_stats()
                self.assertEqual(stats.staging_bytes, 0)  # nothing saved, nothing reserved
                self.assertGreater(stats.param_bytes, 0)
                self.assertGreater(stats.optimizer_bytes, 0)
                # AdamW keeps two fp32 states per element of the 20 elements.
                self.assertEqual(stats.unsharded_optimizer_bytes, 2 * 4 * 20)
                return info.shard_end - info.shard_begin
        covered = run_ranks(WORLD, rank_main)
        self.assertEqual(sum(covered), 15)  # the shards split w exactly

    def test_adagrad_and_rmsprop_defaults(self):
        def rank_main(rank, name):
            g = sx.ShardGroup(name, rank, 1, stage=2, backend="cpu", num_threads=1, timeout_ms=60000)
            with g:
                self.assertEqual(g.add_param_group("adagrad"), 0)
                self.assertEqual(g.add_param_group("rmsprop", centered=True, momentum=0.5), 1)
                with self.assertRaises(sx.InvalidArgumentError):
                    g.add_param_group("adagrad", alpha=0.5)  # RMSprop's, not Adagrad's
                g.add_param("w", [4], param_group=0)
                g.add_param("v", [4], param_group=1)
                g.finalize()
                return ([g.get_hyperparameter(0, k) for k in
                         ("lr", "eps", "lr_decay", "initial_accumulator_value", "weight_decay")],
                        [g.get_hyperparameter(1, k) for k in ("lr", "alpha", "eps", "centered", "momentum")])
        self.assertEqual(run_ranks(1, rank_main), [([1e-2, 1e-10, 0.0, 0.0, 0.0], [1e-2, 0.99, 1e-8, 1.0, 0.5])])

    def test_a_checkpoint_with_state_the_group_does_not_keep_is_refused(self):
        # RMSprop with momentum and centered keeps momentum_buffer and grad_avg; a plain
        # RMSprop group would drop them (the load restores the options, so they would
        # start from zero): refused, naming the state, and nothing changes.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ck")

            def group(name, **options):
                g = sx.ShardGroup(name, 0, 1, backend="cpu", num_threads=1, timeout_ms=60000)
                g.add_param_group("rmsprop", lr=0.01, **options)
                g.add_param("w", [6])
                g.finalize()
                return g

            with group(rendezvous(), momentum=0.5, centered=True) as g:
                fill(g.grad_view("w"), [0.5] * 6)
                g.step()
                g.save(path, synchronous=True)
                saved = tolist(g.param_view("w"))
            with group(rendezvous()) as g:
                before = tolist(g.param_view("w"))
                with self.assertRaisesRegex(sx.MismatchError, "momentum_buffer state .* does not keep"):
                    g.load(path)
                self.assertEqual(tolist(g.param_view("w")), before)
                self.assertEqual(g.get_hyperparameter(0, "centered"), 0.0)
            with group(rendezvous(), momentum=0.1, centered=True) as g:
                g.load(path)
                self.assertEqual(tolist(g.param_view("w")), saved)
                self.assertEqual(g.get_hyperparameter(0, "momentum"), 0.5)

    def test_freezing(self):
        def rank_main(rank, name):
            with make_group(rank, name, lr=1.0) as g:
                w, b = g.param_view("w"), g.param_view("b")
                dw, db = g.grad_view("w"), g.grad_view("b")
                mask = g.trainable_mask()
                self.assertEqual(list(mask), [1, 1])
                g.set_trainable("b", False)
                self.assertFalse(g.is_trainable("b"))
                self.assertEqual(list(mask), [1, 0])  # the same bytes sx reads
                fill(dw, [1.0] * 15)
                fill(db, [1.0] * 5)
                g.step()
                self.assertEqual(tolist(w), [-1.0] * 15)
                self.assertEqual(tolist(b), [0.0] * 5)  # frozen: no update
                mask[1] = 1  # unfreeze through the mask; the step notices by itself
                self.assertTrue(g.is_trainable(1))
                fill(dw, [1.0] * 15)
                fill(db, [1.0] * 5)
                g.step()
                self.assertEqual(tolist(b), [-1.0] * 5)
                self.assertEqual(tolist(w), [-2.0] * 15)
        run_ranks(WORLD, rank_main)

    def test_disagreeing_masks_fail_on_every_rank(self):
        def rank_main(rank, name):
            with make_group(rank, name, lr=1.0) as g:
                g.set_trainable("b", rank != 1)
                with self.assertRaises(sx.MismatchError):
                    g.step()
        run_ranks(WORLD, rank_main)


def train_steps(g, rank, steps, first_step):
    """Deterministic gradients that are equal on every rank, so that the average over
    any world size is the same."""
    dw, db = g.grad_view("w"), g.grad_view("b")
    for s in range(first_step, first_step + steps):
        fill(dw, [math.sin(0.3 * k + s) for k in range(15)])
        fill(db, [math.cos(0.7 * k - s) for k in range(5)])
        g.step()


class CheckpointTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.dir = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def test_save_then_load_at_another_world_size(self):
        path = os.path.join(self.dir, "step-3")
        blob = struct.pack("<Q", 3) + bytes(range(256)) * 20  # longer than one read

        def save_at_4(rank, name):
            with make_group(rank, name, optimizer="adamw", lr=0.05) as g:
                train_steps(g, rank, 3, 0)
                with g.save(path, user_blob=blob) as future:
                    future.wait(timeout=60)
                    self.assertTrue(future.poll())
                    done, total = future.progress()
                    self.assertEqual(done, total)
                    self.assertEqual(future.error_message, "")
                snapshot = (tolist(g.param_view("w")), tolist(g.param_view("b")))
                train_steps(g, rank, 1, 3)  # the reference: the 4th step at 4 ranks
                return snapshot, tolist(g.param_view("w")), tolist(g.param_view("b")), total

        def load_at_2(rank, name):
            with make_group(rank, name, world=2, optimizer="adamw", lr=0.5) as g:
                g.load(path)
                self.assertEqual(g.get_hyperparameter(0, "lr"), 0.05)  # restored
                loaded = (tolist(g.param_view("w")), tolist(g.param_view("b")))
                train_steps(g, rank, 1, 3)
                return loaded, tolist(g.param_view("w")), tolist(g.param_view("b"))

        at4 = run_ranks(4, save_at_4)
        # Ranks whose shards hold only padding write nothing; some rank wrote the data.
        self.assertGreater(sum(r[3] for r in at4), 15 * 4)
        self.assertEqual(sx.read_user_blob(path), blob)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "latest")))
        at2 = run_ranks(2, load_at_2)
        saved = at4[0][0]
        for rank in range(2):
            self.assertEqual(at2[rank][0], saved, "params after load differ from those saved")
            for got, want in zip(at2[rank][1] + at2[rank][2], at4[0][1] + at4[0][2]):
                # Optimizer state came along: the next step matches the 4-rank run.
                self.assertAlmostEqual(got, want, delta=1e-6 * max(1.0, abs(want)))
        self.assertNotEqual(at4[0][1], saved[0], "the reference step changed nothing")

    def test_params_only_load(self):
        path = os.path.join(self.dir, "ck")

        def rank_main(rank, name):
            with make_group(rank, name, optimizer="adamw", lr=0.05) as g:
                train_steps(g, rank, 2, 0)
                g.save(path, synchronous=True).close()
                return tolist(g.param_view("w"))

        def reload(rank, name):
            with make_group(rank, name, optimizer="adamw", lr=0.5) as g:
                g.load(path, params_only=True)
                self.assertEqual(g.get_hyperparameter(0, "lr"), 0.5)  # not restored
                return tolist(g.param_view("w"))

        saved = run_ranks(WORLD, rank_main)[0]
        self.assertEqual(run_ranks(WORLD, reload), [saved] * WORLD)

    def test_callbacks_run_once_with_the_future(self):
        calls = []
        lock = threading.Lock()

        def callback(future, status):
            with lock:
                calls.append((threading.current_thread() is threading.main_thread(),
                              future, status))

        def rank_main(rank, name):
            with make_group(rank, name) as g:
                train_steps(g, rank, 1, 0)
                future = g.save(os.path.join(self.dir, "cb"), callback=callback)
                future.wait_staged()
                future.wait()
                future.close()
                future.close()  # double close is fine
                with self.assertRaises(sx.InvalidHandleError):
                    future.poll()
                return future

        futures = run_ranks(WORLD, rank_main)
        self.assertEqual(len(calls), WORLD)
        for on_main, future, status in calls:
            self.assertFalse(on_main)
            self.assertEqual(status, sx.SX_OK)
            self.assertIn(future, futures)
            self.assertIsNone(future.callback_error)

    def test_a_failing_callback_is_reported_not_raised(self):
        def callback(future, status):
            raise RuntimeError("from the callback")

        def rank_main(rank, name):
            with make_group(rank, name) as g:
                with g.save(os.path.join(self.dir, "bad-cb"), callback=callback) as future:
                    future.wait()
                    return future.callback_error
        import contextlib
        import io
        with contextlib.redirect_stderr(io.StringIO()):
            errors = run_ranks(WORLD, rank_main)
        self.assertTrue(all(isinstance(e, RuntimeError) for e in errors), errors)

    def test_save_into_an_existing_directory_fails(self):
        path = os.path.join(self.dir, "exists")
        os.mkdir(path)

        def rank_main(rank, name):
            with make_group(rank, name) as g:
                with self.assertRaises(sx.SxError) as cm:
                    g.save(path).wait()
                self.assertIn("exists", str(cm.exception))
        run_ranks(WORLD, rank_main)

    def test_keep_last(self):
        def rank_main(rank, name):
            with make_group(rank, name) as g:
                for k in range(3):
                    train_steps(g, rank, 1, k)
                    g.save(os.path.join(self.dir, f"step-{k}"), keep_last=2).wait()
        run_ranks(WORLD, rank_main)
        kept = sorted(d for d in os.listdir(self.dir) if d.startswith("step-"))
        self.assertEqual(kept, ["step-1", "step-2"])


def bits(view):
    """A 16-bit view's elements as their raw uint16 bits (numpy shows fp16 as float16)."""
    return view.view("uint16") if sx.HAVE_NUMPY else view


def element_type(view):
    return str(view.dtype) if sx.HAVE_NUMPY else view.format


# Raw bits of 1.0 and 0.5: bf16 is the top half of fp32.
BF16_ONE, BF16_HALF, F16_ONE, F16_HALF = 0x3F80, 0x3F00, 0x3C00, 0x3800


class AllReduceTest(unittest.TestCase):
    def test_the_trainers_numbers_over_the_ranks(self):
        def rank_main(rank, name):
            with sx.ShardGroup(name, rank, 3, backend="cpu", num_threads=1, timeout_ms=60000) as g:
                total = g.all_reduce(float(rank + 1))
                stats = {op: g.all_reduce([rank, -rank, 0.5], op=op) for op in ("sum", "mean", "max", "min")}
                try:
                    g.all_reduce([1.0], op="max" if rank == 2 else "sum")
                    mismatch = None
                except sx.MismatchError as e:
                    mismatch = str(e)
                return total, stats, mismatch

        results = run_ranks(3, rank_main)
        for total, stats, mismatch in results:
            self.assertEqual(total, 6.0)
            self.assertEqual(stats["sum"], [3.0, -3.0, 1.5])
            self.assertEqual(stats["mean"], [1.0, -1.0, 0.5])
            self.assertEqual(stats["max"], [2.0, 0.0, 0.5])
            self.assertEqual(stats["min"], [0.0, -2.0, 0.5])
            self.assertIn("op: sum on ranks 0, 1, max on rank 2", mismatch)
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1) as g:
            for bad in ("1.0", [True], [1, "x"]):
                with self.assertRaisesRegex(sx.InvalidArgumentError, "numbers"):
                    g.all_reduce(bad)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "count"):
                g.all_reduce([1.0] * (sx.SX_MAX_ALL_REDUCE + 1))
            with self.assertRaisesRegex(sx.InvalidArgumentError, "op"):
                g.all_reduce(1.0, op="product")


class PackedLayoutTest(unittest.TestCase):
    def test_one_block_of_params_behind_one_view(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1, alignment=1) as g:
            g.add_param_group("sgd", lr=0.5)
            g.add_param("a", [2, 3])
            g.add_param("b", [5])
            g.finalize()
            self.assertEqual([g.param_info(p).offset_in_unit for p in ("a", "b")], [0, 6])
            block, grads = g.unit_view(0), g.unit_view(0, grad=True)
            self.assertEqual(len(block), 11)
            fill(block, [1.0] * 11)
            self.assertEqual(tolist(g.param_view("b")), [1.0] * 5)  # the same memory
            fill(grads, [2.0] * 11)
            g.step()
            self.assertEqual(tolist(block), [0.0] * 11)
            with self.assertRaises(sx.InvalidArgumentError):
                g.unit_view(1)


class MixedPrecisionTest(unittest.TestCase):
    def test_bf16_params_with_fp32_grads_and_dynamic_loss_scaling(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1,
                           grad_dtype="f32") as g:
            g.add_param_group("sgd", lr=0.5)
            g.add_param("w", [2, 3], dtype="bf16")
            g.finalize()
            self.assertEqual(g.param_info("w").dtype, sx.SX_DTYPE_BF16)
            self.assertEqual(g.raw_view("w").dtype, sx.SX_DTYPE_BF16)
            self.assertEqual(g.raw_view("w", grad=True).dtype, sx.SX_DTYPE_F32)
            w, dw = g.param_view("w"), g.grad_view("w")
            self.assertEqual(tuple(w.shape), (2, 3))
            self.assertEqual(element_type(w), "uint16" if sx.HAVE_NUMPY else "H")
            self.assertEqual(element_type(dw), "float32" if sx.HAVE_NUMPY else "f")
            fill(w, [BF16_ONE] * 6)  # the masters start from the 16-bit params
            self.assertEqual(g.loss_scale, 1.0)
            g.set_loss_scaling("dynamic", init_scale=1024)
            self.assertEqual(g.loss_scale, 1024.0)
            # Gradients of the loss times 1024; the step divides them by it: SGD, lr 0.5
            # takes 1.0 to 0.5.
            fill(dw, [1024.0] * 6)
            result = g.step()
            self.assertEqual((result.step, result.skipped, result.loss_scale), (1, False, 1024.0))
            self.assertEqual(tolist(w), [BF16_HALF] * 6)
            # An inf gradient: the step is skipped and the scale backs off by half.
            fill(dw, [1.0] * 4 + [math.inf, 1.0])
            result = g.step()
            self.assertEqual((result.step, result.skipped, result.loss_scale), (1, True, 512.0))
            self.assertEqual(g.loss_scale, 512.0)
            self.assertEqual(tolist(w), [BF16_HALF] * 6)

    def test_nonfinite_gradients(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1) as g:
            g.add_param_group("sgd", lr=0.5)
            g.add_param("w", [4])
            g.finalize()
            w, dw = g.param_view("w"), g.grad_view("w")
            fill(w, [1.0] * 4)
            # Clipping checks the norm: a NaN skips the step, and says so.
            fill(dw, [1.0, math.nan, 1.0, 1.0])
            result = g.step(max_grad_norm=1.0)
            self.assertEqual((result.step, result.skipped, result.nonfinite), (0, True, True))
            self.assertEqual(tolist(w), [1.0] * 4)
            # "error": skipped, then raised.
            fill(dw, [math.inf, 1.0, 1.0, 1.0])
            with self.assertRaisesRegex(sx.NonFiniteError, "inf or NaN"):
                g.step(nonfinite="error")
            self.assertEqual(tolist(w), [1.0] * 4)
            fill(dw, [1.0] * 4)
            result = g.step(nonfinite="skip")
            self.assertEqual((result.step, result.skipped, result.nonfinite), (1, False, False))
            self.assertEqual(tolist(w), [0.5] * 4)
            self.assertEqual(g.param_group_steps(0), 1)  # the skipped steps do not count
            with self.assertRaisesRegex(sx.InvalidArgumentError, "param_group 1 is not one of this group's 1"):
                g.param_group_steps(1)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "nonfinite"):
                g.step(nonfinite="ignore")

    def test_fp16_params_with_fp16_grads(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1) as g:
            g.add_param_group("sgd", lr=0.5)
            g.add_param("w", [4], dtype="f16")
            g.finalize()
            w, dw = g.param_view("w"), g.grad_view("w")
            self.assertEqual(g.raw_view("w", grad=True).dtype, sx.SX_DTYPE_F16)
            for view in (w, dw):
                self.assertEqual(element_type(view), "float16" if sx.HAVE_NUMPY else "H")
            fill(bits(w), [F16_ONE] * 4)
            fill(bits(dw), [F16_ONE] * 4)
            result = g.step()
            self.assertEqual((result.skipped, result.loss_scale), (False, 1.0))
            self.assertEqual(tolist(bits(w)), [F16_HALF] * 4)
            self.assertEqual(tolist(bits(dw)), [0] * 4)  # zeroed after the step


class PipelineTest(unittest.TestCase):
    """Units as a pipeline: signalled reductions, deferred gathers and stage 3 give the
    params of the plain step, bit for bit."""

    def run_steps(self, stage, overlap):
        def rank_main(rank, name):
            g = sx.ShardGroup(name, rank, 2, stage=stage, backend="cpu", num_threads=1,
                              timeout_ms=60000, prefetch_depth=1)
            with g:
                g.add_param_group("adamw", lr=0.01)
                g.add_param("w", [7, 9], unit=0)
                g.add_param("b", [9], unit=1)
                g.add_param("head", [9, 3], unit=2)
                g.finalize()
                for u in range(3):
                    with g.unit(u):
                        for p in range(3):
                            if g.param_info(p).unit == u:
                                fill(g.param_view(p), [0.01 * k for k in range(g.param_info(p).numel)])
                for step in range(3):
                    for u in (2, 1, 0):  # backward, last unit first
                        with g.unit(u):
                            for p in range(3):
                                if g.param_info(p).unit == u:
                                    n = g.param_info(p).numel
                                    fill(g.grad_view(p), [((k * 7 + step + rank) % 11 - 5) / 8.0 for k in range(n)])
                        if overlap:
                            g.unit_grads_ready(u)
                    g.step(defer_gather=overlap)
                out = []
                for u in range(3):
                    with g.unit(u):
                        out += [tolist(g.param_view(p)) for p in range(3) if g.param_info(p).unit == u]
                return out, g.memory_stats()
        return run_ranks(2, rank_main)

    def test_overlap_and_stage3_equal_the_plain_step(self):
        plain = self.run_steps(2, False)
        self.assertEqual(plain[0][0], plain[1][0])
        for stage, overlap in ((2, True), (1, True), (3, False), (3, True)):
            got = self.run_steps(stage, overlap)
            for rank in range(2):
                self.assertEqual(got[rank][0], plain[rank][0], "stage %d overlap %s" % (stage, overlap))
        stats = self.run_steps(3, True)[0][1]
        self.assertGreater(stats.peak_param_bytes, stats.param_bytes)

    def test_stage3_views_need_a_gather(self):
        with sx.ShardGroup(rendezvous(), 0, 1, stage=3, backend="cpu", num_threads=1) as g:
            g.add_param_group("sgd", lr=0.1)
            g.add_param("w", [4], unit=0)
            g.finalize()
            with self.assertRaises(sx.InvalidStateError):
                g.param_view("w")
            with g.unit(0):
                self.assertEqual(len(tolist(g.param_view("w"))), 4)
            with self.assertRaises(sx.InvalidStateError):
                g.release_unit(0)
            g.unit_grads_ready(0)
            with self.assertRaises(sx.InvalidStateError):
                g.unit_grads_ready(0)
            g.step()


class MeshTest(unittest.TestCase):
    """HSDP: 4 ranks as 2 shard groups of 2 train as the flat group of 4, bit for bit,
    and report the mesh."""

    def run_steps(self, shard_size, stage=2):
        def rank_main(rank, name):
            g = sx.ShardGroup(name, rank, 4, stage=stage, backend="cpu", num_threads=1,
                              timeout_ms=60000, shard_size=shard_size)
            with g:
                g.add_param_group("adamw", lr=0.01)
                g.add_param("w", [7, 9], unit=0)
                g.add_param("b", [9], unit=1)
                g.finalize()
                info = g.unit_info(0)
                for step in range(3):
                    for u in (1, 0):
                        with g.unit(u):
                            p = u
                            n = g.param_info(p).numel
                            fill(g.grad_view(p), [((k * 5 + step + rank) % 9 - 4) / 8.0 for k in range(n)])
                        g.unit_grads_ready(u)
                    g.step()
                out = []
                for u in range(2):
                    with g.unit(u):
                        out.append(tolist(g.param_view(u)))
                return out, info
        return run_ranks(4, rank_main)

    def test_a_2x2_mesh_equals_the_flat_group(self):
        flat = self.run_steps(0)
        for stage in (2, 3):
            mesh = self.run_steps(2, stage)
            for rank in range(4):
                self.assertEqual(mesh[rank][0], flat[rank][0], "stage %d rank %d" % (stage, rank))
                info = mesh[rank][1]
                self.assertEqual((info.shard_size, info.shard_rank, info.replicas, info.replica_rank),
                                 (2, rank % 2, 2, rank // 2))
                self.assertEqual(info.shard_begin, (rank % 2) * info.shard_numel)
        self.assertEqual((flat[3][1].shard_size, flat[3][1].shard_rank, flat[3][1].replicas), (4, 3, 1))

    def test_a_size_that_does_not_divide_fails_every_rank(self):
        def rank_main(rank, name):
            try:
                sx.ShardGroup(name, rank, 4, backend="cpu", timeout_ms=60000, shard_size=3).close()
            except sx.InvalidArgumentError as e:
                return str(e)
            return None
        errors = run_ranks(4, rank_main)
        for e in errors:
            self.assertIsNotNone(e)
            self.assertIn("shard_size 3 does not divide the world size 4", e)


def open_sockets():
    """How many sockets this process has open (Linux; 0 without /proc)."""
    count = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            count += os.readlink(os.path.join("/proc/self/fd", fd)).startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return count


class TransportTest(unittest.TestCase):
    """transport="tcp" (Gloo's TCP between ranks that are threads of this process) trains
    as "auto" (shared memory here), bit for bit; other values are refused."""

    def run_steps(self, transport):
        def rank_main(rank, name):
            g = sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1, timeout_ms=60000,
                              transport=transport)
            with g:
                g.add_param_group("adamw", lr=0.01)
                g.add_param("w", [7, 9], unit=0)
                g.add_param("b", [9], unit=1)
                g.finalize()
                sockets = open_sockets()  # this rank's connections are open now
                fill(g.param_view("w"), [0.01 * k for k in range(63)])
                for step in range(3):
                    for p, n in ((0, 63), (1, 9)):
                        fill(g.grad_view(p), [((k * 7 + step + rank) % 11 - 5) / 8.0 for k in range(n)])
                    result = g.step(max_grad_norm=1.0)
                return [tolist(g.param_view(p)) for p in range(2)], result.grad_norm, sockets
        return run_ranks(2, rank_main)

    def test_tcp_equals_auto(self):
        auto = self.run_steps("auto")
        tcp = self.run_steps("tcp")
        self.assertEqual(auto[0][:2], auto[1][:2])  # the ranks agree
        self.assertNotEqual(auto[0][0][0], [0.01 * k for k in range(63)])  # and trained
        for rank in range(2):
            self.assertEqual(tcp[rank][:2], auto[rank][:2], "rank %d" % rank)
        if os.path.isdir("/proc/self/fd"):
            # "tcp" reached the library: each rank saw Gloo's connections open.
            self.assertGreater(min(tcp[0][2], tcp[1][2]), 0)

    def test_a_bad_transport_is_refused(self):
        for bad in ("udp", "", None, 7):
            with self.subTest(transport=bad):
                with self.assertRaisesRegex(ValueError, r"transport must be one of \['auto', 'tcp'\]") as cm:
                    sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", transport=bad)
                self.assertIsInstance(cm.exception, sx.InvalidArgumentError)
        # The library refuses a raw value it does not know, naming the field.
        cfg = sx._lib.init_struct(sx._lib.sx_group_config_t)
        cfg.rendezvous = rendezvous().encode()
        cfg.world_size, cfg.backend, cfg.transport = 1, sx.SX_BACKEND_CPU, 7
        handle = sx._lib.sx_shard_group_p()
        status = sx._lib.lib.sx_create_shard_group(ctypes.byref(cfg), ctypes.byref(handle))
        self.assertEqual(status, sx.SX_ERR_INVALID_ARGUMENT)
        self.assertIn("transport", sx._lib.lib.sx_last_error_message().decode())
        self.assertFalse(handle)


class TraceTest(unittest.TestCase):
    """The step timeline: each rank's file, written by flush_trace and by close, is JSON
    with a span per unit's reduce-scatter, named by unit id, with its bytes."""

    def test_ranks_write_their_traces(self):
        with tempfile.TemporaryDirectory() as d:
            template = os.path.join(d, "t-%r.json")

            def rank_main(rank, name):
                g = sx.ShardGroup(name, rank, 2, backend="cpu", num_threads=1, timeout_ms=60000,
                                  trace_path=template, trace_events=1000)
                with g:
                    g.add_param_group("sgd", lr=0.1)
                    g.add_param("w", [3, 5], unit=4)
                    g.finalize()
                    g.step()
                    g.flush_trace()
                    flushed = os.path.exists(os.path.join(d, "t-%d.json" % rank))
                    g.step()
                return flushed

            self.assertEqual(run_ranks(2, rank_main), [True, True])
            for rank in range(2):
                with open(os.path.join(d, "t-%d.json" % rank)) as f:
                    doc = json.load(f)
                self.assertEqual(doc["otherData"]["capacity"], 1000)
                spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
                self.assertEqual(sum(e["name"] == "sx_step" for e in spans), 2)
                rs = [e for e in spans if e["name"] == "reduce_scatter"]
                self.assertEqual(len(rs), 2)
                self.assertTrue(all(e["pid"] == rank and e["args"]["unit"] == 4 for e in rs))
                self.assertTrue(all(e["args"]["bytes"] == 32 * 4 for e in rs))  # 15 padded to 2 x 16

    def test_no_trace_and_unwritable_trace(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu") as g:
            g.add_param_group("sgd")
            g.add_param("w", [2])
            g.finalize()
            g.flush_trace()  # nothing to write: no error
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu",
                           trace_path="/nonexistent-sx-dir/t.json") as g:
            g.add_param_group("sgd")
            g.add_param("w", [2])
            g.finalize()
            g.step()
            with self.assertRaisesRegex(sx.SxIOError, "/nonexistent-sx-dir/t.rank0.json"):
                g.flush_trace()
        with self.assertRaisesRegex(sx.InvalidArgumentError, "trace_events"):
            sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", trace_events=-1)


class LogTest(unittest.TestCase):
    def test_set_and_clear(self):
        messages = []
        sx.set_log_callback(lambda level, text: messages.append((level, text)), "debug")
        try:
            with self.assertRaisesRegex(sx.InvalidArgumentError, "max_level"):
                sx.set_log_callback(print, "loud")
            run_ranks(2, lambda rank, name: make_group(rank, name, world=2).close())
            for level, text in messages:
                self.assertIn(level, range(sx.SX_LOG_ERROR, sx.SX_LOG_DEBUG + 1))
                self.assertIsInstance(text, str)
        finally:
            sx.set_log_callback(None)


class ReserveStagingTest(unittest.TestCase):
    def test_finalize_reserves_the_checkpoint_staging_when_asked(self):
        for reserve in (False, True):
            with sx.ShardGroup(f"local://py-reserve-{reserve}-{os.getpid()}", 0, 1, backend="cpu", num_threads=1,
                               reserve_checkpoint_staging=reserve) as g:
                g.add_param_group("adam")
                g.add_param("w", [1000])
                g.finalize()
                # Adam's values and two states, 4000 bytes each, each on a 4 KiB boundary.
                self.assertEqual(g.memory_stats().staging_bytes, 2 * 4096 + 4000 if reserve else 0)


if __name__ == "__main__":
    unittest.main()
