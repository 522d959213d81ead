// A step timeline (docs/tracing.md): spans of a group's work (the agreement, each unit's
// reduce-scatter and all-gather, the norm, the update, waits on peers, a checkpoint's
// phases) kept in a bounded ring and written as a Chrome trace-event JSON file, one per
// rank, that Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// Off (no tracer), a span costs one predictable branch where it starts and one where it
// ends: SX_TRACE_SPAN(nullptr, ...) reads no clock and takes no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"

namespace sx {
namespace trace {

// No byte count, or no unit, in an event's args.
constexpr uint64_t kNoBytes = ~uint64_t(0);
constexpr int64_t kNoUnit = -1;
// Events a tracer keeps when its capacity is not given.
constexpr size_t kDefaultCapacity = size_t(1) << 16;
// The largest capacity accepted (about 1 GiB of events).
constexpr size_t kMaxCapacity = size_t(1) << 24;

// Nanoseconds on the trace clock: CLOCK_MONOTONIC shifted by one offset per process, taken
// once, to CLOCK_REALTIME. Spans never go backwards within a process (monotonic), and the
// files of ranks on different processes or machines line up as closely as their realtime
// clocks agree (NTP: well within a millisecond on one cluster).
int64_t now_ns();

// Names this thread in every trace it records into later ("sx channel: the gradient
// reductions"); a thread never named shows as "caller" (the trainer's thread, which calls sx).
void name_this_thread(const std::string &name);

// The file name of `rank`'s trace from a template: every "%r" becomes the rank; without
// one, ".rank<N>" goes before a trailing ".json", or ".rank<N>.json" is appended.
std::string rank_path(const std::string &templ, int rank);

// One span: [begin_ns, end_ns) on thread tid of the tracer's rank.
struct Event {
    const char *name = "";  // static text
    const char *cat = "";   // static text
    int64_t begin_ns = 0, end_ns = 0;
    int32_t tid = 0;
    int64_t unit = kNoUnit;     // a unit id (sx_param_desc_t.unit)
    uint64_t bytes = kNoBytes;  // bytes the span moved or wrote
    std::string detail;         // e.g. a checkpoint's path
};

// One rank's ring of events. record() and flush() may be called from any thread.
class Tracer {
  public:
    // path: the file flush() writes (already this rank's); capacity: the most events kept,
    // in [1, kMaxCapacity] (the oldest go first).
    Tracer(std::string path, int rank, int world_size, size_t capacity);
    Tracer(const Tracer &) = delete;
    Tracer &operator=(const Tracer &) = delete;

    const std::string &path() const { return path_; }
    size_t capacity() const { return capacity_; }

    void record(const char *cat, const char *name, int64_t begin_ns, int64_t end_ns, int64_t unit, uint64_t bytes,
                const char *detail);

    // Writes every event the ring holds (with the threads' names and the count of events
    // dropped) to path(), atomically: into "<path>.partial", then renamed over path(), so
    // that a reader never sees half a file. The ring keeps its events: each flush writes
    // the latest `capacity` of them. SX_ERR_IO naming the file if it cannot be written.
    Status flush();

    // Events recorded since the start, and those the ring has dropped for newer ones.
    uint64_t recorded() const;
    uint64_t dropped() const;

  private:
    struct Thread {
        int32_t tid;
        std::string name;
    };
    // The JSON text of a copy of the ring (oldest first) and the threads.
    std::string to_json(const std::vector<Event> &events, const std::vector<Thread> &threads, uint64_t dropped) const;

    const std::string path_;
    const int rank_, world_size_;
    const size_t capacity_;
    mutable std::mutex mu_;
    std::vector<Event> ring_;  // grows to capacity_, then wraps at next_
    size_t next_ = 0;          // where the next event goes once the ring is full
    uint64_t recorded_ = 0;
    std::vector<Thread> threads_;  // every thread that recorded, named at its first event
};

// A span from construction to destruction, recorded into `tracer` if it is not null.
class Span {
  public:
    Span(Tracer *tracer, const char *cat, const char *name, int64_t unit = kNoUnit, uint64_t bytes = kNoBytes,
         const char *detail = nullptr)
        : tracer_(tracer) {
        if (__builtin_expect(tracer_ != nullptr, 0)) {
            cat_ = cat;
            name_ = name;
            unit_ = unit;
            bytes_ = bytes;
            detail_ = detail;
            begin_ = now_ns();
        }
    }
    ~Span() {
        if (__builtin_expect(tracer_ != nullptr, 0))
            tracer_->record(cat_, name_, begin_, now_ns(), unit_, bytes_, detail_);
    }
    Span(const Span &) = delete;
    Span &operator=(const Span &) = delete;

    // For a count known only at the end (meaningless when off).
    void set_bytes(uint64_t bytes) { bytes_ = bytes; }
    bool on() const { return tracer_ != nullptr; }

  private:
    Tracer *tracer_;
    const char *cat_ = nullptr, *name_ = nullptr;
    int64_t unit_ = kNoUnit;
    uint64_t bytes_ = kNoBytes;
    const char *detail_ = nullptr;  // borrowed until the span ends
    int64_t begin_ = 0;
};

}  // namespace trace
}  // namespace sx

#define SX_TRACE_CONCAT_(a, b) a##b
#define SX_TRACE_CONCAT(a, b) SX_TRACE_CONCAT_(a, b)
// SX_TRACE_SPAN(tracer, "step", "reduce_scatter", unit, bytes): a span until the end of
// the enclosing scope. tracer null: nothing but a branch.
#define SX_TRACE_SPAN(tracer, ...) ::sx::trace::Span SX_TRACE_CONCAT(sx_trace_span_, __LINE__)((tracer), __VA_ARGS__)
