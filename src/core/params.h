// The param table and param groups as the trainer registered them, with validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "optim/optimizer.h"
#include "optim/state_codec.h"
#include "optim/param_passes.h"

namespace sx {
namespace core {

// Where a param sits in a model the trainer splits itself (sx_param_desc_t.placement,
// docs/model-parallel.md): the whole logical tensor, one of `replicas` identical copies,
// or the piece [offset, offset + shape[split_dim]) of a logical tensor of global_shape.
struct Placement {
    int32_t kind = SX_PLACEMENT_WHOLE;
    int32_t split_dim = 0;
    std::vector<int64_t> global_shape;  // SPLIT only
    int64_t offset = 0;
    int32_t replica = 0, replicas = 0;  // REPLICATED only
    // Whether the param's gradient adds to a norm domain's sum of squares: every param but
    // the copies of a replicated one other than copy 0.
    bool counts_in_norm() const { return kind != SX_PLACEMENT_REPLICATED || replica == 0; }
};

// "[8, 3]".
std::string shape_text(const std::vector<int64_t> &shape);
// A placement in words: "whole", "copy 1 of 2", "the piece at 4 on dimension 0 (of 8) of
// [8, 3]".
std::string placement_text(const Placement &p);
// Whether a param of placement `here` can take the values a checkpoint saved for one of
// placement `saved` (the same shape already checked): a saved piece of a split tensor
// only into the same piece. A saved whole or replicated param goes anywhere its shape
// fits (files written before placements were recorded read as whole).
bool placement_loads_into(const Placement &saved, const Placement &here);

// Checks a param's placement against its shape (`name` for the errors): each kind's
// fields in range and the others 0, a piece within its logical tensor.
Status validate_placement(const char *name, const std::vector<int64_t> &shape, const Placement &p);

struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    int32_t dtype = SX_DTYPE_F32;
    int32_t group = 0;
    int32_t unit = 0;
    uint64_t numel = 1;
    Placement placement;
    // Updates applied to this param (torch's per-param `step`); and, for SGD, updates
    // that used the momentum buffer (the first one initialises it from the gradient).
    int64_t step = 0;
    int64_t momentum_steps = 0;
    // NAdam: torch's per-param mu_product (a float32 scalar), 1 before the first update.
    float mu_product = 1.0f;
    // The tensors its optimizer keeps whole besides its slots (optim::WholeTensors: the
    // factored moments, per row and per column of each matrix, of an optimizer that
    // factors its second moment), tensors 0 and 1 under the names the checkpoint format
    // gives them. Every rank of the group keeps them whole (the same bits: each rank adds
    // the ranks' partial sums in rank order); empty until the param's first update
    // (torch's zeros).
    std::vector<float> row_var, col_var;
    std::vector<float> &whole(int t) { return t == 0 ? row_var : col_var; }
    const std::vector<float> &whole(int t) const { return t == 0 ? row_var : col_var; }
};
static_assert(optim::kMaxWholeTensors == 2, "ParamSpec::whole holds two tensors");

struct ParamGroup {
    optim::Hyper hyper;
    // Steps taken since the group was added, whether or not its params were updated:
    // an optimizer that counts steps per group (optim::StepCount::kGroup) uses it.
    int64_t steps = 0;
};

// Bytes per element of an SX_DTYPE_*.
inline size_t dtype_size(int32_t dtype) { return dtype == SX_DTYPE_F32 ? 4 : 2; }

// How a param of group `group` keeps its optimizer state slots (SX_STATE_*): its group's
// state dtype, but fp32 for a param too small or uneven for 8-bit blocks
// (optim/state_codec.h).
inline int32_t param_state_dtype(const ParamSpec &spec, const ParamGroup &group) {
    return optim::param_state_dtype(static_cast<int32_t>(group.hyper.state_dtype), spec.numel);
}

// Checks a param name: non-empty, at most SX_MAX_NAME_BYTES, valid UTF-8 without NUL.
Status validate_param_name(const char *name);

// Checks shape (ndim in [0, SX_MAX_NDIM], extents >= 1, product fits in 2^62) and
// returns the element count.
Status validate_shape(int32_t ndim, const int64_t *shape, uint64_t *numel);

// The hyperparameters a public param group descriptor states (not validated), and the
// descriptor's optimizer and hyperparameters from h (its other fields untouched).
optim::Hyper hyper_from_desc(const sx_param_group_desc_t &d);
void hyper_to_desc(const optim::Hyper &h, sx_param_group_desc_t *d);
// Every flag of the descriptor (a bool hyperparameter) is 0 or 1; the error names it.
Status check_desc_flags(const sx_param_group_desc_t &d);
// torch.optim's defaults for SX_OPTIM_<optimizer> (0: AdamW), lr 1e-3 and AdamW's
// weight_decay 1e-2 among them.
optim::Hyper default_hyper(int32_t optimizer);

// A fingerprint of the optimizer and every hyperparameter, for ranks to compare.
uint64_t hyper_fingerprint(const optim::Hyper &h, uint64_t seed);

// Applies SX_HP_<key> = value to a copy of h; errors name the key and value.
Status set_hyperparameter(optim::Hyper *h, int32_t key, double value);
Status get_hyperparameter(const optim::Hyper &h, int32_t key, double *value);
const char *hyperparameter_name(int32_t key);
// Its name in h's optimizer (a custom optimizer's own keys too), or nullptr.
const char *hyperparameter_name(const optim::Hyper &h, int32_t key);

// FNV-1a, for fingerprints that ranks compare.
uint64_t fnv1a(const void *data, size_t bytes, uint64_t seed = 1469598103934665603ull);

}  // namespace core
}  // namespace sx
