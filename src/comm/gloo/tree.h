// Collectives of a sparse Gloo mesh (full_mesh.h's sparse_peers): each moves data only
// between ranks at a distance of a power of two round the call's ring, so each rank
// holds 2 log2 W pairs rather than W - 1.
//
// - Binomial trees rooted at any rank (virtual rank v = (rank - root) mod W; v's parent
//   is v - lowbit(v), its children v + 2^i for 2^i below lowbit(v), and its subtree the
//   virtual ranks [v, v + lowbit(v)), cut at W). Every edge joins ranks 2^i apart.
// - A chain along the ring from the call's rank 0 to its rank W - 1, each rank adding its
//   values to what came from its left: the left fold (((x_0 + x_1) + x_2) + ...), the
//   same bits as a sum in rank order anywhere else.
//
// The results are those of the full mesh's collectives (ordered_all_reduce.h, ring.h's
// exchange_pieces), bit for bit; they take log2 W (trees) or W (the chain's first
// segment) hops instead of one. Every call uses the call's one slot: messages between one
// pair, in one direction, match in the order posted, which both sides keep.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "comm/gloo/op_scope.h"
#include "comm/gloo/ordered_all_reduce.h"

namespace sx {
namespace comm {

// rooted_all_reduce on a tree: the call's rank 0 gathers every rank's values up a binomial
// tree, combines them in rank order (data_0, then reduce(., data_q) for q = 1, 2, ...) and
// sends the result down it. Errors as ring.h's.
Status tree_all_reduce(OpScope &op, void *data, size_t n, size_t elem_bytes, ReduceFn reduce);

// The same `bytes` from `root` to every rank of the call, down the binomial tree rooted
// there. Errors as ring.h's.
Status tree_broadcast(OpScope &op, int root, void *data, size_t bytes);

// rank_ordered_sum (ordered_all_reduce.h) on a sparse mesh: up to `rooted_bytes` (0: the
// default) tree_all_reduce; beyond, the chain in segments of `segment_elems`, whose last
// rank broadcasts the sums down a tree.
Status sparse_ordered_sum(OpScope &op, double *data, size_t n, size_t rooted_bytes, size_t segment_elems);

// exchange_pieces (ring.h) on a sparse mesh: every rank's byte count first goes up the tree
// rooted at `root` (so each rank knows its subtree's), then the bytes themselves go up it
// (gather: each rank sends its subtree's pieces, packed in rank order) or down it
// (scatter). Root's pieces for rank q must hold as many bytes as q's own: SX_ERR_INVALID_ARG
// on root where they do not (the other ranks then fail as at a broken connection).
Status tree_exchange_pieces(OpScope &op, int root, const std::vector<Piece> &mine,
                            const std::vector<std::vector<Piece>> &theirs, bool gather);

}  // namespace comm
}  // namespace sx
