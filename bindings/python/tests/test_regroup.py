"""ShardGroup.regroup through the binding: 3 ranks (threads over local://) save a
checkpoint, train on, and abort; rank 2 leaves, and ranks 0 and 1 regroup into 2 ranks
from the checkpoint. The result names the epoch, the new places and the checkpoint's
step; the params are the checkpoint's and the group steps on at 2 ranks, as a fresh
group of 2 loading the checkpoint does; aborted again, the two form epoch 2. A regroup
without a checkpoint is refused, and a rank that comes after the others' join window is
told it is not in. With memory copies, the two regroup without a checkpoint: their state
is the copy's, as 2 ranks loading a checkpoint of that step have it. A 4th process joins 3
ranks (a 4th thread with join=True): after the members admit it, the 4 train as 4 ranks
loading a checkpoint of the step it joined at."""
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import sx
from _ranks import run_ranks

try:
    import numpy as np
except ImportError:
    np = None


def make(rank, name, world, **config):
    g = sx.ShardGroup(name, rank, world, backend="cpu", num_threads=1, timeout_ms=60000, **config)
    g.add_param_group("adamw", lr=0.01)
    g.add_param("w", [37], unit=0)
    g.add_param("b", [5], unit=1)
    g.finalize()
    return g


def train(g, steps, first):
    for s in range(first, first + steps):
        for p in g.params():
            g.grad_view(p.index)[...] = ((np.arange(p.numel, dtype=np.float32) * 7 + s * 3 + g.rank) % 11 - 5) / 8
        g.step()


def reference_of(world, ckpt, step):
    """Per rank of `world` fresh ranks loading ckpt (of `step`) and taking 2 more steps."""
    def rank_fn(rank, name):
        with make(rank, name, world) as g:
            g.load(ckpt)
            train(g, 2, step)
            return params(g)
    return run_ranks(world, rank_fn)


def params(g):
    return {p.name: np.array(g.param_view(p.index)) for p in g.params()}


def reference(ckpt, step):
    """Per rank of 2 fresh ranks loading ckpt (of `step`): the params loaded, and after 2
    more steps."""
    def rank_fn(rank, name):
        with make(rank, name, 2) as g:
            g.load(ckpt)
            before = params(g)
            train(g, 2, step)
            return before, params(g)
    return run_ranks(2, rank_fn)


@unittest.skipIf(np is None, "needs numpy")
class RegroupTest(unittest.TestCase):
    def test_two_survivors_of_three(self):
        work = tempfile.mkdtemp(prefix="sx-py-regroup-")
        ckpt = os.path.join(work, "step-2")
        left = threading.Barrier(3)

        def rank_fn(rank, name):
            g = make(rank, name, 3)
            try:
                train(g, 2, 0)
                g.save(ckpt, synchronous=True).wait()
                train(g, 1, 2)  # a step the regroup takes back
                g.abort()
                left.wait()
                if rank == 2:
                    return None  # lost: leaves the others to regroup
                with self.assertRaises(sx.InvalidArgumentError):
                    g.regroup("")
                result = g.regroup(ckpt, expected_world_size=2)
                after = {p.name: np.array(g.param_view(p.index)) for p in g.params()}
                train(g, 2, result.step)
                final = {p.name: np.array(g.param_view(p.index)) for p in g.params()}
                # Both abort again and form the next epoch, the same 2 ranks.
                g.abort()
                again = g.regroup(ckpt, expected_world_size=2)
                return result, after, final, again
            finally:
                g.close()

        results = run_ranks(3, rank_fn)

        want = reference(ckpt, 2)
        for rank in (0, 1):
            result, after, final, again = results[rank]
            self.assertEqual((again.epoch, again.rank, again.world_size, again.previous_world_size, again.step),
                             (2, rank, 2, 2, 2))
            self.assertEqual(result, sx.RegroupResult(epoch=1, rank=rank, world_size=2, shard_size=2,
                                                      previous_rank=rank, previous_world_size=3, step=2))
            for name in ("w", "b"):
                np.testing.assert_array_equal(after[name], want[rank][0][name])
                np.testing.assert_array_equal(final[name], want[rank][1][name])

    def test_from_memory_copies(self):
        work = tempfile.mkdtemp(prefix="sx-py-regroup-memory-")
        ckpt = os.path.join(work, "step-3")
        left = threading.Barrier(3)

        def rank_fn(rank, name):
            g = make(rank, name, 3, memory_copy_interval=1)
            try:
                train(g, 3, 0)
                g.save(ckpt, synchronous=True).wait()  # the reference's, not the regroup's
                # This rank's two copies and its predecessor's two: 4 x (values + 2 AdamW slots).
                stats = g.memory_stats()
                self.assertEqual(stats.memory_copy_bytes, 4 * stats.optimizer_bytes * 3 // 2)
                g.abort()
                left.wait()
                if rank == 2:
                    return None
                result = g.regroup(expected_world_size=2)
                after = {p.name: np.array(g.param_view(p.index)) for p in g.params()}
                train(g, 2, result.step)
                return result, after, {p.name: np.array(g.param_view(p.index)) for p in g.params()}
            finally:
                g.close()

        results = run_ranks(3, rank_fn)

        want = reference(ckpt, 3)
        for rank in (0, 1):
            result, after, final = results[rank]
            self.assertEqual(result, sx.RegroupResult(epoch=1, rank=rank, world_size=2, shard_size=2,
                                                      previous_rank=rank, previous_world_size=3, step=3,
                                                      from_memory=True))
            for name in ("w", "b"):
                np.testing.assert_array_equal(after[name], want[rank][0][name])
                np.testing.assert_array_equal(final[name], want[rank][1][name])

    def test_a_process_joins(self):
        work = tempfile.mkdtemp(prefix="sx-py-regroup-join-")
        ckpt = os.path.join(work, "step-2")

        def rank_fn(rank, name):
            if rank == 3:  # the joining process: registers as the members do, then waits
                g = make(0, name, 1, join=True)
                try:
                    result = g.regroup()
                    train(g, 2, result.step)
                    return result, params(g)
                finally:
                    g.close()
            g = make(rank, name, 3)
            try:
                train(g, 2, 0)
                waiting = 0
                for _ in range(3000):
                    waiting = g.poll_joiners()
                    if waiting:
                        break
                    time.sleep(0.01)
                g.save(ckpt, synchronous=True).wait()  # the reference's
                result = g.regroup(admit=waiting)
                train(g, 2, result.step)
                return result, params(g)
            finally:
                g.close()

        results = run_ranks(4, rank_fn)
        want = reference_of(4, ckpt, 2)
        for rank in range(4):
            result, final = results[rank]
            self.assertEqual(result, sx.RegroupResult(epoch=1, rank=rank, world_size=4, shard_size=4,
                                                      previous_rank=rank if rank < 3 else -1, previous_world_size=3,
                                                      step=2, from_memory=True))
            for name in ("w", "b"):
                np.testing.assert_array_equal(final[name], want[rank][name])

    def test_a_rank_after_the_window_is_not_in(self):
        """Ranks 0 and 1 close the group when their 1000 ms window ends; rank 2, later, is
        told it is not in, and the two go on."""
        left = threading.Barrier(3)
        work = tempfile.mkdtemp(prefix="sx-py-regroup-late-")
        ckpt = os.path.join(work, "step-1")

        def rank_fn(rank, name):
            g = make(rank, name, 3)
            try:
                train(g, 1, 0)
                g.save(ckpt, synchronous=True).wait()
                g.abort()
                left.wait()
                if rank == 2:
                    time.sleep(3.0)
                    with self.assertRaises(sx.InvalidStateError) as late:
                        g.regroup(ckpt, join_window_ms=1000)
                    return str(late.exception)
                result = g.regroup(ckpt, join_window_ms=1000)
                train(g, 1, result.step)
                return result
            finally:
                g.close()

        results = run_ranks(3, rank_fn)
        self.assertEqual([(r.rank, r.world_size) for r in results[:2]], [(0, 2), (1, 2)])
        self.assertIn("after it closed", results[2])
        self.assertIn("(ranks 0 (epoch 0), 1 (epoch 0)) formed it without this rank", results[2])

    def test_lost_ranks_of_processes(self):
        """This process is rank 0 of 3 with two other processes (over file://, sharing
        memory); rank 2's process exits at once after the group formed, and lost_ranks()
        names it, and only it, while rank 1 lives; a group of threads knows of no loss."""
        work = tempfile.mkdtemp(prefix="sx-py-lost-")
        url = "file://" + work
        peer = ("import os, sys, time, sx\n"
                "rank = int(sys.argv[1])\n"
                "g = sx.ShardGroup(sys.argv[2], rank, 3, backend='cpu', num_threads=1, timeout_ms=60000)\n"
                "if rank == 2: os._exit(0)\n"
                "sys.stdin.read()\n")
        procs = [subprocess.Popen([sys.executable, "-c", peer, str(r), url], stdin=subprocess.PIPE)
                 for r in (1, 2)]
        try:
            g = sx.ShardGroup(url, 0, 3, backend="cpu", num_threads=1, timeout_ms=60000)
            try:
                lost = []
                for _ in range(500):
                    lost = g.lost_ranks()
                    if lost:
                        break
                    time.sleep(0.01)
                self.assertEqual(lost, [2])
            finally:
                g.close()
        finally:
            procs[0].stdin.close()
            for p in procs:
                p.wait(timeout=60)

        def rank_fn(rank, name):
            with make(rank, name, 2) as g:
                return g.lost_ranks()
        self.assertEqual(run_ranks(2, rank_fn), [[], []])


if __name__ == "__main__":
    unittest.main()
