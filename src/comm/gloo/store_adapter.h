// Our rendezvous Store as the gloo::rendezvous::Store that Gloo's connectFullMesh uses
// to exchange the ranks' addresses.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>
#include <stdexcept>

#include "rdzv/stores.h"

namespace sx {
namespace comm {

// What the adapter throws when our store fails: Gloo passes it through unchanged,
// so the creator gets back the original Status (code and text).
class StoreFailure : public std::runtime_error {
  public:
    explicit StoreFailure(Status status) : std::runtime_error(status.message()), status_(std::move(status)) {}
    const Status &status() const { return status_; }

  private:
    Status status_;
};

class GlooStoreAdapter final : public gloo::rendezvous::Store {
  public:
    // Every wait (and get, which Gloo may call before the key exists) ends by
    // `deadline`, whatever timeout Gloo passes: Gloo's own is shortened for the TCP
    // connect phase (see gloo_communicator.cc) and must not shorten the rendezvous.
    GlooStoreAdapter(std::shared_ptr<rdzv::Store> store, Clock::time_point deadline)
        : store_(std::move(store)), deadline_(deadline) {}

    void set(const std::string &key, const std::vector<char> &data) override;
    std::vector<char> get(const std::string &key) override;
    void wait(const std::vector<std::string> &keys) override;
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override;

  private:
    const std::shared_ptr<rdzv::Store> store_;
    const Clock::time_point deadline_;
};

}  // namespace comm
}  // namespace sx
