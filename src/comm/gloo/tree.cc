// Collectives of a sparse Gloo mesh (tree.h).
#include "comm/gloo/tree.h"

#include <gloo/math.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>

namespace sx {
namespace comm {
namespace {

// A binomial tree over the call's ranks, rooted at `root`.
struct Tree {
    Tree(const OpScope &op, int root_)
        : W(static_cast<size_t>(op.size())),
          root(static_cast<size_t>(root_)),
          v((static_cast<size_t>(op.rank()) + W - root) % W) {}

    // The span of u's subtree: [u, u + span(u)).
    size_t span(size_t u) const { return u == 0 ? W : std::min(u & (~u + 1), W - u); }
    // The call's rank of virtual rank u.
    int actual(size_t u) const { return static_cast<int>((u + root) % W); }
    int parent() const { return actual(v - (v & (~v + 1))); }
    // This rank's children, the farthest (largest subtree) first.
    std::vector<size_t> children() const {
        std::vector<size_t> c;
        const size_t limit = v == 0 ? W : (v & (~v + 1));
        for (size_t d = 1; d < limit && v + d < W; d <<= 1) c.push_back(v + d);
        std::reverse(c.begin(), c.end());
        return c;
    }

    const size_t W, root, v;
};

bool wait_all(OpScope &op, const std::vector<std::pair<UnboundBuffer *, int>> &posted, bool recv) {
    for (const auto &p : posted)
        if (!(recv ? op.wait_recv(p.first, p.second) : op.wait_send(p.first, p.second))) return false;
    return true;
}

// The byte offsets of each virtual rank's part within the subtree of this rank: at[u - v],
// for u in [v, v + span(v)], from sizes[u - v].
std::vector<size_t> offsets(const std::vector<size_t> &sizes) {
    std::vector<size_t> at(sizes.size() + 1, 0);
    std::partial_sum(sizes.begin(), sizes.end(), at.begin() + 1);
    return at;
}

// Receives each child's part of buf (at: the parts' offsets, as offsets() gives them) from
// it, or sends it to it (`send`), and waits for them all; parts of no bytes are skipped.
// False where abort() woke a wait.
bool with_children(OpScope &op, const Tree &t, const std::vector<size_t> &at, UnboundBuffer *b, bool send) {
    std::vector<std::pair<UnboundBuffer *, int>> posted;
    for (size_t c : t.children()) {
        const size_t from = at[c - t.v], bytes = at[c - t.v + t.span(c)] - from;
        if (bytes == 0) continue;
        if (send)
            b->send(op.peer(t.actual(c)), op.slot(), from, bytes);
        else
            b->recv(op.peer(t.actual(c)), op.slot(), from, bytes);
        posted.emplace_back(b, t.actual(c));
    }
    return wait_all(op, posted, !send);
}

// Up the tree: buf (this rank's subtree's bytes, sizes[u - v] for virtual rank u, own part
// already at its offset 0) receives the children's parts, then goes to the parent.
Status gather_up(OpScope &op, const Tree &t, const std::vector<size_t> &sizes, char *buf) {
    const std::vector<size_t> at = offsets(sizes);
    UnboundBuffer *b = at.back() ? op.buffer(buf, at.back()) : nullptr;
    if (!with_children(op, t, at, b, false)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    if (t.v != 0 && at.back() > 0) {
        b->send(op.peer(t.parent()), op.slot(), 0, at.back());
        if (!op.wait_send(b, t.parent())) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    }
    return Status::Ok();
}

// Down the tree: buf (this rank's subtree's bytes, as in gather_up) comes from the parent,
// and each child's part goes on to it.
Status scatter_down(OpScope &op, const Tree &t, const std::vector<size_t> &sizes, char *buf) {
    const std::vector<size_t> at = offsets(sizes);
    if (at.back() == 0) return Status::Ok();
    UnboundBuffer *b = op.buffer(buf, at.back());
    if (t.v != 0) {
        b->recv(op.peer(t.parent()), op.slot(), 0, at.back());
        if (!op.wait_recv(b, t.parent())) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    }
    return with_children(op, t, at, b, true) ? Status::Ok() : SX_ERROR(SX_ERR_ABORTED, "aborted");
}

// The chain: data[0, n) = x_0 + x_1 + ... + x_{W-1} (the left fold), on the call's last rank
// only; the others' data is unchanged.
Status chain_sum(OpScope &op, double *data, size_t n, size_t segment_elems) {
    const int r = op.rank(), W = op.size();
    const size_t seg = std::max<size_t>(segment_elems, 1), segments = (n + seg - 1) / seg;
    double *acc = r > 0 ? op.scratch<double>(n) : nullptr;
    UnboundBuffer *in = r > 0 ? op.buffer(acc, n * sizeof(double)) : nullptr;
    UnboundBuffer *out = r > 0 ? in : op.buffer(data, n * sizeof(double));
    auto length = [&](size_t k) { return std::min(seg, n - k * seg); };
    if (in)
        for (size_t k = 0; k < segments; ++k)
            in->recv(op.peer(r - 1), op.slot(), k * seg * sizeof(double), length(k) * sizeof(double));
    size_t sends = 0;
    for (size_t k = 0; k < segments; ++k) {
        if (in) {
            if (!op.wait_recv(in, r - 1)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
            double *a = acc + k * seg;
            gloo::sum<double>(a, a, data + k * seg, length(k));
        }
        if (r + 1 < W) {
            out->send(op.peer(r + 1), op.slot(), k * seg * sizeof(double), length(k) * sizeof(double));
            ++sends;
        }
    }
    for (size_t i = 0; i < sends; ++i)
        if (!op.wait_send(out, r + 1)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    if (r + 1 == W) std::copy(acc, acc + n, data);
    return Status::Ok();
}

}  // namespace

Status tree_broadcast(OpScope &op, int root, void *data, size_t bytes) {
    const Tree t(op, root);
    UnboundBuffer *b = op.buffer(data, bytes);
    if (t.v != 0) {
        b->recv(op.peer(t.parent()), op.slot(), 0, bytes);
        if (!op.wait_recv(b, t.parent())) return SX_ERROR(SX_ERR_ABORTED, "aborted");
    }
    std::vector<std::pair<UnboundBuffer *, int>> posted;
    for (size_t c : t.children()) {
        b->send(op.peer(t.actual(c)), op.slot(), 0, bytes);
        posted.emplace_back(b, t.actual(c));
    }
    return wait_all(op, posted, false) ? Status::Ok() : SX_ERROR(SX_ERR_ABORTED, "aborted");
}

Status tree_all_reduce(OpScope &op, void *data, size_t n, size_t elem_bytes, ReduceFn reduce) {
    const size_t bytes = n * elem_bytes;
    const Tree t(op, 0);
    const size_t span = t.span(t.v);
    char *all = op.scratch<char>(span * bytes);
    std::memcpy(all, data, bytes);
    SX_TRY(gather_up(op, t, std::vector<size_t>(span, bytes), all));
    if (t.v == 0)
        for (size_t q = 1; q < t.W; ++q) reduce(data, data, all + q * bytes, n);
    SX_TRY(tree_broadcast(op, 0, data, bytes));
    op.done();
    return Status::Ok();
}

Status sparse_ordered_sum(OpScope &op, double *data, size_t n, size_t rooted_bytes, size_t segment_elems) {
    if (op.size() == 1 || n == 0) {
        op.done();
        return Status::Ok();
    }
    if (n * sizeof(double) <= (rooted_bytes ? rooted_bytes : kRootedSumBytes))
        return tree_all_reduce(op, data, n, sizeof(double), &gloo::sum<double>);
    SX_TRY(chain_sum(op, data, n, segment_elems));
    SX_TRY(tree_broadcast(op, op.size() - 1, data, n * sizeof(double)));
    op.done();
    return Status::Ok();
}

Status tree_exchange_pieces(OpScope &op, int root, const std::vector<Piece> &mine,
                            const std::vector<std::vector<Piece>> &theirs, bool gather) {
    const Tree t(op, root);
    const size_t span = t.span(t.v);
    auto total = [](const std::vector<Piece> &pieces) {
        uint64_t bytes = 0;
        for (const Piece &p : pieces) bytes += p.bytes;
        return bytes;
    };
    // Each rank's byte count, up the tree: this rank learns its subtree's.
    uint64_t *counts = op.scratch<uint64_t>(span);
    counts[0] = t.v == 0 ? 0 : total(mine);
    SX_TRY(gather_up(op, t, std::vector<size_t>(span, sizeof(uint64_t)), reinterpret_cast<char *>(counts)));
    if (t.v == 0)
        for (size_t u = 1; u < t.W; ++u) {
            const int q = t.actual(u);
            SX_CHECK_ARG(total(theirs[static_cast<size_t>(q)]) == counts[u],
                         "%s: root's pieces for rank %d hold %llu bytes, its own %llu",
                         gather ? "gather_pieces" : "scatter_pieces", q,
                         static_cast<unsigned long long>(total(theirs[static_cast<size_t>(q)])),
                         static_cast<unsigned long long>(counts[u]));
        }
    const std::vector<size_t> sizes(counts, counts + span);
    const std::vector<size_t> at = offsets(sizes);
    char *buf = op.scratch<char>(at.back());
    // Packs (or unpacks) one rank's pieces at its offset.
    auto copy = [&](const std::vector<Piece> &pieces, size_t u, bool pack) {
        size_t o = at[u];
        for (const Piece &p : pieces) {
            if (pack) {
                if (p.bytes) std::memcpy(buf + o, p.data, p.bytes);
            } else if (p.bytes) {
                std::memcpy(p.data, buf + o, p.bytes);
            }
            o += p.bytes;
        }
    };
    if (gather) {
        if (t.v != 0) copy(mine, 0, true);
        SX_TRY(gather_up(op, t, sizes, buf));
        if (t.v == 0)
            for (size_t u = 1; u < t.W; ++u) copy(theirs[static_cast<size_t>(t.actual(u))], u, false);
    } else {
        if (t.v == 0)
            for (size_t u = 1; u < t.W; ++u) copy(theirs[static_cast<size_t>(t.actual(u))], u, true);
        SX_TRY(scatter_down(op, t, sizes, buf));
        if (t.v != 0) copy(mine, 0, false);
    }
    op.done();
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
