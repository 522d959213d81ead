// Rank-ordered all-reduces over Gloo (ordered_all_reduce.h).
#include "comm/gloo/ordered_all_reduce.h"

#include <gloo/math.h>

#include <algorithm>
#include <vector>

namespace sx {
namespace comm {

Status rooted_all_reduce(OpScope &op, void *data, size_t n, size_t elem_bytes, ReduceFn reduce) {
    const size_t bytes = n * elem_bytes, others = static_cast<size_t>(op.size() - 1);
    UnboundBuffer *mine = op.buffer(data, bytes);
    if (op.rank() != 0) {
        // The result's receive is posted before the send, into a buffer of its own, so that
        // rank 0's reply never waits for it.
        char *result = op.scratch<char>(bytes);
        UnboundBuffer *back = op.buffer(result, bytes);
        back->recv(op.peer(0), op.slot(), 0, bytes);
        mine->send(op.peer(0), op.slot(), 0, bytes);
        if (!op.wait_send(mine, 0) || !op.wait_recv(back, 0)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
        std::copy(result, result + bytes, static_cast<char *>(data));
        op.done();
        return Status::Ok();
    }
    char *theirs = op.scratch<char>(others * bytes);
    UnboundBuffer *in = op.buffer(theirs, others * bytes);
    for (size_t q = 1; q <= others; ++q) in->recv(op.peer(static_cast<int>(q)), op.slot(), (q - 1) * bytes, bytes);
    for (size_t q = 1; q <= others; ++q)
        if (!op.wait_recv(in, -1)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    for (size_t q = 1; q <= others; ++q) reduce(data, data, theirs + (q - 1) * bytes, n);
    for (size_t q = 1; q <= others; ++q) mine->send(op.peer(static_cast<int>(q)), op.slot(), 0, bytes);
    for (size_t q = 1; q <= others; ++q)
        if (!op.wait_send(mine, static_cast<int>(q))) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    op.done();
    return Status::Ok();
}

namespace {

// Part q of n values over W ranks: [begin(q), begin(q + 1)), the first n % W parts one longer.
struct Parts {
    Parts(size_t n, size_t ranks) : per(n / ranks), extra(n % ranks) {}
    size_t begin(size_t q) const { return q * per + std::min(q, extra); }
    size_t size(size_t q) const { return per + (q < extra ? 1 : 0); }
    const size_t per, extra;
};

// Waits for `count` receives (sends) on b, from (to) any rank of the call.
bool wait_all(OpScope &op, UnboundBuffer *b, size_t count, bool recv) {
    for (size_t i = 0; i < count; ++i)
        if (!(recv ? op.wait_recv(b, -1) : op.wait_send(b, -1))) return false;
    return true;
}

}  // namespace

// Phase 1 sends every other rank its part of this rank's values and receives this rank's
// part from each (into `theirs`, in rank order); the sums go to this rank's part of data,
// whose other parts are then free: phase 2 sends this part to every rank and receives
// theirs in place. Sends and receives between one pair on the call's slot match in the
// order posted, so phase 2's never meet phase 1's. Parts of no values are not sent.
Status scattered_sum(OpScope &op, double *data, size_t n) {
    const size_t W = static_cast<size_t>(op.size()), r = static_cast<size_t>(op.rank());
    const Parts parts(n, W);
    const size_t mine = parts.size(r), at = parts.begin(r);
    double *theirs = op.scratch<double>((W - 1) * mine);
    UnboundBuffer *whole = op.buffer(data, n * sizeof(double));
    UnboundBuffer *in = mine ? op.buffer(theirs, (W - 1) * mine * sizeof(double)) : nullptr;
    size_t sends = 0, recvs = 0;
    for (size_t q = 0; q < W; ++q) {
        if (q == r) continue;
        if (parts.size(q) > 0) {
            whole->send(op.peer(static_cast<int>(q)), op.slot(), parts.begin(q) * sizeof(double),
                        parts.size(q) * sizeof(double));
            ++sends;
        }
        if (mine > 0) {
            in->recv(op.peer(static_cast<int>(q)), op.slot(), (q < r ? q : q - 1) * mine * sizeof(double),
                     mine * sizeof(double));
            ++recvs;
        }
    }
    if ((in && !wait_all(op, in, recvs, true)) || !wait_all(op, whole, sends, false))
        return SX_ERROR(SX_ERR_ABORTED, "aborted");

    // (((d_0 + d_1) + d_2) + ...): rank q's part is theirs' block q (q < r), data (q = r),
    // or theirs' block q - 1 (q > r).
    if (mine > 0) {
        auto part_of = [&](size_t q) -> const double * {
            return q == r ? data + at : theirs + (q < r ? q : q - 1) * mine;
        };
        std::vector<double> sum(part_of(0), part_of(0) + mine);
        for (size_t q = 1; q < W; ++q) gloo::sum<double>(sum.data(), sum.data(), part_of(q), mine);
        std::copy(sum.begin(), sum.end(), data + at);
    }

    sends = recvs = 0;
    for (size_t q = 0; q < W; ++q) {
        if (q == r) continue;
        if (mine > 0) {
            whole->send(op.peer(static_cast<int>(q)), op.slot(), at * sizeof(double), mine * sizeof(double));
            ++sends;
        }
        if (parts.size(q) > 0) {
            whole->recv(op.peer(static_cast<int>(q)), op.slot(), parts.begin(q) * sizeof(double),
                        parts.size(q) * sizeof(double));
            ++recvs;
        }
    }
    if (!wait_all(op, whole, recvs, true) || !wait_all(op, whole, sends, false))
        return SX_ERROR(SX_ERR_ABORTED, "aborted");
    op.done();
    return Status::Ok();
}

Status rank_ordered_sum(OpScope &op, double *data, size_t n, size_t rooted_bytes) {
    if (op.size() == 1 || n == 0) {
        op.done();
        return Status::Ok();
    }
    if (n * sizeof(double) <= (rooted_bytes ? rooted_bytes : kRootedSumBytes))
        return rooted_all_reduce(op, data, n, sizeof(double), &gloo::sum<double>);
    return scattered_sum(op, data, n);
}

}  // namespace comm
}  // namespace sx
