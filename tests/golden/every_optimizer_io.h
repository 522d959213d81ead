// Writing and checking the format-3.0 goldens of every_optimizer.h, through the public API.
#pragma once

#include <string>
#include <vector>

namespace sxgolden3 {

// Every tensor name param p keeps (torch's names), in no particular order.
std::vector<std::string> expected_tensors(int p);

// Saves the model into `out` (a checkpoint directory) from `world` ranks (threads) at
// `stage`, as shard groups of `shard` ranks (0: flat). Returns "" or what failed.
std::string write(const std::string &out, int world, int stage, int shard);

// Loads `dir` into `world` ranks at `stage` (shard groups of `shard`; split_units: one
// unit per param) and checks every value, state tensor, step count, hyperparameter and
// the user blob. Returns "" or the first difference.
std::string load_and_check(const std::string &dir, int world, int shard, int stage, bool split_units);

}  // namespace sxgolden3
