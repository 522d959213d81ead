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

// Each covered param's owner among the S ranks of the shard group: the rank that holds
// all of it where one does; the others, largest first, to the rank with the least work.
std::vector<int> assign_owners(const Layout &layout, const std::deque<ParamSpec> &params,
                               const std::vector<int32_t> &covered, int S) {
    std::vector<int> owner(covered.size(), -1);
    std::vector<double> load(static_cast<size_t>(S), 0.0);
    const auto cost = [&](size_t k) { return ns_cost(params[covered[k]].shape[0], params[covered[k]].shape[1]); };
    for (size_t k = 0; k < covered.size(); ++k) {
        int holders = 0, holder = -1;
        for (int q = 0; q < S; ++q) {
            const ShardPiece piece = layout.piece(covered[k], q);
            if (piece.begin != piece.end) ++holders, holder = q;
        }
        if (holders == 1) {
            owner[k] = holder;
            load[static_cast<size_t>(holder)] += cost(k);
        }
    }
    std::vector<size_t> order(covered.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cost(x) > cost(y); });
    for (size_t k : order) {
        if (owner[k] >= 0) continue;
        const int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        owner[k] = least;
        load[static_cast<size_t>(least)] += cost(k);
    }
    return owner;
}

}  // namespace

// Owner o's matrices: its params' pieces gathered from every rank of the shard group,
// orthogonalised on o, and each rank's pieces returned into pieces[seg_of[k]] (which held
// this rank's u of covered param k; -1 where it holds none). Collective on the shard group.
Status ShardGroup::orthogonalise_on(int o, const std::vector<int32_t> &covered, const std::vector<int> &owner,
                                    const std::vector<int> &seg_of, const std::vector<float *> &pieces) {
    const int S = mesh_.shard_size(), me = mesh_.shard_rank();
    std::vector<comm::Piece> mine;
    std::vector<std::vector<comm::Piece>> theirs(me == o ? static_cast<size_t>(S) : 0);
    std::vector<size_t> owned;
    std::vector<std::vector<float>> matrix(covered.size());  // the owner's, of its params
    for (size_t k = 0; k < covered.size(); ++k) {
        if (owner[k] != o) continue;
        owned.push_back(k);
        if (me == o) matrix[k].assign(table_.params()[covered[k]].numel, 0.0f);
        for (int q = 0; q < S; ++q) {
            const ShardPiece piece = layout_.piece(covered[k], q);
            const size_t bytes = (piece.end - piece.begin) * sizeof(float);
            if (bytes == 0) continue;
            float *here = q == me ? pieces[static_cast<size_t>(seg_of[k])] : nullptr;
            if (q == me && me == o)
                std::memcpy(matrix[k].data() + piece.begin, here, bytes);
            else if (q == me)
                mine.push_back({here, bytes});
            else if (me == o)
                theirs[static_cast<size_t>(q)].push_back({matrix[k].data() + piece.begin, bytes});
        }
    }
    if (owned.empty()) return Status::Ok();
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
            optim::newton_schulz(matrix[k].data(), spec.shape[0], spec.shape[1], table_.groups()[spec.group].hyper,
                                 pool_.get(), orth.data());
            std::copy(orth.begin(), orth.end(), matrix[k].begin());  // where the scatter's pieces point
            if (seg_of[k] < 0) continue;  // this rank's own piece comes straight from the matrix
            const ShardPiece piece = layout_.piece(covered[k], me);
            std::memcpy(pieces[static_cast<size_t>(seg_of[k])], matrix[k].data() + piece.begin,
                        (piece.end - piece.begin) * sizeof(float));
        }
    }
    if (S > 1) {
        SX_TRACE_SPAN(tracer(), "step", "whole_param_scatter");
        Status st = mesh_.shard().scatter_pieces(theirs, mine, o);
        if (!st.ok()) return fail(st);
    }
    return Status::Ok();
}

Status ShardGroup::update_whole_params(float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    const std::vector<int32_t> covered = units_.params_needing(optim::Needs::kWholeParam);
    if (covered.empty()) return Status::Ok();
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_INTERNAL, "an optimizer of whole params on a CUDA group");
    trace::Span span(tracer(), "step", "update_whole_params");
    const std::vector<int> owner = assign_owners(layout_, table_.params(), covered, mesh_.shard_size());

    // This rank's pieces: the momentum, and u into a buffer per segment (which the
    // orthogonalised pieces later replace).
    const std::vector<optim::Segment> segs = units_.segments_needing(round_->reduced(), optim::Needs::kWholeParam);
    std::vector<std::vector<float>> buffers(segs.size());
    std::vector<float *> pieces(segs.size());
    std::vector<int> seg_of(covered.size(), -1);  // covered param k -> its segment here
    for (size_t s = 0; s < segs.size(); ++s) {
        buffers[s].resize(segs[s].n);
        pieces[s] = buffers[s].data();
        const size_t k = static_cast<size_t>(std::lower_bound(covered.begin(), covered.end(), segs[s].param_index) -
                                             covered.begin());
        seg_of[k] = static_cast<int>(s);
    }
    optim::muon_momentum(segs.data(), segs.size(), grad_scale, pieces.data(), sumsq);
    for (int o = 0; o < mesh_.shard_size(); ++o) SX_TRY(orthogonalise_on(o, covered, owner, seg_of, pieces));

    std::vector<double> adjusted(segs.size());
    for (size_t s = 0; s < segs.size(); ++s) {
        const ParamSpec &spec = table_.params()[segs[s].param_index];
        adjusted[s] = optim::muon_adjusted_lr(*segs[s].hyper, spec.shape[0], spec.shape[1]);
    }
    optim::muon_apply(segs.data(), segs.size(), pieces.data(), adjusted.data());
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
