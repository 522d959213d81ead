// The reduction round of a shard group (docs/design.md, "Units as a pipeline"): one
// micro-batch's gradients, from the first sx_unit_grads_ready to the sx_step or
// sx_accumulate_grads that ends it. Each unit's reduce-scatter runs on the reduction
// channel (a thread on the group's communicator) as soon as it and every unit before it
// in the agreed order are signalled, so that it overlaps the trainer's backward; at a
// mesh, its replicas' all-reduce follows on a channel of its own; then the unit's part of
// the step's norm. The ranks agree on the round first (its agreement runs on the channel
// ahead of the reductions, or rides on the first of them) and at its end (one header: the units signalled, every rank's
// weight and sum of squares, and rank 0's new order of reductions when it changes).
// It owns the channels, the order, the round's bookkeeping and where each unit's reduced
// shard is; the work on a unit's buffers is the group's, asked for through Work.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "core/agreement.h"
#include "core/channel.h"

namespace sx {
namespace core {

class ReductionRound {
  public:
    // What a round asks of the group, on the channels' threads (but `fail`, any thread).
    // A failure these return has failed the group already, but for a disagreement.
    class Work {
      public:
        virtual ~Work() = default;
        // Collective: the round's opening agreement (SX_ERR_MISMATCH where the ranks differ).
        virtual Status agree_round(const Agreement &a) = 0;
        // Collective: unit u's gradients reduced into this rank's shard, at *shard; with
        // `accumulate`, into the unit's accumulator, and its gradients zeroed.
        virtual Status reduce_unit_grads(size_t u, bool accumulate, float **shard) = 0;
        // Whether the round's opening agreement can ride on its first reduction (the
        // transport carries riders, as the step's agreement does: Stepper::
        // agreement_rider_unit); otherwise it is an exchange of its own.
        virtual bool agreement_rides(bool accumulate) const {
            (void)accumulate;
            return false;
        }
        // Collective: the opening agreement a and then reduce_unit_grads(u), in one
        // exchange where the agreement rides (SX_ERR_MISMATCH where the ranks differ, with
        // nothing reduced).
        virtual Status reduce_unit_grads_agreeing(size_t u, bool accumulate, const Agreement &a, float **shard) {
            SX_TRY(agree_round(a));
            return reduce_unit_grads(u, accumulate, shard);
        }
        // Collective (a mesh's replicas): the replicas' sum of unit u's reduced shard.
        virtual Status reduce_unit_replicas(size_t u, float *shard) = 0;
        // The sum of squares of unit u's reduced shard times grad_scale (its trainable part).
        virtual Status unit_sum_of_squares(size_t u, float *shard, float grad_scale, double *out) = 0;
        // Marks the group failed with s; returns s.
        virtual Status fail_group(Status s) = 0;
        // The group has not failed.
        virtual bool usable() const = 0;
    };
    // What the round's end needs of the world: its communicator, this rank, and the call
    // headers.
    struct World {
        comm::Communicator *comm = nullptr;
        int rank = 0, size = 1;
        int shard_size = 1;  // ranks [0, shard_size): the first replica group, whose squares count
        const CallHeaders *headers = nullptr;
        const std::deque<ParamSpec> *params = nullptr;  // to put the agreement in words
    };

    // stage: 1 keeps an accumulated micro-batch's gradients in place (nothing reduced);
    // replicated: a mesh with more than one replica (a channel for their all-reduces).
    ReductionRound(Work &work, trace::Tracer *tracer, int stage, bool replicated);
    // Stops the channels once the jobs under way return (the owner aborts the
    // communicators first where one may wait on a peer).
    ~ReductionRound();
    ReductionRound(const ReductionRound &) = delete;
    ReductionRound &operator=(const ReductionRound &) = delete;

    // sx_finalize laid out units (their ids, for the trace): they come first in the order
    // (last unit first, a backward's order) until the ranks learn better.
    void add_units(const std::vector<int32_t> &unit_ids);
    // The agreed order of reductions (rank 0's order of signals in the last round).
    const std::vector<int32_t> &order() const { return order_; }

    bool open() const { return round_.open; }
    bool accumulating() const { return round_.accumulate; }
    // Whether unit `unit` may be signalled now: SX_ERR_INVALID_ARGUMENT for an accumulate
    // flag unlike the round's first, SX_ERR_INVALID_STATE for a unit signalled twice.
    Status check_signal(int32_t unit, bool accumulate) const;
    // Opens a round over `mask` (already applied by the group: `trainable` says which
    // units have a trainable param), with the agreement its first job runs; grad_scale:
    // the norm's scale of the gradients.
    void begin(bool accumulate, std::vector<uint8_t> mask, std::vector<uint8_t> trainable, Agreement a,
               float grad_scale);
    // Unit `unit`'s gradients are ready: its reduction, and any after it in the order
    // that are ready, are queued.
    void signal(int32_t unit);
    // Ends the round: what was not signalled is reduced now, every reduction waited for,
    // and the ranks exchange one header (a's fingerprint with the round's mask and units
    // signalled, this rank's `weight` and sum of squares). A disagreement is returned as
    // SX_ERR_MISMATCH with *dropped = true (the gradients of this step are to be dropped,
    // nothing else changed); any other failure has failed the group. On success *sumsq
    // (may be null: accumulate) gets the sum of squares over the first replica group's
    // ranks, *weight_sum the ranks' weights, both added in rank order.
    Status end(const World &w, Agreement a, double weight, double *sumsq, double *weight_sum, bool *dropped);

    // Where unit u's reduced fp32 shard is after the last reduction (a round's, or one the
    // group made itself and recorded with set_reduced).
    float *reduced(size_t u) const { return reduced_[u]; }
    const std::vector<float *> &reduced() const { return reduced_; }
    void set_reduced(size_t u, float *shard) { reduced_[u] = shard; }
    // Waits for every job on the channels; the first failure.
    Status drain();
    bool busy();
    // Reductions run since the group was made. Any thread.
    uint64_t reductions_run() const { return reductions_run_.load(); }

  private:
    struct Round {
        bool open = false;
        bool accumulate = false;
        std::vector<uint8_t> mask;       // the trainable mask of the whole micro-batch
        std::vector<uint8_t> trainable;  // per unit, under the mask
        std::vector<uint8_t> signalled;  // per unit
        std::vector<int32_t> order;      // units in the order this rank signalled them
        size_t next = 0;                 // order_[next] is the next to submit
        float grad_scale = 1.0f;
        // The opening agreement, while it waits to ride on the round's first reduction.
        std::unique_ptr<Agreement> riding;
    };
    void submit(bool all);
    void submit_agreement(Agreement a);
    CommChannel &channel();

    Work &work_;
    trace::Tracer *tracer_;
    const int stage_;
    std::vector<int32_t> unit_ids_;
    Round round_;
    std::vector<int32_t> order_;
    std::vector<float *> reduced_;
    std::vector<double> unit_sumsq_;  // per unit: its part of the step's norm (a step round)
    std::atomic<uint64_t> reductions_run_{0};
    std::unique_ptr<CommChannel> channel_;
    std::unique_ptr<CommChannel> replica_channel_;  // replicated meshes
};

}  // namespace core
}  // namespace sx
