// A norm domain (sx_step.h, docs/model-parallel.md): the ranks of several groups (the
// data-parallel groups of every model-parallel slice) over which sx_step takes its
// gradient norm, its non-finite check and its loss-scale decision. It is a group of its
// own with no params over all of those ranks, whose communicator carries one small
// all-gather per step; the groups joined to it hold it.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "base/status.h"

namespace sx {
namespace core {

class ShardGroup;

class NormDomain {
  public:
    // Doubles each rank contributes to an exchange; word 0 names the call (kJoin, kStep),
    // so that ranks in different calls are told apart.
    static constexpr size_t kWords = 8;
    static constexpr double kJoin = 1.0, kStep = 2.0;
    using Words = std::array<double, kWords>;

    // Takes `group` (a group with no params, made over every rank of the domain).
    explicit NormDomain(std::unique_ptr<ShardGroup> group);
    ~NormDomain();
    NormDomain(const NormDomain &) = delete;
    NormDomain &operator=(const NormDomain &) = delete;

    int rank() const;
    int size() const;
    // Whether a group of this rank has joined (one may).
    bool joined() const { return joined_; }
    void set_joined() { joined_ = true; }

    // Collective over the domain: every rank's words, rank after rank (the same vector on
    // every rank). A failure of the exchange fails the domain.
    Status exchange(const Words &mine, std::vector<double> *all);
    // The words `tag` of every rank agree on `call`: SX_ERR_MISMATCH naming the ranks in
    // another call (one that is not `tag`) otherwise.
    Status same_call(const std::vector<double> &all, double tag, const char *call) const;

  private:
    std::unique_ptr<ShardGroup> group_;
    bool joined_ = false;
};

// Collective over the domain: checks with every rank that the slices are whole (slice s
// joined by its group's world size of ranks, each a distinct rank of it) and `local`
// (this rank's own refusal) is ok everywhere. Every rank returns the same verdict: ok,
// `local` where it failed here, or SX_ERR_MISMATCH naming what differs or which rank
// refused.
Status agree_join(NormDomain &domain, int slice, int group_rank, int group_size, const Status &local);

}  // namespace core
}  // namespace sx
