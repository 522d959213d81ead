// Sums of a few doubles per rank over a communicator, added in rank order on every rank:
// the per-param sums of the optimizers that look at whole params (LAMB's norms,
// Adafactor's row and column sums; core/param_reductions.cc). Every rank gets
// (((0 + d_0) + d_1) + ...) + d_{W-1} for each element, the same bits whatever the
// transport: through the transport's all-reduce where it adds in rank order
// (Communicator::sums_in_rank_order: each rank's call holds `width` doubles), else through
// an all-gather of every rank's block (world_size x width), added here.
#pragma once

#include <cstddef>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"

namespace sx {
namespace comm {

class RankOrderedSum {
  public:
    // `width` doubles per rank over c (null, or of one rank: nothing is exchanged).
    RankOrderedSum(Communicator *c, size_t width);

    // Where this rank writes its `width` doubles (zeroed), until sum().
    double *mine() { return all_.data() + at_; }
    // Whether sum() goes through the transport's all-reduce (else an all-gather).
    bool reduces() const { return reduces_; }
    // The bytes of the collective's buffer on each rank: width doubles for an all-reduce,
    // world_size x width for an all-gather, 0 where nothing is exchanged.
    size_t exchanged_bytes() const { return exchanges_ ? all_.size() * sizeof(double) : 0; }

    // Collective on c (where exchanged): *whole = the sums, `width` doubles. The
    // communicator's failure is returned as it is.
    Status sum(std::vector<double> *whole);

  private:
    Communicator *c_;
    size_t width_;
    bool exchanges_, reduces_;
    size_t at_ = 0;  // this rank's block in all_
    std::vector<double> all_;
};

}  // namespace comm
}  // namespace sx
