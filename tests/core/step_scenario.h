// A training scenario run twice: by real ranks through the public API (sharded), and by
// an unsharded single-process reference built on the optimizer's scalar reference.
// Gradients are multiples of 1/64 small enough that their sums over ranks and
// micro-batches are exact in fp32 in any order, so both runs see the same gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sx/sx.h"

namespace sxtest {

struct ParamDef {
    std::string name;
    std::vector<int64_t> shape;
    int32_t group = 0;
    int32_t unit = 0;
};

struct Scenario {
    int world = 1;
    int stage = 2;
    int steps = 12;
    int micro_batches = 3;
    double max_grad_norm = 0.0;
    std::vector<sx_param_group_desc_t> groups;
    std::vector<ParamDef> params;
    // Trainable flag of param p during step s (1-based); null = always trainable.
    std::function<bool(int step, int param)> trainable;
    // Whether to flip the trainable bytes through sx_trainable_mask (else sx_set_trainable).
    bool mask_through_pointer = true;

    // Units as a pipeline. overlap: each unit's gradients are written and signalled ready
    // (sx_unit_grads_ready) one unit after the other, in the order signal_order gives
    // (unit indices; null: decreasing index). defer_gather: steps defer their all-gather
    // and the trainer waits for each unit with sx_unit_gather. At stage 3, and with
    // gather_units, every step gathers and releases every unit around a forward (in
    // increasing index) and a backward (decreasing), and initial and final values go
    // through gathered units.
    bool overlap = false;
    std::function<std::vector<int32_t>(int rank, int step, int micro, int32_t units)> signal_order;
    bool defer_gather = false;
    bool gather_units = false;
    int prefetch_depth = 0;  // sx_group_config_t's (0: its default)
    // HSDP: sx_group_config_t's shard_size (0: the world size, a flat group) and
    // grad_predivide_factor.
    int shard_size = 0;
    double grad_predivide_factor = 0.0;
    // Checked after every step: "" or what is wrong (e.g. memory bounds).
    std::function<std::string(sx_shard_group_t *g, int rank, int step)> after_step;

    // Checkpoints: the run loads load_from (if set) after writing the initial values,
    // trains steps first_step..steps, and saves to save_to (if set) synchronously.
    int first_step = 1;
    std::string load_from;
    uint32_t load_flags = 0;  // SX_LOAD_*
    std::string save_to;
    // Every rank adds rank 0's gradients, so that the trajectory does not depend on the
    // world size (up to the rounding of the average).
    bool same_grads_on_every_rank = false;

    // Runtime param groups: params from index added_params_from on, and param groups from
    // added_groups_from on, are registered after step add_after_step (0: never), after
    // sx_finalize, and laid out by a second sx_finalize; the reference starts updating
    // them at step add_after_step + 1, as torch's add_param_group would.
    int add_after_step = 0;
    size_t added_params_from = 0;
    size_t added_groups_from = 0;

    // The backend: SX_BACKEND_CPU (the default), or SX_BACKEND_CUDA, whose views are
    // device memory that the trainer reaches through device_copy (to_device: host ->
    // view, else view -> host; false on failure), so that this scenario code needs no
    // CUDA of its own (tests/core/test_cuda_pipeline.cc gives cudaMemcpy).
    int32_t backend = SX_BACKEND_CPU;
    std::function<bool(void *dst, const void *src, size_t bytes, bool to_device)> device_copy;

    // Called once the group is set up and the initial values are written (before the
    // load of load_from): "" or what is wrong.
    std::function<std::string(sx_shard_group_t *g, int rank)> after_setup;
    // The reference only: the world size of the steps before first_step (0: world), for a
    // run that continues what another world size began.
    int world_before = 0;
    // The reference only: the world size of each step (null: world_before, then world),
    // for runs that change world sizes several times through checkpoints.
    std::function<int(int step)> world_of_step;
};

// The unsharded reference's optimizer state after its last step.
struct ReferenceState {
    std::vector<std::vector<float>> slots[3];  // per slot, per param
    std::vector<int64_t> steps, momentum_steps;  // per param
};

uint64_t numel(const ParamDef &p);

// The initial value of element i of param p (the same on every rank).
float initial_value(int p, uint64_t i);
// The gradient rank r adds for micro-batch m of step s, element i of param p.
float gradient(int rank, int step, int micro, int p, uint64_t i);

// The unsharded reference: final values of every param (and, if `state` is not null, its
// optimizer state).
std::vector<std::vector<float>> reference_run(const Scenario &sc, ReferenceState *state = nullptr);

// One rank's run through the public API. `rendezvous` is local://NAME, tcp://HOST:PORT
// or file:///DIR. Returns "" on success, else what went wrong. `final_params` (may be
// null) receives the params after the last step.
std::string rank_run(const Scenario &sc, const std::string &rendezvous, int rank, int timeout_ms,
                     std::vector<std::vector<float>> *final_params);

// Runs all ranks as threads over local://NAME-PID; each rank's final params into *out.
// Returns "" or the first rank's failure.
std::string run_threads(const Scenario &sc, const std::string &name, std::vector<std::vector<std::vector<float>>> *out);

// Runs all ranks as threads over local://NAME and compares each rank's params with the
// reference to `rel_tol` relative. Returns "" or the first failure.
std::string run_threads_and_compare(const Scenario &sc, const std::string &name, double rel_tol);

// One leg of a run continued through checkpoints: its ranks, mesh (0: flat), stage,
// steps [first, last] and backend (0: the scenario's).
struct Leg {
    int world, shard_size, stage, first, last;
    int32_t backend = 0;
};

// Runs sc's legs in order, each as threads over local://NAME-K: leg k loads leg k-1's
// checkpoint and saves its own into DIR/legK (all but the last), pipelined at stage 3.
// Every rank's params after the last leg are compared with `want` to rel_tol. Returns ""
// or the first failure.
std::string run_legs(const Scenario &sc, const std::vector<Leg> &legs, const std::string &dir,
                     const std::string &name, const std::vector<std::vector<float>> &want, double rel_tol);

// Compares two sets of params; "" if every element agrees to rel_tol relative
// (absolute below 1e-3 in magnitude).
std::string compare(const std::vector<std::vector<float>> &got,
                    const std::vector<std::vector<float>> &want, double rel_tol);

// Common param groups.
sx_param_group_desc_t group_desc(int32_t optimizer, double lr);

// Two param groups of `optimizer` with unlike hyperparameters over five params of awkward
// sizes in three units (ids 0, 1 and 4), clipping at 5.
Scenario two_group_scenario(int32_t optimizer);

// two_group_scenario's groups over eight units of unlike sizes (two params each, unit ids
// 0, 2, ..., 14), 6 steps.
Scenario eight_unit_scenario();

// two_group_scenario with a third param group (SGD with momentum, or AdamW with
// amsgrad for SGD scenarios) and three more params in new units 5 and 7 (one of them in
// group 0), all added after step `after`.
Scenario late_group_scenario(int32_t optimizer, int after);

// Freezes "block.w" (param 2) for steps 4-6, the whole unit of "head.weight" (param 4) for
// steps 2-5, and "embed.bias" (param 1) until step 4.
bool freeze_schedule(int step, int p);

}  // namespace sxtest
