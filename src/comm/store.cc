// What every store shares: the default erase_prefix, the counter format of add(), and
// the prefix view through which groups and purposes sharing one store keep apart.
#include <cerrno>
#include <cstdlib>
#include <utility>

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

Status await_ranks(Store &store, int rank, int world_size, Clock::time_point deadline) {
    if (world_size <= 1) return Status::Ok();
    const Clock::time_point start = Clock::now();
    int64_t arrived = 0;
    SX_TRY(store.add("__sx/arrived", 1, &arrived).prefix(format("rank %d of %d: ", rank, world_size)));
    if (arrived == world_size) SX_TRY(store.set("__sx/all-arrived", "1"));
    Status s = store.wait({"__sx/all-arrived"}, time_left(deadline));
    if (s.code() == SX_ERR_TIMEOUT) {
        return SX_ERROR(SX_ERR_TIMEOUT,
                        "rank %d of %d: not every rank joined the group within the timeout (%lld ms left when this "
                        "rank arrived, as rank number %lld to do so)",
                        rank, world_size,
                        static_cast<long long>(std::chrono::duration_cast<Millis>(deadline - start).count()),
                        static_cast<long long>(arrived));
    }
    return s.prefix(format("rank %d of %d: ", rank, world_size));
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
