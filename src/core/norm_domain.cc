// A norm domain (norm_domain.h): its exchange and the check of a join.
#include "core/norm_domain.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/group.h"

namespace sx {
namespace core {

NormDomain::NormDomain(std::unique_ptr<ShardGroup> group) : group_(std::move(group)) {}
NormDomain::~NormDomain() = default;

int NormDomain::rank() const { return group_->rank(); }
int NormDomain::size() const { return group_->world_size(); }

Status NormDomain::exchange(const Words &mine, std::vector<double> *all) {
    SX_TRY(group_->check_usable());
    const size_t W = static_cast<size_t>(size());
    all->assign(W * kWords, 0.0);
    std::memcpy(all->data() + static_cast<size_t>(rank()) * kWords, mine.data(), sizeof(Words));
    if (W == 1) return Status::Ok();
    return group_->collective([&](comm::Communicator &c) { return c.all_gather(all->data(), sizeof(Words)); });
}

Status NormDomain::same_call(const std::vector<double> &all, double tag, const char *call) const {
    std::string others;
    for (size_t r = 0; r * kWords < all.size(); ++r)
        if (all[r * kWords] != tag) others += (others.empty() ? "" : ", ") + std::to_string(r);
    SX_CHECK(others.empty(), SX_ERR_MISMATCH,
             "norm domain: rank %d is in %s, and rank(s) %s of the domain are in another of the domain's calls "
             "(sx_join_norm_domain, or sx_step of a joined group)",
             rank(), call, others.c_str());
    return Status::Ok();
}

namespace {

// The first rank whose join refused (word 4: its status code), or -1.
int first_refusal(const std::vector<double> &all) {
    for (size_t r = 0; r * NormDomain::kWords < all.size(); ++r)
        if (all[r * NormDomain::kWords + 4] != 0.0) return static_cast<int>(r);
    return -1;
}

// Slice s's members: each of its group's ranks once, and as many as its group has.
Status check_slices(const std::vector<double> &all) {
    const size_t K = NormDomain::kWords, W = all.size() / K;
    int slices = 0;
    for (size_t r = 0; r < W; ++r) slices = std::max(slices, static_cast<int>(all[r * K + 1]) + 1);
    for (int s = 0; s < slices; ++s) {
        std::vector<int> members(W, -1);
        int size = -1, count = 0;
        for (size_t r = 0; r < W; ++r) {
            if (static_cast<int>(all[r * K + 1]) != s) continue;
            const int gsize = static_cast<int>(all[r * K + 2]), grank = static_cast<int>(all[r * K + 3]);
            SX_CHECK(size < 0 || gsize == size, SX_ERR_MISMATCH,
                     "norm domain: slice %d is joined by groups of %d and %d ranks (domain rank %zu has %d); every "
                     "rank of a slice joins with the same group", s, size, gsize, r, gsize);
            size = gsize;
            SX_CHECK(grank >= 0 && static_cast<size_t>(grank) < W, SX_ERR_MISMATCH,
                     "norm domain: domain rank %zu joined as rank %d of a group, outside the domain's %zu ranks", r,
                     grank, W);
            SX_CHECK(members[static_cast<size_t>(grank)] < 0, SX_ERR_MISMATCH,
                     "norm domain: domain ranks %d and %zu both joined slice %d as rank %d of their group; a slice's "
                     "ranks are its one group's distinct ranks", members[static_cast<size_t>(grank)], r, s, grank);
            members[static_cast<size_t>(grank)] = static_cast<int>(r);
            ++count;
        }
        SX_CHECK(size > 0, SX_ERR_MISMATCH,
                 "norm domain: no rank joined slice %d, but %d slices are joined (slices are numbered 0, 1, ... "
                 "without gaps)", s, slices);
        SX_CHECK(count == size, SX_ERR_MISMATCH,
                 "norm domain: slice %d is joined by %d ranks, but its group has %d; every rank of every slice's "
                 "group joins", s, count, size);
    }
    return Status::Ok();
}

}  // namespace

Status agree_join(NormDomain &domain, int slice, int group_rank, int group_size, const Status &local) {
    NormDomain::Words mine{};
    mine[0] = NormDomain::kJoin;
    mine[1] = local.ok() ? slice : 0;
    mine[2] = group_size;
    mine[3] = group_rank;
    mine[4] = local.ok() ? 0.0 : static_cast<double>(local.code());
    std::vector<double> all;
    SX_TRY(domain.exchange(mine, &all));
    SX_TRY(domain.same_call(all, NormDomain::kJoin, "sx_join_norm_domain"));
    if (!local.ok()) return local;
    const int refused = first_refusal(all);
    SX_CHECK(refused < 0, SX_ERR_MISMATCH,
             "norm domain: rank %d of the domain refused to join (see its error there); nothing was joined",
             refused);
    return check_slices(all);
}

// Every refusal is this rank's alone until the ranks have compared (agree_join): the
// ranks then all fail, and nothing is joined anywhere.
Status ShardGroup::join_norm_domain(std::shared_ptr<NormDomain> domain, int32_t slice) {
    Status local = check_usable();
    if (local.ok() && !between_steps())
        local = SX_ERROR(SX_ERR_INVALID_STATE, "the group is inside a step (a micro-batch accumulated, or gradients "
                                               "signalled ready): a group joins a norm domain between steps");
    if (local.ok() && stepper_.norm_domain())
        local = SX_ERROR(SX_ERR_INVALID_STATE, "the group (rank %d of %d) has joined a norm domain already",
                         rank(), world_size());
    if (local.ok() && domain->joined())
        local = SX_ERROR(SX_ERR_INVALID_STATE, "a group of domain rank %d has joined this norm domain already; one "
                                               "group per rank joins it", domain->rank());
    if (local.ok() && slice < 0)
        local = SX_ERROR(SX_ERR_INVALID_ARGUMENT, "slice is %d; it must be >= 0 (the group's model-parallel slice)",
                         slice);
    SX_TRY(agree_join(*domain, slice, rank(), world_size(), local));
    domain->set_joined();
    stepper_.join_norm_domain(std::move(domain), slice);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
