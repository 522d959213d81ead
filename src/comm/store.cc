// What every store shares: the default erase_prefix, the counter format of add(), and
// the prefix view through which groups and purposes sharing one store keep apart.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "comm/store.h"
#include "comm/stores.h"

namespace sx {
namespace comm {

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

// Every arrived rank's word for the world size, grouped by size: "2 on ranks 0, 1, 3 on
// rank 2" (from the arrivals' records; those not yet written are left out).
std::string world_sizes_text(Store &store, int64_t arrivals) {
    std::vector<std::pair<long long, long long>> said;  // rank, size
    for (int64_t i = 1; i <= arrivals && i <= 64; ++i) {
        std::string v;
        if (!store.get(format("__sx/arrival/%lld", static_cast<long long>(i)), &v, Millis(200)).ok()) continue;
        long long r = -1, w = -1;
        if (std::sscanf(v.c_str(), "%lld %lld", &r, &w) == 2) said.push_back({r, w});
    }
    std::sort(said.begin(), said.end());
    std::vector<std::pair<long long, std::vector<long long>>> sizes;  // in the order of their first rank
    for (const auto &e : said) {
        auto it = std::find_if(sizes.begin(), sizes.end(), [&](const auto &s) { return s.first == e.second; });
        if (it == sizes.end()) sizes.push_back({e.second, {}}), it = sizes.end() - 1;
        it->second.push_back(e.first);
    }
    std::string out;
    for (const auto &e : sizes) {
        out += (out.empty() ? "" : ", ") + std::to_string(e.first) + (e.second.size() == 1 ? " on rank " : " on ranks ");
        for (size_t k = 0; k < e.second.size(); ++k) out += (k ? ", " : "") + std::to_string(e.second[k]);
    }
    return out;
}

}  // namespace

Status await_ranks(Store &store, int rank, int world_size, Clock::time_point deadline) {
    if (world_size <= 1) return Status::Ok();
    const Clock::time_point start = Clock::now();
    const std::string who = format("rank %d of %d: ", rank, world_size);
    const int64_t mine = 1 + (static_cast<int64_t>(world_size) << kWorldShift);
    int64_t counter = 0;
    SX_TRY(store.add("__sx/arrivals", mine, &counter).prefix(who));
    const int64_t arrived = counter & kArrivalMask, sum = counter >> kWorldShift;
    SX_TRY(store.set(format("__sx/arrival/%lld", static_cast<long long>(arrived)), format("%d %d", rank, world_size))
               .prefix(who));
    if (sum != static_cast<int64_t>(world_size) * arrived) {
        SX_TRY(store.set("__sx/world-mismatch", "1").prefix(who));
    } else if (arrived == world_size) {
        SX_TRY(store.set("__sx/all-arrived", "1").prefix(who));
    }
    // Waits for the last arrival, in slices, watching for a rank that said another size.
    for (;;) {
        bool mismatch = false;
        SX_TRY(store.check({"__sx/world-mismatch"}, &mismatch).prefix(who));
        if (mismatch) {
            int64_t now = 0;
            SX_TRY(store.add("__sx/arrivals", 0, &now).prefix(who));
            return SX_ERROR(SX_ERR_MISMATCH, "%sranks disagree on world_size: %s", who.c_str(),
                            world_sizes_text(store, now & kArrivalMask).c_str());
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

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string &prefix) {
    return std::make_shared<PrefixStore>(std::move(inner), prefix);
}

}  // namespace comm
}  // namespace sx
