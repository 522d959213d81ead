"""sx's statuses become Python exceptions carrying the status and sx's message."""
import array
import os
import tempfile
import unittest

import sx
from _ranks import rendezvous


def single_rank_group(**kwargs):
    return sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1, **kwargs)


class ErrorTest(unittest.TestCase):
    def test_bad_rank_names_the_argument(self):
        with self.assertRaises(sx.InvalidArgumentError) as cm:
            sx.ShardGroup(rendezvous(), 5, 4)
        e = cm.exception
        self.assertIsInstance(e, sx.SxError)
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.status, sx.SX_ERR_INVALID_ARGUMENT)
        self.assertEqual(e.status_name, "SX_ERR_INVALID_ARGUMENT")
        self.assertIn("rank", e.message)
        self.assertIn("5", e.message)

    def test_bad_stage_and_malformed_rendezvous(self):
        with self.assertRaises(sx.SxError) as cm:
            sx.ShardGroup(rendezvous(), 0, 1, stage=7)
        self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_ARGUMENT)
        self.assertIn("stage", cm.exception.message)
        with self.assertRaises(sx.SxError) as cm:
            sx.ShardGroup("nonsense", 0, 1)
        self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_ARGUMENT)
        self.assertIn("rendezvous", cm.exception.message)

    def test_binding_side_checks(self):
        with self.assertRaisesRegex(sx.InvalidArgumentError, "backend.*'tpu'"):
            sx.ShardGroup(rendezvous(), 0, 1, backend="tpu")
        with single_rank_group() as g:
            with self.assertRaisesRegex(sx.InvalidArgumentError, "optimizer.*'lars'"):
                g.add_param_group("lars")
            with self.assertRaisesRegex(sx.InvalidArgumentError, "unknown hyperparameter 'lrate'"):
                g.add_param_group("adam", lrate=0.1)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "shape of 'w'"):
                g.add_param("w", 8)

    def test_shapes_must_be_integers(self):
        # int() would take each of these, and register another shape than the one given.
        with single_rank_group() as g:
            g.add_param_group("sgd")
            for shape in ([2.7, 3.9], [True, True], "44", [2, "3"], [2.0]):
                with self.assertRaisesRegex(sx.InvalidArgumentError, "shape of 'w'"):
                    g.add_param("w", shape)
            self.assertEqual(g.num_params, 0)
            self.assertEqual(g.add_param("w", (2, 3)), 0)

    def test_names_and_paths_holding_a_nul_are_refused(self):
        # C would read them only up to the NUL.
        with single_rank_group() as g:
            g.add_param_group("sgd")
            with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
                g.add_param("a\0b", [2])
            g.add_param("w", [2])
            g.finalize()
            with tempfile.TemporaryDirectory() as d:
                with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
                    g.save(os.path.join(d, "a\0b"), synchronous=True)
                self.assertEqual(os.listdir(d), [])
                with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
                    g.load(os.path.join(d, "a\0b"))
                with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
                    sx.read_user_blob(os.path.join(d, "a\0b"))
        with self.assertRaisesRegex(sx.InvalidArgumentError, "NUL"):
            sx.ShardGroup("local://a\0b", 0, 1, backend="cpu")

    def test_user_blobs_must_be_bytes_like(self):
        # bytes(5) would be five zero bytes; a str has no bytes of its own.
        with single_rank_group() as g:
            g.add_param_group("sgd")
            g.add_param("w", [2])
            g.finalize()
            with tempfile.TemporaryDirectory() as d:
                for blob in (5, "text", 2.5, [1, 2]):
                    with self.assertRaisesRegex(sx.InvalidArgumentError, "user_blob"):
                        g.save(os.path.join(d, "c"), user_blob=blob, synchronous=True)
                self.assertEqual(os.listdir(d), [])
                g.save(os.path.join(d, "c"), user_blob=bytearray(b"ok"), synchronous=True).wait()
                self.assertEqual(sx.read_user_blob(os.path.join(d, "c")), b"ok")
                g.save(os.path.join(d, "m"), user_blob=memoryview(b"view"), synchronous=True).wait()
                self.assertEqual(sx.read_user_blob(os.path.join(d, "m")), b"view")

    def test_library_side_checks(self):
        with single_rank_group() as g:
            g.add_param_group("sgd", lr=0.1)
            with self.assertRaises(sx.InvalidArgumentError) as cm:
                g.add_param("w", [4, -2])
            self.assertIn("shape", cm.exception.message)
            with self.assertRaises(sx.SxError) as cm:
                g.add_param("w", [4], param_group=3)
            self.assertIn("param group 3", cm.exception.message)
            g.add_param("w", [4])
            with self.assertRaises(sx.AlreadyExistsError) as cm:
                g.add_param("w", [4])
            self.assertEqual(cm.exception.status, sx.SX_ERR_ALREADY_EXISTS)
            with self.assertRaises(sx.SxError) as cm:
                g.param_view("w")  # before finalize
            self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_STATE)
            g.finalize()
            with self.assertRaises(sx.NotFoundError) as cm:
                g.param_view("nope")
            self.assertIn("nope", cm.exception.message)
            with self.assertRaises(sx.SxError) as cm:
                g.set_lr(0, -1.0)
            self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_ARGUMENT)
            self.assertIn("lr", cm.exception.message)
            with self.assertRaises(sx.SxError):
                g.param_view(9)

    def test_bad_loss_scaling_and_grad_dtype(self):
        with single_rank_group() as g:
            g.add_param_group()
            g.add_param("w", [4], dtype="bf16")
            g.finalize()
            with self.assertRaises(sx.InvalidArgumentError) as cm:
                g.set_loss_scaling("dynamic", backoff_factor=1.5)
            self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_ARGUMENT)
            self.assertIn("backoff_factor", cm.exception.message)
            self.assertIn("1.5", cm.exception.message)
            self.assertEqual(g.loss_scale, 1.0)  # a refused call changes nothing
            with self.assertRaisesRegex(sx.InvalidArgumentError, "mode.*'adaptive'"):
                g.set_loss_scaling("adaptive")
        with self.assertRaises(sx.InvalidArgumentError) as cm:
            single_rank_group(grad_dtype="bf16")
        self.assertIn("grad_dtype", cm.exception.message)

    def test_load_of_a_missing_checkpoint(self):
        with tempfile.TemporaryDirectory() as d, single_rank_group() as g:
            g.add_param_group()
            g.add_param("w", [4])
            g.finalize()
            missing = os.path.join(d, "none")
            with self.assertRaises(sx.SxError) as cm:
                g.load(missing)
            self.assertIn(cm.exception.status, (sx.SX_ERR_IO, sx.SX_ERR_NOT_FOUND))
            self.assertIn("none", cm.exception.message)
            with self.assertRaises(sx.SxError):
                sx.read_user_blob(missing)

    def test_openmp_threads_needs_a_loaded_runtime(self):
        def runtime_loaded():
            with open("/proc/self/maps") as f:
                return any(lib in f.read() for lib in ("libgomp", "libomp", "libiomp5"))

        if not runtime_loaded():
            with self.assertRaises(sx.UnsupportedError) as cm:
                single_rank_group(openmp_threads=True)
            self.assertIn("SX_GROUP_OPENMP_THREADS", cm.exception.message)
            self.assertIn("no OpenMP runtime is loaded", cm.exception.message)
        import ctypes
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)  # as torch loads its own
        with single_rank_group(openmp_threads=True) as g:
            g.add_param_group("sgd", lr=0.5)
            g.add_param("w", [3])
            g.finalize()
            g.grad_view("w")[:] = array.array("f", [1.0, 2.0, 4.0])
            g.step()
            self.assertEqual(list(g.param_view("w")), [-0.5, -1.0, -2.0])

    def test_status_strings(self):
        self.assertTrue(sx.status_string(sx.SX_ERR_TIMEOUT).startswith("SX_ERR_TIMEOUT"))
        e = sx.errors.error(sx.SX_ERR_MISMATCH, "ranks disagree")
        self.assertIsInstance(e, sx.MismatchError)
        self.assertEqual(str(e), "SX_ERR_MISMATCH: ranks disagree")


class LifetimeTest(unittest.TestCase):
    def test_use_after_close_raises_and_double_close_is_fine(self):
        g = single_rank_group()
        g.add_param_group()
        g.close()
        self.assertTrue(g.closed)
        with self.assertRaises(sx.InvalidHandleError) as cm:
            g.add_param("w", [4])
        self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_HANDLE)
        with self.assertRaises(sx.InvalidHandleError):
            _ = g.rank
        g.close()

    def test_with_block_closes_even_on_an_exception(self):
        with self.assertRaises(KeyError):
            with single_rank_group() as g:
                raise KeyError("boom")
        self.assertTrue(g.closed)

    def test_finalizer_releases_a_forgotten_group(self):
        name = rendezvous()
        g = sx.ShardGroup(name, 0, 1, backend="cpu", num_threads=1)
        finalizer = g._finalizer
        self.assertTrue(finalizer.alive)
        del g
        import gc
        gc.collect()
        self.assertFalse(finalizer.alive)


class RendezvousSecurityTest(unittest.TestCase):
    def test_rendezvous_token(self):
        """Over tcp://, a rank with a wrong token is refused at once; with the right one
        (and rank 0's server on every interface) the group forms."""
        import socket
        import threading
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = {}

        def rank0():
            try:
                with sx.ShardGroup(f"tcp://127.0.0.1:{port}", 0, 2, backend="cpu", num_threads=1,
                                   timeout_ms=30000, rendezvous_token="py-secret",
                                   rendezvous_bind="*") as g:
                    result["world"] = g.world_size
            except BaseException as e:
                result["error"] = e

        t = threading.Thread(target=rank0)
        t.start()
        try:
            # "localhost": another spelling of the address, so that this refused attempt
            # does not count as this process's group on tcp://127.0.0.1 (see key_space.cc).
            with self.assertRaisesRegex(sx.InvalidArgumentError, "does not match") as cm:
                sx.ShardGroup(f"tcp://localhost:{port}", 1, 2, backend="cpu", num_threads=1,
                              timeout_ms=30000, rendezvous_token="not-it")
            self.assertNotIn("py-secret", cm.exception.message)
            self.assertNotIn("not-it", cm.exception.message)
            with sx.ShardGroup(f"tcp://127.0.0.1:{port}", 1, 2, backend="cpu", num_threads=1,
                               timeout_ms=30000, rendezvous_token="py-secret") as g:
                self.assertEqual(g.world_size, 2)
        finally:
            t.join()
        self.assertNotIn("error", result)
        self.assertEqual(result["world"], 2)
        with self.assertRaisesRegex(sx.InvalidArgumentError, "rendezvous_token must be a str"):
            sx.ShardGroup(f"tcp://127.0.0.1:{port}", 0, 1, rendezvous_token=b"bytes")

    def test_world_size_bound(self):
        with self.assertRaisesRegex(sx.InvalidArgumentError, "SX_MAX_WORLD_SIZE"):
            sx.ShardGroup(rendezvous(), 0, sx._lib.SX_MAX_WORLD_SIZE + 1)


if __name__ == "__main__":
    unittest.main()
