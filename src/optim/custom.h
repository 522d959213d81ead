// Custom optimizers: the ones a trainer registers through the C ABI
// (sx_register_optimizer), as rows of the optimizer table that the process adds at run
// time, and the pass that runs their update functions over this rank's shard.
//
// A step with custom optimizers must be able to fail and change nothing, since a
// trainer's function may report failure on any rank. So the units that hold a custom
// optimizer's params are double-buffered: the pass reads each slot's current values,
// writes the new ones into a second buffer (the custom function updates a copy, made
// piece by piece while it is in cache), and saves the params it overwrites; the step
// keeps the new buffers (swapping them in) only once every rank succeeded, and puts the
// params back otherwise. Built-in optimizers' params that share such a unit go through
// the same pass, so that the whole unit is kept or dropped together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace sx {
namespace optim {

class ThreadPool;

// One hyperparameter of a custom optimizer: sx's own (key SX_HP_*) or its own (key
// SX_HP_CUSTOM + i, its value in Hyper::custom[i]).
struct CustomHyper {
    std::string name;
    double dflt = 0.0;
    double min = 0.0, max = 0.0;  // both 0: any finite value
    int32_t key = 0;
};

// A registered optimizer: its row of the table (spec.custom points here) and what the
// row's fixed layout cannot hold. Never changes or goes once registered.
struct CustomOptimizer {
    OptimizerSpec spec{};
    int32_t id = 0;
    std::string name;
    std::vector<std::string> slot_names;
    float initial[kMaxStateSlots] = {0.0f, 0.0f, 0.0f};
    std::vector<CustomHyper> hypers;  // in registration order
    int num_own = 0;                  // of them, keyed SX_HP_CUSTOM + i
    sx_optimizer_update_fn update = nullptr;
    void *user_data = nullptr;
    bool in_place = false;  // SX_OPTIMIZER_IN_PLACE: never double-buffered
};

// Registers `desc` (checked whole first: nothing changes on error); *id receives its
// SX_OPTIM_CUSTOM_FIRST + n id, the old one for an equal description. Any thread.
Status register_custom(const sx_optimizer_desc_t &desc, int32_t *id);
// The registered optimizer with that id, or nullptr. Any thread.
const CustomOptimizer *find_custom(int32_t id);
// By name, or nullptr. Any thread.
const CustomOptimizer *find_custom(const std::string &name);
inline bool is_custom(Kind kind) { return static_cast<int32_t>(kind) >= SX_OPTIM_CUSTOM_FIRST; }
// A custom optimizer whose updates are double-buffered (not SX_OPTIMIZER_IN_PLACE).
bool double_buffers(Kind kind);

// The value of hyperparameter `key` (SX_HP_* or SX_HP_CUSTOM + i) in h, as a double.
double hyper_value(const Hyper &h, int32_t key);

// A failure reported by a custom update: the first one a thread met (param -1: none);
// and the inf or NaN values custom updates wrote (into a param's values or its state),
// which the step's nonfinite policy then judges as it judges the gradients'.
struct CustomFailure {
    int32_t code = 0;
    int32_t param = -1;
    const char *optimizer = nullptr;
    std::string message;  // what the update wrote into the piece's error buffer, if anything
    uint64_t nonfinite = 0;         // values written that are inf or NaN
    int32_t nonfinite_param = -1;   // the first param they were written into (-1: none)
    const char *nonfinite_optimizer = nullptr;
};

// The pass that runs custom optimizers' functions (and, in double-buffered units, the
// built-in kernel too), piece by piece across the pool. A segment with `undo` set is
// double-buffered (see the file's comment): its state is copied (or, at a custom
// optimizer's first update of the param, filled with the slot's initial value) from
// state_in into a working copy, its param saved into undo, the piece updated, and the
// working copy streamed into state. Without `undo` (SX_OPTIMIZER_IN_PLACE) the function
// updates params and slots where they are. *sumsq (if not null) gets the sum of the
// squared scaled gradients. Returns whether every update succeeded; *failure names the
// first that did not. Afterwards, undo_double_buffered puts back every param a
// double-buffered pass changed (a failure on any rank), and nothing else needs undoing:
// the slots' old values are still in state_in.
bool custom_update(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool, double *sumsq,
                   CustomFailure *failure);
void undo_double_buffered(const Segment *segs, size_t num_segs, ThreadPool *pool);

}  // namespace optim
}  // namespace sx
