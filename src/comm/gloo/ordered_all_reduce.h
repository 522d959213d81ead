// All-reduces over Gloo's unbound buffers whose every element is combined in rank order,
// ((d_0 + d_1) + d_2) + ... + d_{W-1}, on every rank: the same bits as shared memory's
// all-reduce gives, whatever the transport (Communicator::sums_in_rank_order).
//
// Two shapes, both over the call's ranks (a communicator's, or a context channel's):
//  - rooted: the call's rank 0 receives every other rank's values, combines them in rank
//    order and sends the result back. Two messages per rank but rank 0, which handles
//    2 (W - 1): the one to take where latency, not bytes, counts;
//  - scattered: the values are cut into W parts, part q to rank q; each rank receives its
//    part from every other rank, adds the W of them in rank order, and sends the sums to
//    every other rank. Each rank sends and receives about 2 (W - 1) / W of the values, and
//    none gathers all of them (a ring's reduce-scatter would add in an order of its own).
#pragma once

#include <cstddef>

#include "comm/gloo/op_scope.h"

namespace sx {
namespace comm {

// c[i] = a[i] + b[i] (or max, ...) over n elements: Gloo's reduce functions (gloo/math.h).
using ReduceFn = void (*)(void *, const void *, const void *, size_t);

// From this size (bytes) a rank-ordered double sum is scattered; below it, rooted
// (GlooOptions::rooted_sum_bytes overrides it). Measured with `bench_sx param_sums`.
constexpr size_t kRootedSumBytes = 16 << 10;

// data[0, n) of elem_bytes each = reduce over the call's ranks in rank order, through the
// call's rank 0. SX_ERR_ABORTED if abort() woke a wait; Gloo's exceptions (timeout,
// failed peer) propagate.
Status rooted_all_reduce(OpScope &op, void *data, size_t n, size_t elem_bytes, ReduceFn reduce);

// data[0, n) = the sum over the call's ranks, added in rank order, through the parts.
// Errors as above.
Status scattered_sum(OpScope &op, double *data, size_t n);

// rooted_all_reduce's sum up to rooted_bytes (0: kRootedSumBytes), else scattered_sum.
Status rank_ordered_sum(OpScope &op, double *data, size_t n, size_t rooted_bytes);

}  // namespace comm
}  // namespace sx
