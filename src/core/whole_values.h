// Whole params' values between the ranks and one root, as the interop calls take them
// (sx_export_hf, sx_export_peft, sx_import_hf; docs/interop.md): the fp32 values a
// checkpoint stores (the fp32 master weights of 16-bit params, else the params
// themselves), param by param in index order, whole and unpadded, gathered onto the root
// or scattered from it. Which params travel is the root's to say (it reads the files or
// the caller's name map), so the root plans the call first and every rank learns the
// plan from it: the ranks need not have the files.
//
// A gather holds, on the root, one buffer for the largest selected param (and its host
// copy where the values live on a device); no other rank holds more than its shard. A
// scatter writes into copies of every rank's shard of the values of the units it
// touches, which replace them only when every rank has its pieces and the root's
// callbacks all succeeded: a failure anywhere changes nothing. The params then take
// their values from the new ones on every rank (16-bit params rounded to nearest even).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/shard_state.h"
#include "core/whole_state.h"

namespace sx {
namespace core {

// What the root decides before any value moves.
struct ValuesPlan {
    std::vector<uint8_t> selected;  // per param: 1 where it travels (size: the group's params)
    std::string note;               // bytes every rank receives (an import's report of keys)
};

// The root's side of a call; the other ranks' functions are never called. Each runs on
// the calling thread; the first failure ends the calls (the others are not made) and
// every rank returns it, with the root's words.
struct ValuesCall {
    // Which params travel, or why the call cannot go on (nothing moves then).
    std::function<Status(ValuesPlan *)> plan;
    // Gather: param p's whole values, n fp32 in host memory, valid for the call.
    std::function<Status(int32_t p, const float *values, uint64_t n)> take;
    // Scatter: fill param p's whole values, n fp32 in host memory (zero on entry).
    std::function<Status(int32_t p, float *values, uint64_t n)> fill;
    // After the last param, on the root, if everything before succeeded (a gather's
    // files committed; a scatter's last check before anything is placed).
    std::function<Status()> finish;
};

class WholeValues {
  public:
    WholeValues(ShardAccess &group, const WholeState::Mesh &mesh) : g_(group), mesh_(mesh) {}

    // Collective, once the ranks agreed on the call: plan, then root's take sees every
    // selected param's values, then root's finish. *note: the plan's note, on every rank.
    Status gather(int root, const ValuesCall &call, std::string *note);
    // Collective, likewise: plan, root's fill gives every selected param's values, root's
    // finish, then (all of it having succeeded) they replace the params' on every rank.
    Status scatter(int root, const ValuesCall &call, std::string *note);

  private:
    // The root's plan (or the root's failure to make one) and every rank's own verdict
    // `mine`, shared: the worst code wins everywhere, with the root's words. *note: the
    // plan's note on every rank, also where the plan failed.
    Status share_plan(int root, const Status &mine, const ValuesCall &call, ValuesPlan *plan, std::string *note);
    // Every rank's verdict shared, the root's words (any length) given to all.
    Status share_outcome(int root, const Status &mine, const char *what);
    // The root's buffers for one whole param (the largest selected one): in the values'
    // memory, and its host copy where that is a device.
    Status root_buffers(int root, const ValuesPlan &plan, Buffer *staging, std::vector<float> *host);
    bool in_root_group(int root) const { return g_.replica_rank() == root / g_.shard_size(); }

    ShardAccess &g_;
    WholeState::Mesh mesh_;
};

}  // namespace core
}  // namespace sx
