// The optimizer JSON that `sxckpt export --optimizer PREFIX` writes as PREFIX.json
// (docs/format.md, "The optimizer files"): the param groups in torch.optim's key names
// and value forms, each with the names of its params in registration order, and each
// param's step counts. The state tensors themselves are in PREFIX.safetensors.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "ckpt/manifest.h"

namespace sx {
namespace tool {

// The schema's own version; a reader refuses a newer one.
constexpr int64_t kOptimizerSchemaVersion = 1;

// PREFIX.json for the checkpoint `m`: every param group, every param's step counts,
// unit and trainable flag, the step and the format version. One line, UTF-8.
std::string optimizer_json(const ckpt::Manifest &m);

}  // namespace tool
}  // namespace sx
