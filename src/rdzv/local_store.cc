// local://NAME: an in-process store for ranks that are threads of one process.
// One instance per NAME, found through a registry of weak pointers, so it lives
// exactly as long as some group holds it.
#include <condition_variable>
#include <map>
#include <mutex>

#include "rdzv/stores.h"

namespace sx {
namespace rdzv {
namespace {

class LocalStore final : public Store {
  public:
    Status set(const std::string &key, const std::string &value) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            data_[key] = value;
        }
        changed_.notify_all();
        return Status::Ok();
    }

    Status get(const std::string &key, std::string *value, Millis timeout) override {
        std::unique_lock<std::mutex> lock(mu_);
        auto it = data_.end();
        bool found = changed_.wait_for(lock, timeout, [&] {
            it = data_.find(key);
            return it != data_.end();
        });
        SX_CHECK(found, SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear within %lld ms", key.c_str(),
                 static_cast<long long>(timeout.count()));
        if (value != nullptr) *value = it->second;
        return Status::Ok();
    }

    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        std::unique_lock<std::mutex> lock(mu_);
        const std::string *missing = nullptr;
        bool found = changed_.wait_for(lock, timeout, [&] {
            missing = first_missing(keys);
            return missing == nullptr;
        });
        SX_CHECK(found, SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear within %lld ms", missing->c_str(),
                 static_cast<long long>(timeout.count()));
        return Status::Ok();
    }

    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        int64_t value = 0;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = data_.find(key);
            SX_TRY(apply_add(key, it == data_.end() ? nullptr : &it->second, delta, &value));
            data_[key] = std::to_string(value);
        }
        changed_.notify_all();
        if (result != nullptr) *result = value;
        return Status::Ok();
    }

    Status check(const std::vector<std::string> &keys, bool *present) override {
        std::lock_guard<std::mutex> lock(mu_);
        *present = first_missing(keys) == nullptr;
        return Status::Ok();
    }

    Status erase(const std::string &key) override {
        std::lock_guard<std::mutex> lock(mu_);
        data_.erase(key);
        return Status::Ok();
    }

    Status erase_prefix(const std::string &prefix) override {
        std::lock_guard<std::mutex> lock(mu_);
        // Keys with the prefix form one contiguous range of the ordered map.
        auto it = data_.lower_bound(prefix);
        while (it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0) it = data_.erase(it);
        return Status::Ok();
    }

  private:
    // The first of `keys` not stored, or null. Requires mu_.
    const std::string *first_missing(const std::vector<std::string> &keys) const {
        for (const std::string &k : keys)
            if (data_.find(k) == data_.end()) return &k;
        return nullptr;
    }

    std::mutex mu_;
    std::condition_variable changed_;  // notified after every set/add
    std::map<std::string, std::string> data_;
};

struct Registry {
    std::mutex mu;
    std::map<std::string, std::weak_ptr<LocalStore>> stores;
};

Registry &registry() {
    static Registry *r = new Registry();  // never destroyed: stores may outlive static teardown
    return *r;
}

}  // namespace

std::shared_ptr<Store> open_local_store(const std::string &name) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.stores.find(name);
    if (it != r.stores.end()) {
        if (std::shared_ptr<LocalStore> live = it->second.lock()) return live;
    }
    // The deleter drops the registry entry, unless a newer store already took the name
    // between the last release and this deleter taking the lock.
    std::shared_ptr<LocalStore> store(new LocalStore(), [name](LocalStore *s) {
        delete s;
        Registry &reg = registry();
        std::lock_guard<std::mutex> l(reg.mu);
        auto e = reg.stores.find(name);
        if (e != reg.stores.end() && e->second.expired()) reg.stores.erase(e);
    });
    r.stores[name] = store;
    return store;
}

}  // namespace rdzv
}  // namespace sx
