// How the step runs an optimizer that looks at whole params, knowing only its row of the
// optimizer table: the passes of one that needs sums over every element of a param
// (Needs::kParamReduction: ParamPasses), the update of one that needs a param's whole
// matrix on one rank (Needs::kWholeParam: WholeParamUpdate), and the per-param tensors an
// optimizer keeps whole on every rank besides its slots (WholeTensors). The step (core)
// does the exchanges, the gathers and the bookkeeping; each optimizer's own file (lamb.cc,
// adafactor.cc, muon.cc) fills these in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "optim/optimizer.h"

namespace sx {
namespace optim {

class ThreadPool;

// --- tensors kept whole on every rank ---

// The most whole tensors a param keeps.
constexpr int kMaxWholeTensors = 2;

// Per-param tensors an optimizer keeps outside its slots, whole (not sharded) on every
// rank of the shard group, each the same bits everywhere (the passes derive them from
// sums every rank adds in the same order). Empty until the param's first update.
struct WholeTensors {
    int count;
    const char *names[kMaxWholeTensors];  // torch's names in the optimizer's state dict
    // Tensor t's values for a param of `shape` (0: such a param keeps none).
    uint64_t (*numel)(int t, const std::vector<int64_t> &shape);
    // Whether a value is one the tensor may hold (a scattered-in state is held to it), and
    // what the values are, for the error that names one that is not.
    bool (*valid)(float value);
    const char *rule;
};

// --- sums over whole params ---

// The most exchanges of per-param sums one step of an optimizer makes.
constexpr int kMaxParamExchanges = 2;

// A param whose update needs sums over all of it, as every rank of the shard group sees
// it, whether this rank holds a piece of it or not.
struct PassParam {
    const Hyper *hyper = nullptr;
    const std::vector<int64_t> *shape = nullptr;
    int64_t next_step = 1;  // its own step count including this update
    std::vector<float> *whole[kMaxWholeTensors] = {nullptr, nullptr};  // its WholeTensors, this rank's copy
};

// One step's passes of one optimizer: over this rank's segments of its params (one per
// param at most: segs[s] is a piece of params[param_of[s]]) and over every param of it
// that the step updates (params, in index order: the same list on every rank).
struct PassInput {
    const Segment *segs = nullptr;
    size_t num_segs = 0;
    const size_t *param_of = nullptr;
    const PassParam *params = nullptr;
    size_t num_params = 0;
    float grad_scale = 1.0f;
    ThreadPool *pool = nullptr;
};

// The passes of one step, pass 0, exchange 0, pass 1, ..., exchange E - 1, pass E, for
// E = ParamPasses::exchanges. In an exchange, every param's block (its doubles) is added
// over the ranks of the shard group, in rank order, so that every rank sees the same sums.
class ParamPassRun {
  public:
    virtual ~ParamPassRun() = default;
    // Pass `pass`. summed (pass > 0): per param k, its block of exchange pass - 1 added over
    // the ranks (the blocks of every exchange stay valid until the run ends). mine (pass <
    // E): per param k, this rank's block of exchange `pass`, zeroed, for its segments' sums.
    // grad_sumsq (pass 0, if not null): the sum of (grad * grad_scale)^2 over the segments.
    // A failure (a device's; the host's passes cannot fail) leaves the segments partly
    // updated: the step fails the group.
    virtual Status pass(int pass, const double *const *summed, double *const *mine, double *grad_sumsq) = 0;
};

// What a Needs::kParamReduction row gives the step.
struct ParamPasses {
    int exchanges;  // E, at most kMaxParamExchanges
    // The doubles of a param's block in exchange e, from its shape (0: none).
    uint64_t (*block_width)(int e, const std::vector<int64_t> &shape);
    // A run over `in`, which stays valid until the run ends.
    std::unique_ptr<ParamPassRun> (*start)(const PassInput &in);
};

// --- whole params on one rank ---

// What a Needs::kWholeParam row gives the step: a first pass over this rank's segments
// that writes each one's piece of its param's update, the update of a whole param on
// the rank that holds it all (its owner), and a last pass that applies the pieces.
struct WholeParamUpdate {
    const char *name;  // the whole update's, in the step's trace
    // The first pass: state written, updates[s][0, n) segment s's piece of the update;
    // *grad_sumsq (if not null) the sum of (grad * grad_scale)^2.
    void (*first)(const Segment *segs, size_t num_segs, float grad_scale, float *const *updates,
                  double *grad_sumsq);
    // The work of a param of `shape` on its owner, to share the owners' work.
    double (*cost)(const std::vector<int64_t> &shape);
    // A whole param's update u (its numel values) turned into out (the same size; out
    // does not alias u) on its owner; pool (or null) shares the work.
    void (*whole)(const float *u, const std::vector<int64_t> &shape, const Hyper &h, ThreadPool *pool, float *out);
    // The last pass: segment s (of a param of shapes[s]) updated from its piece of the
    // whole update, pieces[s]; 16-bit params (compute_out) rounded from the result.
    void (*apply)(const Segment *segs, size_t num_segs, const std::vector<int64_t> *const *shapes,
                  const float *const *pieces);
};

// The built-in rows' (optimizers.cc), defined in their optimizers' files.
extern const ParamPasses kLambPasses;       // lamb.cc
extern const ParamPasses kAdafactorPasses;  // adafactor.cc
extern const WholeTensors kAdafactorWholeTensors;
extern const WholeParamUpdate kMuonUpdate;  // muon.cc

}  // namespace optim
}  // namespace sx
