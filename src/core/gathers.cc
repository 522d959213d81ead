// The gathers part (gathers.h).
#include "core/gathers.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace sx {
namespace core {
namespace {

// Debug builds mark the memory of a released stage-3 unit, so that a view kept past
// sx_unit_release fails loudly: filled with 0xff bytes (NaN in every float dtype) and,
// under AddressSanitizer, poisoned (a read or write is reported where it happens).
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kMarkReleased = true;
#else
constexpr bool kMarkReleased = false;
#endif

void mark_released(void *p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    // It may be marked already: a spare whose gather a disagreement dropped.
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#endif
    std::memset(p, 0xff, bytes);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
}

void unmark_released(void *p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#else
    (void)p;
    (void)bytes;
#endif
}

}  // namespace

Gathers::Gathers(const Settings &settings, DeviceOps &ops, trace::Tracer *tracer, const CallHeaders &headers,
                 FailFn fail, UsableFn usable, ConnectFn connect)
    : settings_(settings), ops_(ops), tracer_(tracer), headers_(headers), fail_(std::move(fail)),
      usable_(std::move(usable)), connect_(std::move(connect)) {}

Gathers::~Gathers() {
    channel_.reset();
    unmark_spares();
}

void Gathers::add_unit(const UnitBuffers &u) {
    Slot s;
    s.unit = u;
    slots_.push_back(std::move(s));
}

Status Gathers::open() {
    if (channel_) return Status::Ok();
    std::unique_ptr<comm::Communicator> c;
    if (settings_.shard_size > 1) SX_TRY(connect_(&c));
    {
        std::lock_guard<std::mutex> lock(comm_mu_);
        comm_ = std::move(c);
    }
    channel_.reset(new CommChannel("the param gathers"));
    return Status::Ok();
}

void Gathers::abort(const Status &why) {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ && why.ok()) comm_->abort();
    if (comm_ && !why.ok()) comm_->fail_channel(why);
}

bool Gathers::busy() { return channel_ && channel_->busy(); }

Status Gathers::drain() {
    if (!channel_) return Status::Ok();
    Status s = channel_->drain();
    if (!s.ok()) return failed(s);
    for (Slot &slot : slots_) slot.gather_ticket = 0;
    return s;
}

Status Gathers::failed(Status s) {
    if (s.code() == SX_ERR_MISMATCH && usable_()) {
        recover();
        return s;
    }
    return fail_(s);
}

void Gathers::count_bytes(int64_t delta) {
    bytes_ = static_cast<uint64_t>(static_cast<int64_t>(bytes_) + delta);
    peak_bytes_ = std::max(peak_bytes_, bytes_);
}

Status Gathers::submit(size_t u, uint64_t *header) {
    Slot &slot = slots_[u];
    const uint64_t S = slot.unit.shard_numel;
    const size_t es = slot.unit.elem_size;
    const bool stage3 = settings_.stage == 3;
    if (stage3 && !slot.resident) {
        const size_t bytes = slot.unit.padded_numel * es;
        // A buffer this step freed, of the same size, if there is one: the gather writes
        // every byte of it. Otherwise the spares go before a new buffer comes, so that
        // the buffers held never outnumber the most units resident at once.
        auto spare = std::find_if(spares_.begin(), spares_.end(), [&](const Spare &b) { return b.buffer.size() == bytes; });
        if (spare != spares_.end()) {
            // Its copy back into the shard it came from (if still queued) runs before this
            // gather, on the same channel.
            slot.whole = std::move(spare->buffer);
            spares_.erase(spare);
        } else {
            SX_TRY(drop_spares());
            Buffer full;
            SX_TRY(ops_.allocate(bytes, "a gathered unit's params", &full, true, settings_.exchanged));
            slot.whole = std::move(full);
            count_bytes(static_cast<int64_t>(slot.whole.size()));
        }
        slot.resident = true;
    }
    const int shards = settings_.shard_size;
    if (shards == 1 && !stage3) return Status::Ok();  // the params are whole already
    char *full = stage3 ? slot.whole.as<char>() : static_cast<char *>(slot.unit.whole);
    const void *own = slot.unit.own;
    const bool unmark = kMarkReleased && stage3 && ops_.device() == SX_DEVICE_CPU;
    const size_t bytes = slot.unit.padded_numel * es;
    const int32_t id = slot.unit.unit_id;
    const uint64_t mine_at = static_cast<uint64_t>(settings_.shard_rank) * S * es;
    // Stage 3: every gather that communicates (the trainer's, or a prefetch) has a header
    // naming its unit, in a job of its own right ahead of it: ranks whose calls went
    // astray meet header to header, and are told, where a header would otherwise meet a
    // gather's data.
    if (stage3 && shards > 1) {
        const uint64_t h = channel_->submit(
            [this, u] { return this->header("sx_unit_gather", {{"the unit gathered", std::to_string(u)}}); });
        if (header) *header = h;
    }
    slot.gather_ticket = channel_->submit([this, full, own, S, es, unmark, bytes, id, stage3, mine_at, shards]() -> Status {
        SX_TRACE_SPAN(tracer_, "step", "all_gather", id, bytes);
        if (unmark) unmark_released(full, bytes);  // a spare's, marked when its unit was released
        Status s = !stage3                 ? Status::Ok()
                   : settings_.own_on_host ? ops_.from_host(full + mine_at, own, S * es)
                                           : ops_.copy(full + mine_at, own, S * es);
        if (s.ok() && shards > 1) s = comm_->all_gather(full, S * es);
        return s.ok() ? s : fail_(s);
    });
    return Status::Ok();
}

Status Gathers::wait(size_t u) {
    Slot &slot = slots_[u];
    if (!slot.gather_ticket) return Status::Ok();
    SX_TRACE_SPAN(tracer_, "step", "wait_gather", slot.unit.unit_id);
    Status s = channel_->wait(slot.gather_ticket);
    if (!s.ok()) return failed(s);
    slot.gather_ticket = 0;
    return Status::Ok();
}

Status Gathers::header(const char *call, std::vector<Fact> facts) {
    facts.insert(facts.begin(), Fact{"the call", call});
    CallHeader mine;
    mine.fingerprint = facts_fingerprint(facts);
    return headers_.exchange(*comm_, call, mine, [&] { return facts; }, nullptr);
}

Status Gathers::meet(const char *call) {
    if (settings_.stage != 3 || !channel_ || settings_.shard_size == 1) return Status::Ok();
    Status s = channel_->wait(channel_->submit([this, call] { return header(call, {}); }));
    return s.ok() ? s : failed(s);
}

void Gathers::recover() {
    // Every job behind the header that disagreed ends with its failure, unrun (but the
    // local ones, which always run); the ones before it ran.
    (void)channel_->drain();
    const uint64_t failed_at = channel_->failed_at();
    channel_->clear_failure();
    // The ranks' gathers may differ now: a call of one rank that exchanged nothing (a
    // gather of a prefetched unit) may have gone through where its peer's failed. So
    // they start over alike: until the step's end nothing is prefetched and a released
    // unit goes at once (every gather then communicates, headed), only the units the
    // trainer holds stay, and this step's order of gathers begins anew.
    realign_ = true;
    log_.clear();
    order_.clear();
    pos_ = 0;
    for (size_t u = 0; u < slots_.size(); ++u) {
        Slot &slot = slots_[u];
        if (slot.gather_ticket >= failed_at) slot.gather_ticket = 0;  // dropped
        if (slot.pins > 0) continue;  // the trainer's views of it stay valid
        slot.gather_ticket = 0;       // ran, or dropped
        evict(u);
    }
}

void Gathers::evict(size_t u) {
    Slot &slot = slots_[u];
    if (!slot.resident) return;
    // Kept for the step's next gathers (fresh memory faults in slower than a gather
    // fills it), with the copy back of its last release, which may still be queued;
    // the byte count still counts it.
    uint64_t pending = slot.copy_back_ticket;
    if (kMarkReleased && ops_.device() == SX_DEVICE_CPU) {
        // After the copy back, on the same channel; a later gather into the buffer unmarks it.
        void *p = slot.whole.data();
        const size_t bytes = slot.whole.size();
        pending = channel_->submit(
            [p, bytes]() -> Status {
                mark_released(p, bytes);
                return Status::Ok();
            },
            true);
    }
    spares_.push_back({std::move(slot.whole), pending});
    slot.copy_back_ticket = 0;
    slot.whole = Buffer();
    slot.resident = false;
}

void Gathers::unmark_spares() {
    if (!kMarkReleased || ops_.device() != SX_DEVICE_CPU) return;
    for (Spare &b : spares_) unmark_released(b.buffer.data(), b.buffer.size());
}

Status Gathers::drop_spares() {
    Status s;
    for (Spare &b : spares_) {
        // A copy back still reading the buffer ends first.
        if (b.pending) {
            Status w = channel_->wait(b.pending);
            if (s.ok() && !w.ok()) s = failed(w);
        }
        if (kMarkReleased && ops_.device() == SX_DEVICE_CPU) unmark_released(b.buffer.data(), b.buffer.size());
        count_bytes(-static_cast<int64_t>(b.buffer.size()));
    }
    spares_.clear();
    return s;
}

Status Gathers::deferred(const std::vector<int32_t> &order, int32_t submitted) {
    if (settings_.shard_size == 1) return Status::Ok();
    SX_TRY(open());
    deferred_order_.clear();
    for (int32_t u : order) {
        if (u != submitted) SX_TRY(submit(static_cast<size_t>(u)));
        deferred_order_.push_back(u);
    }
    return Status::Ok();
}

Status Gathers::regather_held() {
    for (size_t u = 0; u < slots_.size(); ++u) {
        if (slots_[u].pins == 0) {
            evict(u);
        } else {
            SX_TRY(submit(u));
        }
    }
    for (size_t u = 0; u < slots_.size(); ++u) SX_TRY(wait(u));
    return Status::Ok();  // the spares go at the step's end (or the load's), after its prefetch
}

Status Gathers::end_step() {
    if (!log_.empty()) order_ = std::move(log_);
    log_.clear();
    pos_ = 0;
    realign_ = false;
    if (settings_.stage != 3) return Status::Ok();
    // The next forward's first units are gathered while the trainer goes on (in the
    // buffers this step freed, if they fit); the other spares go.
    if (!order_.empty()) prefetch();
    return drop_spares();
}

std::vector<int32_t> Gathers::prefetch_window() const {
    std::vector<int32_t> window;
    const size_t depth = static_cast<size_t>(settings_.prefetch_depth);
    if (depth == 0 || realign_) return window;
    if (order_.empty()) {
        // The first step: registration order after the unit last gathered, as long as the
        // trainer has gone up that order (a forward); nothing once it turns (a backward).
        const size_t n = log_.size();
        if (n >= 2 && log_[n - 1] < log_[n - 2]) return window;
        const int32_t last = n ? log_.back() : -1;
        for (int32_t u = last + 1; u < static_cast<int32_t>(slots_.size()) && window.size() < depth; ++u)
            window.push_back(u);
        return window;
    }
    for (size_t k = pos_; k < order_.size() && window.size() < depth; ++k) {
        const int32_t u = order_[k];
        if (slots_[u].pins == 0 && std::find(window.begin(), window.end(), u) == window.end()) window.push_back(u);
    }
    return window;
}

void Gathers::prefetch() {
    const std::vector<int32_t> window = prefetch_window();
    // Units gathered ahead that the order no longer reaches soon go first (bounded memory).
    for (size_t u = 0; u < slots_.size(); ++u)
        if (slots_[u].resident && slots_[u].pins == 0 &&
            std::find(window.begin(), window.end(), static_cast<int32_t>(u)) == window.end()) {
            if (wait(u).ok()) evict(u);
        }
    for (int32_t u : window)
        if (!slots_[u].resident && !submit(static_cast<size_t>(u)).ok()) return;  // a hint only
}

Status Gathers::gather(size_t u) {
    Slot &slot = slots_[u];
    // A gather that communicates meets the peers' calls first (meet), before anything
    // else here changes: its header, then its data, and this call waits for the header.
    // One of a unit already resident (prefetched) exchanges nothing: a disagreement is
    // told by the next exchange (its prefetch's header, or the next call's).
    if (!slot.resident) {
        uint64_t ticket = 0;
        SX_TRY(submit(u, &ticket));
        if (ticket) {
            Status h = channel_->wait(ticket);
            if (!h.ok()) return failed(h);  // a disagreement: the unit's gather did not run
        }
    }
    ++slot.pins;
    const int32_t unit = static_cast<int32_t>(u);
    log_.push_back(unit);
    // Where this call stands in the last step's order of gathers.
    for (size_t k = pos_; k < order_.size(); ++k)
        if (order_[k] == unit) {
            pos_ = k + 1;
            break;
        }
    prefetch();
    Status s = wait(u);
    if (!s.ok()) --slot.pins;
    return s;
}

Status Gathers::release(size_t u) {
    Slot &slot = slots_[u];
    SX_CHECK(slot.pins > 0, SX_ERR_INVALID_STATE, "unit %zu is not gathered (sx_unit_release without sx_unit_gather)",
             u);
    if (--slot.pins > 0) return Status::Ok();
    // This rank keeps its shard of what the buffer holds: values the trainer wrote into
    // it (initial values) are kept. The copy runs on the gather channel, ahead of any
    // later gather of this unit or reuse of its buffer (both queued behind it there), and
    // of the update, which drains the channel first.
    const uint64_t bytes = slot.unit.shard_numel * slot.unit.elem_size;
    void *own = slot.unit.own;
    const void *mine = slot.whole.as<char>() + static_cast<uint64_t>(settings_.shard_rank) * bytes;
    slot.copy_back_ticket = channel_->submit(
        [this, own, mine, bytes]() -> Status {
            Status s = settings_.own_on_host ? ops_.to_host(own, mine, bytes) : ops_.copy(own, mine, bytes);
            return s.ok() ? s : fail_(s);
        },
        true);
    const std::vector<int32_t> window = prefetch_window();
    if (std::find(window.begin(), window.end(), static_cast<int32_t>(u)) == window.end()) evict(u);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
