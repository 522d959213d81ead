// The step's update of the params whose optimizer needs each param's whole matrix
// (optim::Needs::kWholeParam), as its row's optim::WholeParamUpdate describes it. Each
// such param has an owner in the shard group: the rank holding all of it where one does,
// else the rank with the least work (the update's cost) assigned so far (largest params
// first), so that the ranks share the work. A step runs the first pass over this rank's
// pieces, gathers each param's pieces on its owner (one gather per owning rank, all its
// params at once), updates the whole param there, returns each rank its pieces (one
// scatter per owning rank), and applies the pieces. The buffers are where the state
// lives (its DeviceOps's: the host's, or a device's), and so is the work.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/step_passes.h"
#include "optim/param_passes.h"

namespace sx {
namespace core {
namespace {

// The work of covered param k on its owner.
double cost_of(const ParamTable &t, const std::vector<int32_t> &covered, size_t k) {
    return row_of(t, covered[k]).whole_update->cost(t.params()[static_cast<size_t>(covered[k])].shape);
}

// Each covered param's owner among the S ranks of the shard group: the rank that holds
// all of it where one does; the others, largest first, to the rank with the least work.
std::vector<int> assign_owners(const Layout &layout, const ParamTable &table, const std::vector<int32_t> &covered,
                               int S) {
    std::vector<int> owner(covered.size(), -1);
    std::vector<double> load(static_cast<size_t>(S), 0.0);
    const auto cost = [&](size_t k) { return cost_of(table, covered, k); };
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

// On the owner: each owned param's whole update from its matrix, written back into the
// matrix (where the scatter's pieces point) and into this rank's own piece.
Status update_owned(const StepPasses &c, const std::vector<int32_t> &covered, const std::vector<size_t> &owned,
                    const std::vector<int> &seg_of, const std::vector<float *> &pieces, std::vector<Buffer> *matrix) {
    DeviceOps &ops = c.units->state_ops();
    for (size_t k : owned) {
        const ParamSpec &spec = c.table->params()[covered[k]];
        Buffer out;
        SX_TRY(ops.allocate((*matrix)[k].size(), "a whole param's orthogonalised update", &out));
        SX_TRY(ops.whole_update(row_of(*c.table, covered[k]), (*matrix)[k].as<float>(), spec.shape,
                                c.table->groups()[spec.group].hyper, out.as<float>()));
        SX_TRY(ops.copy((*matrix)[k].data(), out.data(), out.size()));  // where the scatter's pieces point
        if (seg_of[k] < 0) continue;  // this rank's own piece comes straight from the matrix
        const ShardPiece piece = c.layout->piece(covered[k], c.shard_rank);
        SX_TRY(ops.copy(pieces[static_cast<size_t>(seg_of[k])], (*matrix)[k].as<float>() + piece.begin,
                        (piece.end - piece.begin) * sizeof(float)));
    }
    return Status::Ok();
}

// Owner o's matrices: its params' pieces gathered from every rank of the shard group,
// updated whole on o, and each rank's pieces returned into pieces[seg_of[k]] (which held
// this rank's piece of covered param k's first update; -1 where it holds none).
// Collective on the shard group.
Status update_on(const StepPasses &c, int o, const std::vector<int32_t> &covered, const std::vector<int> &owner,
                 const std::vector<int> &seg_of, const std::vector<float *> &pieces) {
    const int S = c.shard_size, me = c.shard_rank;
    DeviceOps &ops = c.units->state_ops();
    std::vector<comm::Piece> mine;
    std::vector<std::vector<comm::Piece>> theirs(me == o ? static_cast<size_t>(S) : 0);
    std::vector<size_t> owned;
    std::vector<Buffer> matrix(covered.size());  // the owner's, of its params
    for (size_t k = 0; k < covered.size(); ++k) {
        if (owner[k] != o) continue;
        owned.push_back(k);
        if (me == o) {
            const size_t bytes = c.table->params()[covered[k]].numel * sizeof(float);
            Status st = ops.allocate(bytes, "a whole param's update", &matrix[k]);
            if (!st.ok()) return c.fail(st);  // the first pass is done: the step is half done
        }
        for (int q = 0; q < S; ++q) {
            const ShardPiece piece = c.layout->piece(covered[k], q);
            const size_t bytes = (piece.end - piece.begin) * sizeof(float);
            if (bytes == 0) continue;
            float *here = q == me ? pieces[static_cast<size_t>(seg_of[k])] : nullptr;
            if (q == me && me == o) {
                Status st = ops.copy(matrix[k].as<float>() + piece.begin, here, bytes);
                if (!st.ok()) return c.fail(st);
            } else if (q == me) {
                mine.push_back({here, bytes});
            } else if (me == o) {
                theirs[static_cast<size_t>(q)].push_back({matrix[k].as<float>() + piece.begin, bytes});
            }
        }
    }
    if (owned.empty()) return Status::Ok();
    if (S > 1) {
        SX_TRACE_SPAN(c.tracer, "step", "whole_param_gather");
        Status st = c.shard->gather_pieces(mine, theirs, o);
        if (!st.ok()) return c.fail(st);
    }
    if (me == o) {
        const optim::WholeParamUpdate &first = *row_of(*c.table, covered[owned.front()]).whole_update;
        SX_TRACE_SPAN(c.tracer, "step", first.name);
        Status st = update_owned(c, covered, owned, seg_of, pieces, &matrix);
        if (!st.ok()) return c.fail(st);
    }
    if (S > 1) {
        SX_TRACE_SPAN(c.tracer, "step", "whole_param_scatter");
        Status st = c.shard->scatter_pieces(theirs, mine, o);
        if (!st.ok()) return c.fail(st);
    }
    return Status::Ok();
}

}  // namespace

Status update_whole_params(const StepPasses &c, float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    const std::vector<int32_t> covered = c.units->params_needing(optim::Needs::kWholeParam);
    if (covered.empty()) return Status::Ok();
    trace::Span span(c.tracer, "step", "update_whole_params");
    const std::vector<int> owner = assign_owners(*c.layout, *c.table, covered, c.shard_size);

    // This rank's pieces, each optimizer's together: its first pass, each piece of the
    // update into a buffer per segment (which the pieces of the whole update later
    // replace).
    std::vector<optim::Segment> segs = c.units->segments_needing(*c.reduced, optim::Needs::kWholeParam);
    const std::vector<OptimizerSegments> runs = by_optimizer(&segs);
    DeviceOps &ops = c.units->state_ops();
    std::vector<Buffer> buffers(segs.size());
    std::vector<float *> pieces(segs.size());
    std::vector<const std::vector<int64_t> *> shapes(segs.size());
    std::vector<int> seg_of(covered.size(), -1);  // covered param k -> its segment here
    for (size_t s = 0; s < segs.size(); ++s) {
        SX_TRY(ops.allocate(segs[s].n * sizeof(float), "a piece of a whole param's update", &buffers[s]));
        pieces[s] = buffers[s].as<float>();
        shapes[s] = &c.table->params()[static_cast<size_t>(segs[s].param_index)].shape;
        const size_t k = static_cast<size_t>(std::lower_bound(covered.begin(), covered.end(), segs[s].param_index) -
                                             covered.begin());
        seg_of[k] = static_cast<int>(s);
    }
    // A failure from the first pass on leaves the state partly updated: the group fails.
    for (const OptimizerSegments &r : runs) {
        double part = 0.0;
        Status st = ops.whole_first(*r.row, segs.data() + r.begin, r.end - r.begin, grad_scale,
                                    pieces.data() + r.begin, sumsq ? &part : nullptr);
        if (!st.ok()) return c.fail(st);
        if (sumsq) *sumsq += part;
    }
    for (int o = 0; o < c.shard_size; ++o) SX_TRY(update_on(c, o, covered, owner, seg_of, pieces));
    for (const OptimizerSegments &r : runs) {
        Status st = ops.whole_apply(*r.row, segs.data() + r.begin, r.end - r.begin, shapes.data() + r.begin,
                                    pieces.data() + r.begin);
        if (!st.ok()) return c.fail(st);
    }
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
