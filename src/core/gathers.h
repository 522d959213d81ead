// The gathers part of a shard group (docs/design.md, "Units as a pipeline"): a unit's
// params all-gathered from every rank's shard on the gather channel (a thread and a
// communicator of its own, inside the shard group), while the trainer goes on. Stages 1
// and 2: the deferred gathers of a step with defer_gather, into the units' flat buffers.
// Stage 3: a unit's whole params exist only while it is gathered; this part owns those
// buffers (and the spares a step reuses), counts the trainer's gathers and releases,
// prefetches in the order of the last step's gathers, and copies a released unit's
// shard back. Every rank submits the same gathers in the same order (the trainer's
// calls, collective, or the order the caller passes); a call's header goes ahead of a
// trainer's gather that communicates (meet), so that ranks in different calls are told.
// It sees units as geometry and the group's buffers registered with add_unit, and tells
// the group of failures through `fail`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "core/agreement.h"
#include "core/channel.h"
#include "core/device.h"

namespace sx {
namespace core {

class Gathers {
  public:
    struct Settings {
        int stage = 2;
        int shard_rank = 0, shard_size = 1;
        int prefetch_depth = 1;  // stage 3: units gathered ahead of the trainer's calls (0: none)
        bool exchanged = false;  // gathered buffers from the shared arena (Units::Settings)
        // Stage 3, offloaded: each unit's own shard is host memory (Units::own_on_host),
        // copied to the device into its gathered buffer and back at its release.
        bool own_on_host = false;
    };
    // One unit as the gathers see it, registered at sx_finalize in unit order. The
    // pointers are the group's and outlive this part.
    struct UnitBuffers {
        int32_t unit_id = 0;  // for the trace
        uint64_t shard_numel = 0, padded_numel = 0;
        size_t elem_size = 4;    // bytes of one param element
        void *whole = nullptr;   // stages 1-2: the unit's flat param buffer, gathered in place
        void *own = nullptr;     // stage 3: this rank's shard of the params
    };
    using FailFn = std::function<Status(Status)>;  // fails the group with s, returns s
    using UsableFn = std::function<bool()>;       // the group has not failed
    using ConnectFn = std::function<Status(std::unique_ptr<comm::Communicator> *)>;  // the shard group's

    Gathers(const Settings &settings, DeviceOps &ops, trace::Tracer *tracer, const CallHeaders &headers, FailFn fail,
            UsableFn usable, ConnectFn connect);
    // Stops the channel once the job under way returns (the owner aborts first where a
    // job may wait on a peer), then gives the spares' memory back.
    ~Gathers();
    Gathers(const Gathers &) = delete;
    Gathers &operator=(const Gathers &) = delete;

    void add_unit(const UnitBuffers &u);
    // The channel and its communicator (connected through `connect` where the shard group
    // has more than one rank), opened by every rank at the same call. Idempotent.
    Status open();

    // Queues unit u's all-gather (stage 3: into a buffer of this part's, from this rank's
    // shard). `header` (the trainer's sx_unit_gather of u): where the shard group has
    // more ranks, the call's header goes ahead of it, and *header receives its ticket.
    Status submit(size_t u, uint64_t *header = nullptr);
    // Waits for unit u's gather, if one is queued. Every wait (and drain, meet, gather)
    // returns a disagreement on a header queued before it as SX_ERR_MISMATCH with
    // nothing changed (stage 3's prefetches are headed too, and run in the background);
    // any other failure fails the group.
    Status wait(size_t u);
    // Waits for every job.
    Status drain();
    bool busy();
    // Any thread: the communicator aborted, so that a job waiting on a peer returns; with
    // a failure `why`, the peers' calls fail too (Communicator::fail_channel).
    void abort(const Status &why = Status::Ok());

    // Stage 3, the trainer's sx_unit_gather and sx_unit_release of unit u (checked by
    // the caller): see sx.h. A disagreement on the call's header is returned with
    // nothing changed.
    Status gather(size_t u);
    Status release(size_t u);
    // Stage 3, shard group > 1: a collective call's header on the channel, behind the
    // gathers queued (see sx.h's "Every collective call begins with..."); ranks in
    // different calls all return SX_ERR_MISMATCH, and nothing changes. Else nothing.
    Status meet(const char *call);

    // After the step's update. Stages 1-2 with defer_gather: `order`'s units gathered in
    // that order but `submitted` (queued already). Stage 3: the units held gathered are
    // gathered again (waited for); prefetched ones are stale and go.
    Status deferred(const std::vector<int32_t> &order, int32_t submitted);
    Status regather_held();
    // The step's end: this step's gathers become the order the next one prefetches in;
    // stage 3 starts the next forward's first gathers and frees the other spares.
    Status end_step();
    // Stage 3: frees the spare unit buffers, once nothing reads them.
    Status drop_spares();

    // Stage 3: sx_unit_gather calls of unit u not yet released; its whole params (null
    // unless resident) and their bytes.
    int pins(size_t u) const { return slots_[u].pins; }
    void *whole(size_t u) const { return slots_[u].whole.data(); }
    size_t whole_bytes(size_t u) const { return slots_[u].whole.size(); }
    // Bytes of param memory the group holds (the units' buffers, counted by the caller
    // with count_bytes, and the gathered and spare buffers), and the most held at once.
    void count_bytes(int64_t delta);
    uint64_t peak_bytes() const { return peak_bytes_; }
    // The units the last deferred step queued, in order.
    const std::vector<int32_t> &deferred_order() const { return deferred_order_; }

  private:
    struct Slot {
        UnitBuffers unit;
        Buffer whole;                   // stage 3: the whole params while resident
        bool resident = false;          // stage 3: `whole` holds (or a job fills) the values
        int pins = 0;
        uint64_t gather_ticket = 0;     // the gather job that fills it, if not yet waited for
        uint64_t copy_back_ticket = 0;  // the last release's copy into `own` (reads `whole`)
    };
    // Stage 3: unit buffers evicted this step, for its next gathers, each with the job
    // that still reads it (a release's copy back into the shard; 0: none).
    struct Spare {
        Buffer buffer;
        uint64_t pending = 0;
    };
    Status header(const char *call, std::vector<Fact> facts);
    // A failure of the channel: a disagreement on a header is returned once the channel
    // is recovered (the jobs behind it did not run, their units are no longer resident,
    // nothing else changed); anything else fails the group.
    Status failed(Status s);
    void recover();
    void evict(size_t u);
    std::vector<int32_t> prefetch_window() const;
    void prefetch();
    void unmark_spares();

    const Settings settings_;
    DeviceOps &ops_;
    trace::Tracer *tracer_;
    const CallHeaders &headers_;
    FailFn fail_;
    UsableFn usable_;
    ConnectFn connect_;
    std::vector<Slot> slots_;
    std::vector<Spare> spares_;
    std::vector<int32_t> log_;    // stage 3: sx_unit_gather calls since the last step
    std::vector<int32_t> order_;  // stage 3: those of the step before (the prefetch order)
    size_t pos_ = 0;              // stage 3: how far this step has come in order_
    bool realign_ = false;        // stage 3: a disagreement this step (see recover())
    std::vector<int32_t> deferred_order_;
    uint64_t bytes_ = 0, peak_bytes_ = 0;
    std::mutex comm_mu_;  // abort() reads comm_ from another thread
    std::unique_ptr<comm::Communicator> comm_;
    std::unique_ptr<CommChannel> channel_;  // after the communicator: stopped first
};

}  // namespace core
}  // namespace sx
