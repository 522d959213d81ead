// Rank-ordered sums (ordered_sum.h).
#include "comm/ordered_sum.h"

namespace sx {
namespace comm {

RankOrderedSum::RankOrderedSum(Communicator *c, size_t width)
    : c_(c), width_(width), exchanges_(c != nullptr && c->world_size() > 1 && width > 0),
      reduces_(exchanges_ && c->sums_in_rank_order()) {
    const size_t ranks = exchanges_ && !reduces_ ? static_cast<size_t>(c->world_size()) : 1;
    if (ranks > 1) at_ = static_cast<size_t>(c->rank()) * width;
    all_.assign(ranks * width, 0.0);
}

Status RankOrderedSum::sum(std::vector<double> *whole) {
    whole->assign(width_, 0.0);
    if (reduces_) {
        SX_TRY(c_->all_reduce_sum(all_.data(), width_));
        // The transport's d_0 + d_1 + ... differs from (0 + d_0) + d_1 + ... only where
        // every d is -0.0: the one gives -0.0, the other +0.0; adding 0.0 gives the latter.
        for (size_t j = 0; j < width_; ++j) (*whole)[j] = all_[j] + 0.0;
        return Status::Ok();
    }
    if (exchanges_) SX_TRY(c_->all_gather(all_.data(), width_ * sizeof(double)));
    const size_t ranks = all_.size() / (width_ ? width_ : 1);
    for (size_t r = 0; r < ranks; ++r)
        for (size_t j = 0; j < width_; ++j) (*whole)[j] += all_[r * width_ + j];
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
