// Ring collectives over Gloo's unbound buffers, pipelined in segments. Gloo 0.5 has
// no reduce-scatter with timeouts and tags; these give every collective of the
// communicator the same shape: one slot per call, one deadline per call, every wait
// checked for abort.
//
// Both follow the classic ring (Patarasuk & Yuan, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations", 2009): P-1 steps, each rank sends one
// chunk to its right neighbour and receives one from its left per step; the chunk is
// cut into segments so that step s+1 of a segment starts as soon as step s of that
// segment has arrived. Sends and receives on one slot between one pair of ranks
// match in the order they are posted (Gloo queues them per slot and pair), which is
// what lets every segment of a call share the call's slot.
#pragma once

#include <cstddef>
#include <cstdint>

#include <vector>

#include "comm/communicator.h"
#include "comm/gloo/op_scope.h"

namespace sx {
namespace comm {

// Default segment sizes of the rings (GlooOptions::segment_bytes): large enough that
// the per-message cost (a notification round trip in Gloo's rendezvous protocol)
// vanishes, small enough that the pipeline fills quickly. Measured with bench_comm
// (2 ranks, 64 MiB): smaller segments cost up to 10%, larger ones gain nothing.
constexpr size_t kReduceScatterSegmentBytes = 1 << 20;
constexpr size_t kAllGatherSegmentBytes = 4 << 20;

// On return out[0, shard) = (accumulate ? out + : ) sum over ranks of their
// buf[rank*shard, +shard); buf is used as scratch. out may be this rank's own chunk
// buf + rank*shard (in place; not with accumulate), which is never sent. SX_ERR_ABORTED if abort() woke a
// wait; Gloo's exceptions (timeout, failed peer) propagate.
Status ring_reduce_scatter(OpScope &op, float *buf, size_t shard, float *out, bool accumulate,
                           size_t segment_elems);

// The same over 16-bit values of dtype (SX_DTYPE_F16 or SX_DTYPE_BF16): every addition
// rounds to the dtype; on return out[0, shard) = (accumulate ? out + : ) out_scale *
// (the sum, widened to fp32). out never overlaps buf.
Status ring_reduce_scatter_16(OpScope &op, int32_t dtype, uint16_t *buf, size_t shard, float *out,
                              float out_scale, bool accumulate, size_t segment_elems);

// buf holds P parts of shard_bytes; this rank's part is sent around the ring until
// every part holds its rank's bytes. Errors as above.
Status ring_all_gather(OpScope &op, char *buf, size_t shard_bytes, size_t segment_bytes);

// gather_pieces (`gather`) or scatter_pieces (communicator.h) over the call's ranks: root
// exchanges pieces with every other rank on the call's slot. Each piece has a buffer of its
// own, whose one send or receive is waited for; pieces between one pair on one slot match
// in the order they are posted. Errors as above.
Status exchange_pieces(OpScope &op, int root, const std::vector<Piece> &mine,
                       const std::vector<std::vector<Piece>> &theirs, bool gather);

// Whether Gloo's error text says a wait timed out.
bool mentions_timeout(const std::string &text);

}  // namespace comm
}  // namespace sx
