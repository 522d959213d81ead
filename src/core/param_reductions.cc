// The step's update of the params whose optimizer needs sums over every element of a
// param (optim::Needs::kParamReduction), each optimizer's passes as its row's
// optim::ParamPasses describes them: pass 0 of every such optimizer over this rank's
// pieces, exchange 0 of all their params' blocks, pass 1, and so on until each has made
// its last pass. Each exchange is one collective for all params of the step, whose sums
// every rank gets added in rank order (comm/ordered_sum.h: the transport's all-reduce where
// it adds so, as shared memory and Gloo do, else an all-gather of every rank's blocks), so that
// every rank has the same sums, bit for bit, on any transport (and the tensors kept whole
// on every rank that the passes derive from them).
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "comm/ordered_sum.h"
#include "core/step_passes.h"
#include "optim/param_passes.h"

namespace sx {
namespace core {
namespace {

// The trace's name of each exchange: the first adds sums over the params, later ones
// sums over their updates.
const char *const kExchangeNames[optim::kMaxParamExchanges] = {"param_sums_exchange", "update_sums_exchange"};

// Every shard-group rank's block (at sums.mine()), added in rank order into whole
// (comm/ordered_sum.h: an all-reduce where the transport adds in rank order, else an
// all-gather). Collective on the shard group when it has several ranks.
Status sum_blocks(const StepPasses &c, comm::RankOrderedSum &sums, const char *what, std::vector<double> *whole) {
    if (sums.exchanged_bytes() > 0) {
        SX_TRACE_SPAN(c.tracer, "step", what, trace::kNoUnit, sums.exchanged_bytes());
        Status st = sums.sum(whole);
        if (!st.ok()) return c.fail(st);
        return Status::Ok();
    }
    return sums.sum(whole);
}

// One optimizer's part of the step: the covered params it updates (their places in the
// covered list, and what its passes see of them), this rank's segments of them, its run.
struct Optimizer {
    const optim::ParamPasses *passes = nullptr;
    std::vector<size_t> covered;
    std::vector<optim::PassParam> params;
    std::vector<size_t> param_of;  // per segment: its param among `params`
    optim::PassInput in;
    std::unique_ptr<optim::ParamPassRun> run;
};

// The optimizers of the covered params, in the table's order (SX_OPTIM_*), each with its
// params and its segments (among segs, which by_optimizer reorders), their runs started.
std::map<int32_t, Optimizer> start_runs(const StepPasses &c, const std::vector<int32_t> &covered,
                                        std::vector<optim::Segment> *segs, float grad_scale) {
    std::map<int32_t, Optimizer> out;
    for (size_t k = 0; k < covered.size(); ++k) {
        ParamSpec &spec = c.table->params()[static_cast<size_t>(covered[k])];
        const optim::Hyper &h = c.table->groups()[static_cast<size_t>(spec.group)].hyper;
        Optimizer &o = out[static_cast<int32_t>(h.kind)];
        o.passes = optim::spec_of(h.kind).passes;
        o.covered.push_back(k);
        optim::PassParam p;
        p.hyper = &h;
        p.shape = &spec.shape;
        p.next_step = spec.step + 1;
        for (int t = 0; t < optim::kMaxWholeTensors; ++t) p.whole[t] = &spec.whole(t);
        o.params.push_back(p);
    }
    const std::vector<OptimizerSegments> runs = by_optimizer(segs);
    for (const OptimizerSegments &r : runs) {
        Optimizer &o = out.at(static_cast<int32_t>(r.row->kind));
        o.in.segs = segs->data() + r.begin;
        o.in.num_segs = r.end - r.begin;
        for (size_t s = r.begin; s < r.end; ++s) {
            const auto at = std::lower_bound(o.covered.begin(), o.covered.end(), (*segs)[s].param_index,
                                             [&](size_t k, int32_t p) { return covered[k] < p; });
            o.param_of.push_back(static_cast<size_t>(at - o.covered.begin()));
        }
    }
    for (auto &entry : out) {
        Optimizer &o = entry.second;
        o.in.param_of = o.param_of.data();
        o.in.params = o.params.data();
        o.in.num_params = o.params.size();
        o.in.grad_scale = grad_scale;
        o.in.pool = c.pool;
    }
    return out;
}

// Where each covered param's block of exchange e lies in the exchange's doubles (its
// optimizer's width for its shape; none after that optimizer's last exchange), in
// index order: offset[e][k] to offset[e][k + 1].
struct Blocks {
    std::vector<size_t> offset[optim::kMaxParamExchanges];
    int exchanges = 0;  // the most any optimizer of the step makes
    Blocks(const StepPasses &c, const std::vector<int32_t> &covered) {
        for (std::vector<size_t> &o : offset) o.assign(covered.size() + 1, 0);
        for (size_t k = 0; k < covered.size(); ++k) {
            const ParamSpec &spec = c.table->params()[static_cast<size_t>(covered[k])];
            const optim::ParamPasses &passes = *row_of(*c.table, covered[k]).passes;
            exchanges = std::max(exchanges, passes.exchanges);
            for (int e = 0; e < optim::kMaxParamExchanges; ++e)
                offset[e][k + 1] = offset[e][k] + (e < passes.exchanges ? passes.block_width(e, spec.shape) : 0);
        }
    }
    size_t width(int e) const { return offset[e].back(); }
};

}  // namespace

Status update_param_reductions(const StepPasses &c, float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    const std::vector<int32_t> covered = c.units->params_needing(optim::Needs::kParamReduction);
    if (covered.empty()) return Status::Ok();
    trace::Span span(c.tracer, "step", "update_param_reductions");
    std::vector<optim::Segment> segs = c.units->segments_needing(*c.reduced, optim::Needs::kParamReduction);
    std::map<int32_t, Optimizer> optimizers = start_runs(c, covered, &segs, grad_scale);
    // Where the state lives, the passes run: the host's loops, or a device's kernels.
    for (auto &entry : optimizers)
        SX_TRY(c.units->state_ops().start_param_passes(optim::spec_of(static_cast<optim::Kind>(entry.first)),
                                                         entry.second.in, &entry.second.run));
    const Blocks blocks(c, covered);
    std::vector<double> whole[optim::kMaxParamExchanges];
    for (int pass = 0; pass <= blocks.exchanges; ++pass) {
        // This rank's blocks of exchange `pass`, written at sums.mine().
        const size_t width = pass < blocks.exchanges ? blocks.width(pass) : 0;
        comm::RankOrderedSum sums(c.shard_size > 1 ? c.shard : nullptr, width);
        for (auto &entry : optimizers) {
            Optimizer &o = entry.second;
            if (pass > o.passes->exchanges) continue;
            std::vector<const double *> summed(o.covered.size(), nullptr);
            std::vector<double *> mine(o.covered.size(), nullptr);
            for (size_t j = 0; j < o.covered.size(); ++j) {
                const size_t k = o.covered[j];
                if (pass > 0) summed[j] = whole[pass - 1].data() + blocks.offset[pass - 1][k];
                if (pass < o.passes->exchanges) mine[j] = sums.mine() + blocks.offset[pass][k];
            }
            double part = 0.0;
            Status st = o.run->pass(pass, summed.data(), mine.data(), pass == 0 && sumsq ? &part : nullptr);
            if (!st.ok()) return c.fail(st);  // the segments are partly updated
            if (pass == 0 && sumsq) *sumsq += part;
        }
        if (pass < blocks.exchanges) SX_TRY(sum_blocks(c, sums, kExchangeNames[pass], &whole[pass]));
    }
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
