"""offload=True through the binding: 2 ranks (threads over local://) of a CUDA group on
the simulated device (SX_SIMULATED_DEVICE=1, host memory behind a device's calls) keep
LAMB's state on the host; a CUDA group that does not offload keeps it, and runs LAMB, on the device. Two steps
change the param; the memory stats' device_bytes count the params and gradients on the
device but not the optimizer state, and are 0 for a CPU group."""
import ctypes
import os
import unittest

import sx
from _ranks import run_ranks

ROWS, COLS = 6, 4


def floats(view):
    """A ctypes float array over an sx_view_t: the simulated device's memory is host
    memory, which param_view (host memory only) does not wrap."""
    assert view.dtype == sx.SX_DTYPE_F32
    return (ctypes.c_float * view.numel).from_address(view.data)


def make(rank, name, backend, offload):
    return sx.ShardGroup(name, rank, 2, stage=2, backend=backend, num_threads=1, timeout_ms=60000,
                         offload=offload)


def train(rank, name, backend, offload):
    """Returns (w before, w after two LAMB steps, the memory stats, the view's device)."""
    with make(rank, name, backend, offload) as g:
        g.add_param_group("lamb", lr=0.01)
        g.add_param("w", [ROWS, COLS])
        g.finalize()
        w = floats(g.raw_view("w"))
        for k in range(ROWS * COLS):
            w[k] = (k % 7 - 3) / 8.0
        before = list(w)
        for step in range(2):
            dw = floats(g.raw_view("w", grad=True))
            for k in range(ROWS * COLS):
                dw[k] = ((k * 5 + step + rank) % 9 - 4) / 16.0
            g.step()
        return before, list(floats(g.raw_view("w"))), g.memory_stats(), g.raw_view("w").device


class OffloadTest(unittest.TestCase):
    def setUp(self):
        self._saved = os.environ.get("SX_SIMULATED_DEVICE")
        os.environ["SX_SIMULATED_DEVICE"] = "1"  # read when a CUDA group is created

    def tearDown(self):
        if self._saved is None:
            del os.environ["SX_SIMULATED_DEVICE"]
        else:
            os.environ["SX_SIMULATED_DEVICE"] = self._saved

    def test_constants(self):
        self.assertEqual((sx.SX_OFFLOAD_NONE, sx.SX_OFFLOAD_STATE), (0, 1))

    def test_an_offloaded_cuda_group_steps_lamb_with_its_state_on_the_host(self):
        for offload in (True, sx.SX_OFFLOAD_STATE):
            with self.subTest(offload=offload):
                results = run_ranks(2, train, "cuda", offload)
                for before, after, stats, device in results:
                    self.assertEqual(device, sx.SX_DEVICE_CUDA)
                    self.assertNotEqual(before, after)
                    self.assertGreater(stats.optimizer_bytes, 0)
                    # The params and their flat gradient buffer (fp32: as large) are on the
                    # device; the masters, LAMB's state and the reduced gradient shard are not.
                    self.assertEqual(stats.device_bytes, 2 * stats.param_bytes)
                    self.assertGreater(stats.device_bytes, 0)
                    self.assertLess(stats.device_bytes,
                                    stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes)
                # Both ranks stepped the same replicated param.
                self.assertEqual(results[0][1], results[1][1])

    def test_a_cuda_group_that_keeps_its_state_on_the_device_steps_lamb_there(self):
        results = run_ranks(2, train, "cuda", False)
        for before, after, stats, device in results:
            self.assertEqual(device, sx.SX_DEVICE_CUDA)
            self.assertNotEqual(before, after)
            self.assertGreater(stats.optimizer_bytes, 0)
            self.assertEqual(stats.device_bytes, stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes)
        self.assertEqual(results[0][1], results[1][1])

    def test_a_cpu_group_has_no_device_bytes(self):
        for before, after, stats, device in run_ranks(2, train, "cpu", True):
            self.assertEqual(device, sx.SX_DEVICE_CPU)
            self.assertNotEqual(before, after)
            self.assertEqual(stats.device_bytes, 0)
            self.assertGreater(stats.param_bytes, 0)


if __name__ == "__main__":
    unittest.main()
