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

#include "comm/gloo/op_scope.h"

namespace sx {
namespace comm {

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

}  // namespace comm
}  // namespace sx
