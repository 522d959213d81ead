"""A process that forks after creating a group (os.fork) cannot touch the group from the
child: 2 ranks as processes over file:// train 2 steps, each forks a child that leaves
through sys.exit (the interpreter's finalization closes what it inherited), or closes the
group first, or calls it (every call raises InvalidStateError naming the parent); the
parents train 3 more steps to the same params, bit for bit, as without a fork."""
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    np = None

RANK = r"""
import os, sys
import numpy as np
import sx

rank, url, mode, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
g = sx.ShardGroup(url, rank, 2, backend="cpu", num_threads=1, timeout_ms=60000)
g.add_param_group("adamw", lr=0.01)
g.add_param("w", [1000], unit=0)
g.add_param("b", [7], unit=1)
g.finalize()
for p in g.params():
    g.param_view(p.index)[...] = np.cos(np.arange(p.numel, dtype=np.float32) + p.index)
g.broadcast_params(0)


def train(first, steps):
    for s in range(first, first + steps):
        for p in g.params():
            g.grad_view(p.index)[...] = np.sin(np.arange(p.numel, dtype=np.float32) * 0.1 + s + rank)
        g.step()


train(0, 2)
if mode != "none":
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        if mode == "use":
            for call in (g.step, g.abort, lambda: g.param_view(0), lambda: g.rank):
                try:
                    call()
                except sx.InvalidStateError as e:
                    if f"process {parent}" not in str(e):
                        sys.exit(f"the error does not name the parent: {e}")
                else:
                    sys.exit("a call on the inherited group did not fail")
        if mode == "close":
            g.close()
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    if status != 0:
        sys.exit(f"the child ({mode}) exited with status {status}")
train(2, 3)
if rank == 0:
    np.save(out, np.concatenate([np.array(g.param_view(p.index)).ravel() for p in g.params()]))
g.close()
"""


@unittest.skipIf(np is None, "needs numpy")
class ForkTest(unittest.TestCase):
    def run_ranks(self, mode, work):
        url = "file://" + os.path.join(work, mode)
        out = os.path.join(work, mode + ".npy")
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), url, mode, out]) for r in range(2)]
        for p in procs:
            self.assertEqual(p.wait(timeout=120), 0, f"a rank of the run whose children do '{mode}' failed")
        return np.load(out)

    def test_the_parents_train_on_to_the_same_bits(self):
        work = tempfile.mkdtemp(prefix="sx-py-fork-")
        without = self.run_ranks("none", work)
        for mode in ("exit", "close", "use"):
            np.testing.assert_array_equal(self.run_ranks(mode, work), without, err_msg=mode)


if __name__ == "__main__":
    unittest.main()
