// What every store shares: the default erase_prefix, the counter format of add(), and
// the prefix view through which groups and purposes sharing one store keep apart.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "rdzv/store.h"
#include "rdzv/stores.h"

namespace sx {
namespace rdzv {

Status Store::erase_prefix(const std::string &prefix) {
    return SX_ERROR(SX_ERR_UNSUPPORTED, "this rendezvous store cannot erase the keys under '%s'",
                    prefix.c_str());
}

namespace {

// A counter is stored as its decimal text (what add() writes).
bool parse_counter(const std::string &text, int64_t *value) {
    if (text.empty()) return false;
    errno = 0;
    char *end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end != text.c_str() + text.size()) return false;
    *value = v;
    return true;
}

}  // namespace

Status apply_add(const std::string &key, const std::string *old, int64_t delta, int64_t *value) {
    int64_t current = 0;
    if (old != nullptr && !parse_counter(*old, &current)) {
        return SX_ERROR(SX_ERR_INVALID_STATE, "cannot add to rendezvous key '%s': its value is not a counter",
                        key.c_str());
    }
    SX_CHECK(!__builtin_add_overflow(current, delta, value), SX_ERR_INVALID_ARGUMENT,
             "adding %lld to rendezvous key '%s' (now %lld) overflows int64", static_cast<long long>(delta),
             key.c_str(), static_cast<long long>(current));
    return Status::Ok();
}

namespace {

// Each arrival adds 1 + world_size << kWorldShift to one counter, so that one read of it
// tells how many ranks arrived and whether they all said the same world size.
constexpr int kWorldShift = 24;  // arrivals below 2^24 > SX_MAX_WORLD_SIZE
constexpr int64_t kArrivalMask = (int64_t(1) << kWorldShift) - 1;
constexpr Millis kArrivalSlice(50);

// What the ranks that arrived said, grouped by size in rank order: "2 on rank 0, 3 on
// rank 1" (each rank records its word before it is counted; at most the first 64 ranks
// are looked at). Where the records cannot be read (rank 0's server gone), this rank's.
std::string world_sizes_text(Store &store, int rank, int world_size, int64_t arrivals) {
    std::vector<std::pair<long long, std::vector<long long>>> sizes;  // in the order of their first rank
    int64_t found = 0;
    for (int r = 0; r < 64 && found < arrivals; ++r) {
        bool present = false;
        std::string v;
        if (!store.check({format("__sx/said/%d", r)}, &present).ok()) break;
        if (!present || !store.get(format("__sx/said/%d", r), &v, Millis(200)).ok()) continue;
        ++found;
        const long long w = std::atoll(v.c_str());
        auto it = std::find_if(sizes.begin(), sizes.end(), [&](const auto &e) { return e.first == w; });
        if (it == sizes.end()) sizes.push_back({w, {}}), it = sizes.end() - 1;
        it->second.push_back(r);
    }
    if (found < 2) return format("%d on rank %d, and another size on a rank that arrived before it", world_size, rank);
    std::string out;
    for (const auto &e : sizes) {
        out += (out.empty() ? "" : ", ") + std::to_string(e.first) + (e.second.size() == 1 ? " on rank " : " on ranks ");
        for (size_t k = 0; k < e.second.size(); ++k) out += (k ? ", " : "") + std::to_string(e.second[k]);
    }
    return out;
}

// A rank that found the sizes disagree says it saw it, then stays (at most 1 s, its store
// and, on rank 0, the server up) until every rank that arrived has seen it too, so that
// each is told rather than left waiting for a server that went away.
Status leave_on_mismatch(Store &store, const std::string &text) {
    int64_t seen = 0, arrivals = 0;
    store.add("__sx/mismatch-seen", 1, &seen);
    const Clock::time_point until = Clock::now() + Millis(1000);
    while (Clock::now() < until) {
        if (!store.add("__sx/arrivals", 0, &arrivals).ok() || !store.add("__sx/mismatch-seen", 0, &seen).ok()) break;
        if (seen >= (arrivals & kArrivalMask)) break;
        std::this_thread::sleep_for(Millis(10));
    }
    return SX_ERROR(SX_ERR_MISMATCH, "%s", text.c_str());
}

}  // namespace

namespace {

void append_u32(std::string *out, uint32_t v) { out->append(reinterpret_cast<const char *>(&v), sizeof v); }

bool read_u32(const std::string &in, size_t *at, uint32_t *v) {
    if (*at + sizeof *v > in.size()) return false;
    std::memcpy(v, in.data() + *at, sizeof *v);
    *at += sizeof *v;
    return true;
}

// gather_values's table: the number of distinct values, each (its length, its bytes), then
// each rank's value's index.
std::string encode_values(const std::vector<std::string> &all) {
    std::map<std::string, uint32_t> index;
    std::vector<const std::string *> distinct;
    for (const std::string &v : all)
        if (index.emplace(v, static_cast<uint32_t>(distinct.size())).second) distinct.push_back(&v);
    std::string out;
    append_u32(&out, static_cast<uint32_t>(distinct.size()));
    for (const std::string *v : distinct) {
        append_u32(&out, static_cast<uint32_t>(v->size()));
        out += *v;
    }
    for (const std::string &v : all) append_u32(&out, index[v]);
    return out;
}

Status decode_values(const std::string &table, int world_size, std::vector<std::string> *all) {
    size_t at = 0;
    uint32_t n = 0;
    bool ok = read_u32(table, &at, &n) && n <= table.size();
    std::vector<std::string> distinct;
    for (uint32_t k = 0; ok && k < n; ++k) {
        uint32_t len = 0;
        ok = read_u32(table, &at, &len) && at + len <= table.size();
        if (ok) distinct.emplace_back(table, at, len);
        at += len;
    }
    all->assign(static_cast<size_t>(world_size), std::string());
    for (int q = 0; ok && q < world_size; ++q) {
        uint32_t k = 0;
        ok = read_u32(table, &at, &k) && k < n;
        if (ok) (*all)[static_cast<size_t>(q)] = distinct[k];
    }
    SX_CHECK(ok && at == table.size(), SX_ERR_CORRUPT,
             "the ranks' values that rank 0 published (%zu bytes) are no table of %d ranks", table.size(), world_size);
    return Status::Ok();
}

}  // namespace

Status gather_values(Store &store, const std::string &prefix, int rank, int world_size, const std::string &mine,
                     Clock::time_point deadline, std::vector<std::string> *all) {
    if (rank != 0) {
        SX_TRY(store.set(prefix + std::to_string(rank), mine));
        std::string table;
        Status s = store.get(prefix + "all", &table, time_left(deadline));
        if (!s.ok())
            return s.prefix(format("rank 0 did not publish every rank's '%s' value (a rank has not said it, or rank 0 "
                                   "failed): ",
                                   prefix.c_str()));
        return decode_values(table, world_size, all);
    }
    all->assign(static_cast<size_t>(world_size), std::string());
    (*all)[0] = mine;
    for (int q = 1; q < world_size; ++q)
        SX_TRY(store.get(prefix + std::to_string(q), &(*all)[static_cast<size_t>(q)], time_left(deadline))
                   .prefix(format("rank %d did not say its '%s' value: ", q, prefix.c_str())));
    return store.set(prefix + "all", encode_values(*all));
}

Status await_ranks(Store &store, int rank, int world_size, Clock::time_point deadline) {
    if (world_size <= 1) return Status::Ok();
    const Clock::time_point start = Clock::now();
    const std::string who = format("rank %d of %d: ", rank, world_size);
    const int64_t mine = 1 + (static_cast<int64_t>(world_size) << kWorldShift);
    int64_t counter = 0;
    SX_TRY(store.set(format("__sx/said/%d", rank), std::to_string(world_size)).prefix(who));
    SX_TRY(store.add("__sx/arrivals", mine, &counter).prefix(who));
    const int64_t arrived = counter & kArrivalMask, sum = counter >> kWorldShift;
    if (sum != static_cast<int64_t>(world_size) * arrived) {
        // This rank saw it: it tells the others, and leaves at once.
        SX_TRY(store.set("__sx/world-mismatch", "1").prefix(who));
        return leave_on_mismatch(store, who + "ranks disagree on world_size: " +
                                            world_sizes_text(store, rank, world_size, arrived));
    }
    if (arrived == world_size) {
        SX_TRY(store.set("__sx/all-arrived", "1").prefix(who));
    }
    // Waits for the last arrival, in slices, watching for a rank that said another size.
    for (;;) {
        bool mismatch = false;
        SX_TRY(store.check({"__sx/world-mismatch"}, &mismatch).prefix(who));
        if (mismatch) {
            int64_t now = arrived;
            store.add("__sx/arrivals", 0, &now);
            return leave_on_mismatch(store, who + "ranks disagree on world_size: " +
                                                world_sizes_text(store, rank, world_size, now & kArrivalMask));
        }
        const Millis left = time_left(deadline);
        if (left.count() <= 0) {
            return SX_ERROR(SX_ERR_TIMEOUT,
                            "%snot every rank joined the group within the timeout (%lld ms left when this rank "
                            "arrived, as rank number %lld to do so)",
                            who.c_str(),
                            static_cast<long long>(std::chrono::duration_cast<Millis>(deadline - start).count()),
                            static_cast<long long>(arrived));
        }
        Status s = store.wait({"__sx/all-arrived"}, std::min(left, kArrivalSlice));
        if (s.ok()) return s;
        if (s.code() != SX_ERR_TIMEOUT) return s.prefix(who);
    }
}

namespace {

class PrefixStore final : public Store {
  public:
    PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
        : inner_(std::move(inner)), prefix_(std::move(prefix)) {}

    Status set(const std::string &key, const std::string &value) override {
        return inner_->set(prefix_ + key, value);
    }
    Status get(const std::string &key, std::string *value, Millis timeout) override {
        return inner_->get(prefix_ + key, value, timeout);
    }
    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        return inner_->wait(prefixed(keys), timeout);
    }
    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        return inner_->add(prefix_ + key, delta, result);
    }
    Status check(const std::vector<std::string> &keys, bool *present) override {
        return inner_->check(prefixed(keys), present);
    }
    Status erase(const std::string &key) override { return inner_->erase(prefix_ + key); }
    Status erase_prefix(const std::string &prefix) override { return inner_->erase_prefix(prefix_ + prefix); }
    Status alive() override { return inner_->alive(); }

  private:
    std::vector<std::string> prefixed(const std::vector<std::string> &keys) const {
        std::vector<std::string> out;
        out.reserve(keys.size());
        for (const std::string &k : keys) out.push_back(prefix_ + k);
        return out;
    }

    const std::shared_ptr<Store> inner_;
    const std::string prefix_;
};

// Waits in short polls (check, then a pause growing from 2 to 50 ms), asking the watch
// between them while it is armed; everything else goes straight through.
class WatchedStore final : public Store {
  public:
    WatchedStore(std::shared_ptr<Store> inner, std::shared_ptr<StoreWatch> watch)
        : inner_(std::move(inner)), watch_(std::move(watch)) {}

    Status set(const std::string &key, const std::string &value) override { return inner_->set(key, value); }
    Status get(const std::string &key, std::string *value, Millis timeout) override {
        SX_TRY(wait({key}, timeout));
        return inner_->get(key, value, timeout);
    }
    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        const Clock::time_point deadline = Clock::now() + timeout;
        Millis pause(2);
        for (;;) {
            bool present = false;
            SX_TRY(inner_->check(keys, &present));
            if (present) return Status::Ok();
            bool armed = false;
            SX_TRY(watch_->check(&armed));
            if (!armed) return inner_->wait(keys, time_left(deadline));
            if (Clock::now() >= deadline) return inner_->wait(keys, Millis(0));  // its own words for the timeout
            std::this_thread::sleep_for(std::min(pause, time_left(deadline)));
            pause = std::min(pause * 2, Millis(50));
        }
    }
    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        return inner_->add(key, delta, result);
    }
    Status check(const std::vector<std::string> &keys, bool *present) override { return inner_->check(keys, present); }
    Status erase(const std::string &key) override { return inner_->erase(key); }
    Status erase_prefix(const std::string &prefix) override { return inner_->erase_prefix(prefix); }
    Status alive() override {
        bool armed = false;
        return watch_->check(&armed);
    }

  private:
    const std::shared_ptr<Store> inner_;
    const std::shared_ptr<StoreWatch> watch_;
};

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string &prefix) {
    return std::make_shared<PrefixStore>(std::move(inner), prefix);
}

StoreWatch::StoreWatch(std::function<Status()> alive) : alive_(std::move(alive)) {}

Status StoreWatch::check(bool *armed) {
    std::lock_guard<std::mutex> lock(mu_);
    *armed = static_cast<bool>(alive_);
    return alive_ ? alive_() : Status::Ok();
}

void StoreWatch::disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    alive_ = nullptr;
}

std::shared_ptr<Store> make_watched_store(std::shared_ptr<Store> inner, std::shared_ptr<StoreWatch> watch) {
    return std::make_shared<WatchedStore>(std::move(inner), std::move(watch));
}

}  // namespace rdzv
}  // namespace sx
