// The agreement part of a shard group: the small header every collective call exchanges
// first, and what ranks are told when theirs differ (docs/design.md, "Ranks agree before
// data moves"). A header names the call (a hash of its name) and fingerprints what must
// agree for it; because every call's header has the same size, ranks in different calls
// meet in the same exchange. When the fingerprints differ, the ranks exchange the facts
// behind them (each a name and a value in words) and every rank reports the first fact
// that differs with each rank's value ("the call: sx_step on rank 0,
// sx_save_optim_state on rank 1"; "param 'w' shape: [4, 4] on rank 0, [4, 5] on rank 1").
// The facts are put in words only after a disagreement, so agreeing costs one small
// collective per call. It knows communicators and facts, nothing of a group's buffers.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "core/params.h"
#include "core/shard_state.h"
#include "optim/optimizer.h"

namespace sx {
namespace core {

// One hash of a list of facts, in order (what ranks compare for a call's header).
uint64_t facts_fingerprint(const std::vector<Fact> &facts);

// What the ranks must agree on at a call of the step's family: compared as one
// fingerprint, and put in words as facts when the fingerprints differ.
struct Agreement {
    const char *call = "";
    std::vector<uint8_t> mask;       // the trainable mask in force
    double max_grad_norm = 0.0;
    std::vector<uint8_t> signalled;  // per unit: signalled ready (a round's end; else empty)
    int defer_gather = -1;           // 0 or 1 at a step or accumulate_grads; -1: not part
    std::vector<uint8_t> gathered;   // stage 3, at a step or accumulate_grads: per unit, held gathered
    bool weighted = false;           // the step's reduction is weighted (uneven inputs)
    int nonfinite = -1;              // at a step: options.nonfinite; -1: not part
    // The group's settings when the agreement was made (a reduction channel compares them
    // later, while the trainer may already be changing a learning rate for the step).
    std::vector<optim::Hyper> hypers;  // per param group
    int loss_scaling_mode = 0;
    double loss_scale = 1.0, growth_factor = 0.0, backoff_factor = 0.0;
    int64_t growth_interval = 0;
    int micro_batches = 0;
};

// The fingerprint ranks compare for an agreement: its call, mask, every group's
// hyperparameters, the loss scaling, the micro-batches and the rest of its fields.
uint64_t agreement_fingerprint(const Agreement &a);
// The same as facts in words; `params` names the mask's params.
std::vector<Fact> agreement_facts(const Agreement &a, const std::deque<ParamSpec> &params);

// What sx_finalize's ranks compare: the settings that shape the table, the param groups'
// optimizers and every param's name, shape, dtype, group, unit and frozen flag (mask:
// per param, nonzero = trainable).
struct TableSettings {
    int stage = 0, grad_dtype = 0, reduce_dtype = 0;
    double grad_predivide_factor = 0.0;
};
std::vector<Fact> table_facts(const TableSettings &settings, const std::vector<optim::Hyper> &groups,
                              const std::deque<ParamSpec> &params, const std::vector<uint8_t> &mask);

// The header of one call: five words, on every rank and for every call.
struct CallHeader {
    uint64_t call = 0;         // a hash of the call's name (set by CallHeaders::exchange)
    uint64_t fingerprint = 0;  // of everything that must agree, the call included
    double weight = 0.0, value = 0.0;  // numbers the call adds over the ranks or reads
    int32_t refused = 0;  // the status code of a rank that refuses the call (its arguments), or 0
    uint32_t flags = 0;   // the call's own
};

// Exchanges headers and explains disagreements on a communicator whose ranks are a run
// of the world's (the world's, or a mesh's shard group's): ranks are named as the
// world's. A failed exchange is handed to `fail` (the group's: it fails the group), and
// its status returned. One thread at a time per communicator, as every collective.
class CallHeaders {
  public:
    using FailFn = std::function<Status(Status)>;
    using FactsFn = std::function<std::vector<Fact>()>;
    CallHeaders(int world_rank, trace::Tracer *tracer, FailFn fail)
        : world_rank_(world_rank), tracer_(tracer), fail_(std::move(fail)) {}

    // Collective on c: exchanges `mine` for `call`. Ranks in different calls, or whose
    // fingerprints differ, explain (facts(): this rank's facts, asked for only then, the
    // call's name first) and every rank returns SX_ERR_MISMATCH ("<intro>: <fact>: ...");
    // otherwise, where a rank refused the call, every other rank returns its code saying
    // which rank (the refusing rank gets its own code, with the text "refused", for its
    // caller to replace). *all (may be null) receives every rank's header, in rank order.
    // A communicator of one rank exchanges nothing.
    Status exchange(comm::Communicator &c, const char *call, CallHeader mine, const FactsFn &facts,
                    std::vector<CallHeader> *all, const char *intro = "ranks disagree") const;
    // Collective on c, once every rank found that the ranks disagree: they compare their
    // facts' hashes one by one and exchange their words for the first that differs; each
    // returns SX_ERR_MISMATCH naming it and every rank's value ("<intro>: <fact>: <value>
    // on rank 0, <value> on rank 1").
    Status explain(const char *intro, const std::vector<Fact> &mine, comm::Communicator &c) const;

  private:
    int world_rank_;
    trace::Tracer *tracer_;
    FailFn fail_;
};

}  // namespace core
}  // namespace sx
