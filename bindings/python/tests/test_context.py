"""Contexts over local:// with ranks as threads: two groups made in one by name, each
finalized and stepped; the context's stats; a duplicate live name refused; and the
lifetime of the handle against its groups."""
import unittest

import sx
from _ranks import fill, run_ranks, tolist

WORLD = 2


def make_context(rank, name, **kwargs):
    # A short timeout: a test that goes wrong fails in a minute instead of five.
    return sx.Context(name, rank, WORLD, backend="cpu", num_threads=1, timeout_ms=60000, **kwargs)


def train_once(g, size):
    g.add_param_group("sgd", lr=1.0)
    g.add_param("w", [size])
    g.finalize()
    fill(g.grad_view("w"), [1.0] * size)
    result = g.step()
    return result.step, tolist(g.param_view("w"))


class ContextTest(unittest.TestCase):
    def test_two_groups_in_a_context(self):
        def rank_main(rank, name):
            with make_context(rank, name) as ctx:
                a = ctx.group("tenant-a")
                b = sx.ShardGroup(context=ctx, name="tenant-b", stage=1)
                self.assertEqual((a.rank, a.world_size), (rank, WORLD))
                self.assertEqual((b.stage, b.world_size), (1, WORLD))
                self.assertEqual(train_once(a, 16), (1, [-1.0] * 16))
                self.assertEqual(train_once(b, 8), (1, [-1.0] * 8))
                s = ctx.stats()
                self.assertEqual((s.groups, s.groups_created), (2, 2))
                self.assertTrue(s.shared_memory)
                self.assertEqual(s.transport_bytes, 0)  # no Gloo channels in shared memory
                self.assertGreater(s.memory_bytes, 0)
                self.assertEqual(s.memory_budget_bytes, 0)
                self.assertGreaterEqual(s.channels, 2)
                # A live group's name is refused on every rank, and nothing is made.
                with self.assertRaises(sx.InvalidStateError) as cm:
                    ctx.group("tenant-a")
                self.assertEqual(cm.exception.status, sx.SX_ERR_INVALID_STATE)
                self.assertEqual(ctx.stats().groups, 2)
                a.close()
                b.close()
                s = ctx.stats()
                self.assertEqual((s.groups, s.memory_bytes, s.groups_created), (0, 0, 2))
                # A gone group's name may be used again.
                with ctx.group("tenant-a") as again:
                    self.assertEqual(train_once(again, 4), (1, [-1.0] * 4))
            return True

        self.assertEqual(run_ranks(WORLD, rank_main), [True] * WORLD)

    def test_a_gloo_contexts_channels_keep_their_blocks(self):
        # Every channel of a context on Gloo's TCP mesh sends from and receives into blocks
        # of its own, kept for its next calls: counted in transport_bytes, not memory_bytes.
        def rank_main(rank, name):
            with make_context(rank, name, transport="tcp") as ctx:
                self.assertEqual(ctx.stats().transport_bytes, 0)
                with ctx.group("tenant") as g:
                    self.assertEqual(train_once(g, 1000), (1, [-1.0] * 1000))
                    s = ctx.stats()
                    self.assertFalse(s.shared_memory)
                    self.assertGreaterEqual(s.transport_bytes, 1000 * 4 // WORLD)
                    held = s.memory_bytes
                # A gone group's channels give their blocks back.
                self.assertEqual(ctx.stats().transport_bytes, 0)
                self.assertGreater(held, 0)
            return True

        self.assertEqual(run_ranks(WORLD, rank_main), [True] * WORLD)

    def test_groups_outlive_the_handle(self):
        def rank_main(rank, name):
            ctx = make_context(rank, name, memory_budget_bytes=1 << 20)
            self.assertEqual(ctx.stats().memory_budget_bytes, 1 << 20)
            g = ctx.group("kept")
            ctx.close()
            ctx.close()  # idempotent
            self.assertTrue(ctx.closed)
            with self.assertRaises(sx.InvalidHandleError):
                ctx.stats()
            with self.assertRaises(sx.InvalidHandleError):
                ctx.group("refused")
            # The group goes on in the context after its handle went.
            with g:
                self.assertEqual(train_once(g, 4), (1, [-1.0] * 4))
            return True

        self.assertEqual(run_ranks(WORLD, rank_main), [True] * WORLD)

    def test_arguments(self):
        name = f"local://pytest-context-args-{id(self)}"
        with sx.Context(name, 0, 1, backend="cpu", num_threads=1) as ctx:
            # A group in a context needs a name; fields the context owns must match it.
            with self.assertRaisesRegex(sx.InvalidArgumentError, "name"):
                sx.ShardGroup(context=ctx)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "rendezvous"):
                sx.ShardGroup("local://elsewhere", context=ctx, name="x")
            with self.assertRaisesRegex(sx.InvalidArgumentError, "sx.Context"):
                sx.ShardGroup(context="ctx", name="x")
            self.assertEqual(ctx.stats().groups_created, 0)
        with self.assertRaisesRegex(sx.InvalidArgumentError, "rendezvous is required"):
            sx.ShardGroup()
        with self.assertRaisesRegex(sx.InvalidArgumentError, "context"):
            sx.ShardGroup(name, 0, 1, backend="cpu", name="no-context")


if __name__ == "__main__":
    unittest.main()
