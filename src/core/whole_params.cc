// The step's update of the params whose optimizer needs each param's whole matrix
// (optim::Needs::kWholeParam: Muon). Each such param has an owner in the shard group:
// the rank holding all of it where one does, else the rank with the least Newton-Schulz
// work assigned so far (largest params first), so that the ranks share the work. A step
// runs the momentum over this rank's pieces, gathers each param's pieces on its owner
// (one gather per owning rank, all its params at once), orthogonalises there, returns
// each rank its pieces (one scatter per owning rank), and finishes the pieces.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/group.h"
#include "optim/muon.h"

namespace sx {
namespace core {
namespace {

// Newton-Schulz's multiply-adds for a rows x cols matrix, per iteration (m <= n):
// X X^T (m m n), G G (m m m), U X (m m n).
double ns_cost(int64_t rows, int64_t cols) {
    const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
    return m * m * (2.0 * n + m);
}

}  // namespace

Status ShardGroup::update_whole_params(float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    // The params, in index order (the same list on every rank).
    const std::vector<int32_t> covered = units_.params_needing(optim::Needs::kWholeParam);
    if (covered.empty()) return Status::Ok();
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_INTERNAL, "an optimizer of whole params on a CUDA group");
    trace::Span span(tracer(), "step", "update_whole_params");
    const int S = mesh_.shard_size(), me = mesh_.shard_rank();

    // Owners: a param on one rank stays there; the others go, largest first, to the rank
    // with the least work.
    std::vector<int> owner(covered.size(), -1);
    std::vector<double> load(static_cast<size_t>(S), 0.0);
    std::vector<size_t> order(covered.size());
    std::iota(order.begin(), order.end(), 0);
    const auto cost = [&](size_t k) {
        const ParamSpec &spec = table_.params()[covered[k]];
        return ns_cost(spec.shape[0], spec.shape[1]);
    };
    for (size_t k = 0; k < covered.size(); ++k) {
        int holders = 0, holder = -1;
        for (int q = 0; q < S; ++q) {
            const ShardPiece piece = layout_.piece(covered[k], q);
            if (piece.begin != piece.end) ++holders, holder = q;
        }
        if (holders == 1) {
            owner[k] = holder;
            load[static_cast<size_t>(holder)] += cost(k);
        }
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cost(x) > cost(y); });
    for (size_t k : order) {
        if (owner[k] >= 0) continue;
        const int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        owner[k] = least;
        load[static_cast<size_t>(least)] += cost(k);
    }

    // This rank's pieces: the momentum, and u into a buffer per segment (which the
    // orthogonalised pieces later replace).
    const std::vector<optim::Segment> segs = units_.segments_needing(round_->reduced(), optim::Needs::kWholeParam);
    std::vector<std::vector<float>> piece_buf(segs.size());
    std::vector<float *> piece_ptr(segs.size());
    std::vector<int> seg_of(covered.size(), -1);  // covered param k -> its segment here
    const auto place = [&](int32_t p) {
        return static_cast<size_t>(std::lower_bound(covered.begin(), covered.end(), p) - covered.begin());
    };
    for (size_t s = 0; s < segs.size(); ++s) {
        piece_buf[s].resize(segs[s].n);
        piece_ptr[s] = piece_buf[s].data();
        seg_of[place(segs[s].param_index)] = static_cast<int>(s);
    }
    optim::muon_momentum(segs.data(), segs.size(), grad_scale, piece_ptr.data(), sumsq);

    // Each owner's matrices: gathered, orthogonalised, scattered back.
    std::vector<std::vector<float>> matrix(covered.size());
    for (int o = 0; o < S; ++o) {
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(me == o ? static_cast<size_t>(S) : 0);
        std::vector<size_t> owned;
        for (size_t k = 0; k < covered.size(); ++k) {
            if (owner[k] != o) continue;
            owned.push_back(k);
            const int32_t p = covered[k];
            if (me == o) matrix[k].assign(table_.params()[p].numel, 0.0f);
            for (int q = 0; q < S; ++q) {
                const ShardPiece piece = layout_.piece(p, q);
                const size_t bytes = (piece.end - piece.begin) * sizeof(float);
                if (bytes == 0) continue;
                if (q == me && me == o) {
                    std::memcpy(matrix[k].data() + piece.begin, piece_ptr[static_cast<size_t>(seg_of[k])], bytes);
                } else if (q == me) {
                    mine.push_back({piece_ptr[static_cast<size_t>(seg_of[k])], bytes});
                } else if (me == o) {
                    theirs[static_cast<size_t>(q)].push_back({matrix[k].data() + piece.begin, bytes});
                }
            }
        }
        if (owned.empty()) continue;
        if (S > 1) {
            SX_TRACE_SPAN(tracer(), "step", "whole_param_gather");
            Status st = mesh_.shard().gather_pieces(mine, theirs, o);
            if (!st.ok()) return fail(st);
        }
        if (me == o) {
            SX_TRACE_SPAN(tracer(), "step", "newton_schulz");
            std::vector<float> orth;
            for (size_t k : owned) {
                const ParamSpec &spec = table_.params()[covered[k]];
                orth.resize(matrix[k].size());
                optim::newton_schulz(matrix[k].data(), spec.shape[0], spec.shape[1],
                                     table_.groups()[spec.group].hyper, pool_.get(), orth.data());
                std::copy(orth.begin(), orth.end(), matrix[k].begin());  // where the scatter's pieces point
            }
            // This rank's own pieces come straight from the matrices.
            for (size_t k : owned) {
                if (seg_of[k] < 0) continue;
                const ShardPiece piece = layout_.piece(covered[k], me);
                std::memcpy(piece_ptr[static_cast<size_t>(seg_of[k])], matrix[k].data() + piece.begin,
                            (piece.end - piece.begin) * sizeof(float));
            }
        }
        if (S > 1) {
            SX_TRACE_SPAN(tracer(), "step", "whole_param_scatter");
            Status st = mesh_.shard().scatter_pieces(theirs, mine, o);
            if (!st.ok()) return fail(st);
        }
        for (size_t k : owned) matrix[k].clear();
    }

    std::vector<double> adjusted(segs.size());
    for (size_t s = 0; s < segs.size(); ++s) {
        const ParamSpec &spec = table_.params()[segs[s].param_index];
        adjusted[s] = optim::muon_adjusted_lr(*segs[s].hyper, spec.shape[0], spec.shape[1]);
    }
    optim::muon_apply(segs.data(), segs.size(), piece_ptr.data(), adjusted.data());
    uint64_t n = 0;
    for (const optim::Segment &seg : segs) n += seg.n;
    span.set_bytes(n * sizeof(float));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
