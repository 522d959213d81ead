#include "comm/gloo/ring.h"

#include <algorithm>
#include <cctype>
#include <memory>

#include "base/half.h"

namespace sx {
namespace comm {
namespace {

// Receives in flight per call: one being summed while the others arrive.
constexpr size_t kRecvDepth = 4;

// Elements converted at a time through a stack buffer (16-bit sums).
constexpr size_t kPiece = 1024;

// The ring position of a call: rank, size, neighbours (the call's ranks; to_right and
// to_left: the context's ranks they are), and the chunk index helper.
struct Ring {
    explicit Ring(const OpScope &op)
        : rank(op.rank()), size(op.size()), right((rank + 1) % size), left((rank + size - 1) % size),
          to_right(op.peer(right)), to_left(op.peer(left)) {}
    // Chunk (rank - back) mod size.
    size_t chunk_behind(size_t back) const {
        return static_cast<size_t>((rank - static_cast<int>(back % size) + size) % size);
    }
    const int rank, size, right, left, to_right, to_left;
};

// The sums a ring reduce-scatter needs, over element type T; the result is fp32.
struct FloatSum {
    using T = float;
    void add_into(float *__restrict dst, const float *__restrict src, size_t n) const {
        for (size_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    // The final step: out = (accumulate ? out : 0) + partial + received.
    void finish(float *__restrict out, const float *__restrict partial, const float *__restrict received,
                size_t n, bool accumulate) const {
        if (accumulate) {
            for (size_t i = 0; i < n; ++i) out[i] += partial[i] + received[i];
        } else {
            for (size_t i = 0; i < n; ++i) out[i] = partial[i] + received[i];
        }
    }
    bool in_place(const float *partial, const float *out) const { return partial == out; }
};

// fp16 / bf16: every addition rounds to the dtype, as a reduction in that dtype does;
// the final sum is widened to fp32 (times out_scale, exact for a power of two) into out.
struct HalfSum {
    using T = uint16_t;
    int32_t dtype;
    float out_scale;
    void add_into(uint16_t *dst, const uint16_t *src, size_t n) const { half::add_into(dtype, dst, src, n); }
    // out = (accumulate ? out : 0) + out_scale * float(sum[0, n)).
    void widen_into(float *out, const uint16_t *sum, size_t n, bool accumulate) const {
        float wide[kPiece];
        for (size_t i = 0; i < n; i += kPiece) {
            const size_t m = std::min(kPiece, n - i);
            half::to_f32(dtype, sum + i, wide, m);
            for (size_t k = 0; k < m; ++k) out[i + k] = (accumulate ? out[i + k] : 0.0f) + wide[k] * out_scale;
        }
    }
    void finish(float *out, const uint16_t *partial, const uint16_t *received, size_t n, bool accumulate) const {
        uint16_t sum[kPiece];
        for (size_t i = 0; i < n; i += kPiece) {
            const size_t m = std::min(kPiece, n - i);
            std::copy(partial + i, partial + i + m, sum);
            half::add_into(dtype, sum, received + i, m);
            widen_into(out + i, sum, m, accumulate);
        }
    }
    bool in_place(const uint16_t *, const float *) const { return false; }
};

// Unit u = s * nseg + k is segment k of step s. At step s rank r sends chunk r-s-1
// (its own data at s = 0, afterwards the partial sum it completed at step s-1) and
// receives chunk r-s-2, into which it adds the received partial; at the last step,
// s = P-2, the received chunk is r itself and the sum goes to out. A chunk is thus
// first received into (step s-1), then sent (step s), and never written after it
// was sent, so a posted send always reads final data.
//
// Where buf must be staged (OpScope::stages: a channel's call, whose buffers cover only
// memory of its own), the sends go from a block of the call's own instead: this rank's
// chunk is copied there segment by segment as each is sent, and each partial sum is made
// there, so that buf is only read
// (and out, where it is buf's own chunk, written in place).
template <class Sum>
Status ring_reduce_scatter_with(OpScope &op, const Sum &sum, typename Sum::T *buf, size_t shard, float *out,
                                bool accumulate, size_t segment_elems) {
    using T = typename Sum::T;
    const Ring ring(op);
    const size_t seg = std::min(segment_elems, shard);
    const size_t nseg = (shard + seg - 1) / seg;
    const size_t steps = static_cast<size_t>(ring.size - 1);
    const size_t units = steps * nseg;
    const size_t depth = std::min(kRecvDepth, units);
    T *scratch = op.scratch<T>(depth * seg, false);  // not zeroed: always written before read

    const size_t total = static_cast<size_t>(ring.size) * shard;
    T *from = op.stages(buf, total * sizeof(T)) ? op.scratch<T>(total, false) : buf;
    UnboundBuffer *send = op.buffer(from, total * sizeof(T));
    UnboundBuffer *recv = op.buffer(scratch, depth * seg * sizeof(T));
    auto seg_len = [&](size_t k) { return std::min(seg, shard - k * seg); };
    auto post_send = [&](size_t u) {
        const size_t s = u / nseg, k = u % nseg;
        const size_t at = ring.chunk_behind(s + 1) * shard + k * seg;
        if (s == 0 && from != buf) std::copy_n(buf + at, seg_len(k), from + at);  // own data, staged as it goes
        send->send(ring.to_right, op.slot(), at * sizeof(T), seg_len(k) * sizeof(T));
    };
    auto post_recv = [&](size_t u) {
        recv->recv(ring.to_left, op.slot(), (u % depth) * seg * sizeof(T), seg_len(u % nseg) * sizeof(T));
    };

    size_t sends = 0;
    for (size_t k = 0; k < nseg; ++k, ++sends) post_send(k);  // step 0 sends own data: ready now
    for (size_t u = 0; u < depth; ++u) post_recv(u);
    for (size_t u = 0; u < units; ++u) {
        if (!op.wait_recv(recv, ring.left)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
        const size_t s = u / nseg, k = u % nseg, n = seg_len(k);
        const T *received = scratch + (u % depth) * seg;
        const size_t at = ring.chunk_behind(s + 2) * shard + k * seg;
        T *partial = buf + at;
        if (s + 1 < steps) {
            if (from != buf) std::copy(partial, partial + n, from + at);
            sum.add_into(from + at, received, n);
            post_send(u + nseg);
            ++sends;
        } else if (sum.in_place(partial, out + k * seg)) {
            sum.add_into(partial, received, n);  // in place: out is this rank's own chunk of buf
        } else {
            sum.finish(out + k * seg, partial, received, n, accumulate);
        }
        if (u + depth < units) post_recv(u + depth);  // reuses the scratch slot just consumed
    }
    for (size_t i = 0; i < sends; ++i)
        if (!op.wait_send(send, ring.right)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    op.done();
    return Status::Ok();
}

}  // namespace

Status ring_reduce_scatter(OpScope &op, float *buf, size_t shard, float *out, bool accumulate,
                           size_t segment_elems) {
    const FloatSum sum;
    if (op.size() == 1 || shard == 0) {
        if (shard != 0 && out != buf) {
            if (accumulate) {
                sum.add_into(out, buf, shard);
            } else {
                std::copy(buf, buf + shard, out);
            }
        }
        op.done();
        return Status::Ok();
    }
    return ring_reduce_scatter_with(op, sum, buf, shard, out, accumulate, segment_elems);
}

Status ring_reduce_scatter_16(OpScope &op, int32_t dtype, uint16_t *buf, size_t shard, float *out,
                              float out_scale, bool accumulate, size_t segment_elems) {
    const HalfSum sum{dtype, out_scale};
    if (op.size() == 1 || shard == 0) {
        sum.widen_into(out, buf, shard, accumulate);  // one rank: the sum is its own chunk
        op.done();
        return Status::Ok();
    }
    return ring_reduce_scatter_with(op, sum, buf, shard, out, accumulate, segment_elems);
}

// At step s rank r sends chunk r-s (its own at s = 0, afterwards the one received at
// step s-1) and receives chunk r-s-1 straight into place. Receives land in distinct
// places, so all of them are posted at once and the sender never waits for one. Gloo
// completes one pair's receives on a slot in the order they were posted: the u-th wait
// is unit u's. Where buf must be staged (OpScope::stages), the ring runs in a block of the
// call's own, and each segment goes on to buf as it arrives.
Status ring_all_gather(OpScope &op, char *buf, size_t shard_bytes, size_t segment_bytes) {
    const Ring ring(op);
    if (ring.size == 1 || shard_bytes == 0) {
        op.done();
        return Status::Ok();
    }
    const size_t seg = std::min(segment_bytes, shard_bytes);
    const size_t nseg = (shard_bytes + seg - 1) / seg;
    const size_t steps = static_cast<size_t>(ring.size - 1);
    const size_t units = steps * nseg;

    const size_t total = static_cast<size_t>(ring.size) * shard_bytes;
    char *ring_buf = op.stages(buf, total) ? op.scratch<char>(total, false) : buf;
    UnboundBuffer *b = op.buffer(ring_buf, total);
    auto seg_len = [&](size_t k) { return std::min(seg, shard_bytes - k * seg); };
    auto post_send = [&](size_t u) {
        const size_t s = u / nseg, k = u % nseg, at = ring.chunk_behind(s) * shard_bytes + k * seg;
        if (s == 0 && ring_buf != buf) std::copy_n(buf + at, seg_len(k), ring_buf + at);  // own data, as it goes
        b->send(ring.to_right, op.slot(), at, seg_len(k));
    };
    auto received_at = [&](size_t u) { return ring.chunk_behind(u / nseg + 1) * shard_bytes + (u % nseg) * seg; };
    auto post_recv = [&](size_t u) { b->recv(ring.to_left, op.slot(), received_at(u), seg_len(u % nseg)); };

    size_t sends = 0;
    for (size_t k = 0; k < nseg; ++k, ++sends) post_send(k);
    for (size_t u = 0; u < units; ++u) post_recv(u);
    for (size_t u = 0; u < units; ++u) {
        if (!op.wait_recv(b, ring.left)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
        if (ring_buf != buf) std::copy_n(ring_buf + received_at(u), seg_len(u % nseg), buf + received_at(u));
        if (u / nseg + 1 < steps) {
            post_send(u + nseg);
            ++sends;
        }
    }
    for (size_t i = 0; i < sends; ++i)
        if (!op.wait_send(b, ring.right)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    op.done();
    return Status::Ok();
}

Status exchange_pieces(OpScope &op, int root, const std::vector<Piece> &mine,
                       const std::vector<std::vector<Piece>> &theirs, bool gather) {
    struct Posted {
        UnboundBuffer *buffer;
        bool send;
        int peer;
    };
    std::vector<Posted> posted;
    auto post = [&](const Piece &p, int peer, bool send) {
        if (p.bytes == 0) return;
        UnboundBuffer *b = op.buffer(p.data, p.bytes);
        if (send) {
            b->send(op.peer(peer), op.slot(), 0, p.bytes);
        } else {
            b->recv(op.peer(peer), op.slot(), 0, p.bytes);
        }
        posted.push_back({b, send, peer});
    };
    if (op.rank() == root) {
        for (int r = 0; r < op.size(); ++r)
            if (r != root)
                for (const Piece &p : theirs[static_cast<size_t>(r)]) post(p, r, !gather);
    } else {
        for (const Piece &p : mine) post(p, root, gather);
    }
    for (const Posted &b : posted)
        if (!(b.send ? op.wait_send(b.buffer, b.peer) : op.wait_recv(b.buffer, b.peer)))
            return SX_ERROR(SX_ERR_ABORTED, "aborted");
    op.done();
    return Status::Ok();
}

bool mentions_timeout(const std::string &text) {
    std::string lower(text);
    for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

}  // namespace comm
}  // namespace sx
