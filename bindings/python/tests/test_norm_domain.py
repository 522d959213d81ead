"""Norm domains over local:// with ranks as threads: two slices (each a group of one rank)
of a tensor split in halves, joined to one domain, take the norm of the whole tensor and
clip by it alike; a replicated param counts once; bad placements are refused."""
import math
import unittest

import sx
from _ranks import fill, run_ranks, rendezvous, tolist


class NormDomainTest(unittest.TestCase):
    def test_two_slices_clip_by_the_whole_norm(self):
        groups = [rendezvous(), rendezvous()]

        def rank_main(rank, name):
            g = sx.ShardGroup(groups[rank], 0, 1, backend="cpu", num_threads=1, timeout_ms=60000)
            g.add_param_group("sgd", lr=1.0)
            g.add_param("w", [2], split=([4], 0, 2 * rank))
            g.add_param("b", [1], replica=(rank, 2))
            g.finalize()
            with sx.NormDomain(name, rank, 2, timeout_ms=60000) as domain:
                g.join_norm_domain(domain, rank)
            # The slices' halves of w: [3, 0] and [0, 4]; b's gradient 1 on both copies.
            fill(g.grad_view("w"), [3.0, 0.0] if rank == 0 else [0.0, 4.0])
            fill(g.grad_view("b"), [1.0])
            result = g.step(max_grad_norm=1.0)
            return result.grad_norm, tolist(g.param_view("w"))

        out = run_ranks(2, rank_main)
        norm = math.sqrt(9 + 16 + 1)  # b counted once
        self.assertEqual(out[0][0], out[1][0])
        self.assertAlmostEqual(out[0][0], norm, places=12)
        coef = 1.0 / (norm + 1e-6)
        self.assertAlmostEqual(out[0][1][0], -3.0 * coef, places=6)
        self.assertAlmostEqual(out[1][1][1], -4.0 * coef, places=6)

    def test_bad_placement_is_refused(self):
        with sx.ShardGroup(rendezvous(), 0, 1, backend="cpu", num_threads=1) as g:
            g.add_param_group("sgd", lr=1.0)
            with self.assertRaisesRegex(sx.InvalidArgumentError, "does not fit"):
                g.add_param("w", [4, 5], split=([8, 5], 0, 6))
            with self.assertRaisesRegex(sx.InvalidArgumentError, "replica 2 is outside"):
                g.add_param("n", [5], replica=(2, 2))
            self.assertEqual(g.add_param("w", [4, 5], split=([8, 5], 0, 4)), 0)


if __name__ == "__main__":
    unittest.main()
