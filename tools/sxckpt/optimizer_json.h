// The optimizer JSON that `sxckpt export --optimizer PREFIX` writes as PREFIX.json and
// `sxckpt import --optimizer PREFIX` reads (docs/format.md, "The optimizer files"):
// the param groups in torch.optim's key names and value forms, each with the names of
// its params in registration order, and each param's step counts. The state tensors
// themselves are in PREFIX.safetensors. Both directions are here, so that the schema
// lives in one place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/manifest.h"
#include "interop/json.h"

namespace sx {
namespace tool {

// The schema's own version; a reader refuses a newer one. Version 2 adds the optional
// "loss_scaler" and "user_blob" (what `sxckpt join` carries from its first checkpoint);
// a writer says 2 only where it writes them, so that files without them stay readable
// by readers of version 1.
constexpr int64_t kOptimizerSchemaVersion = 2;

struct OptimizerParam {
    std::string name;
    int64_t step = 0;            // updates applied (torch's state[i]['step'] for Adam, AdamW)
    int64_t momentum_steps = 0;  // SGD: updates that used the momentum buffer
    float mu_product = 1.0f;     // NAdam's product of momentum coefficients
    int32_t unit = 0;            // sx's unit (0 unless given)
    bool trainable = true;
    int32_t group = 0;           // index into OptimizerDoc::groups
};

struct OptimizerGroup {
    ckpt::ParamGroupEntry hyper;     // the optimizer and its hyperparameters
    std::vector<std::string> params; // names, in registration order
};

struct OptimizerDoc {
    uint64_t step = 0;               // the checkpoint's global step
    std::string format_version;      // the checkpoint format it came from ("" if not given)
    std::vector<OptimizerGroup> groups;
    std::vector<OptimizerParam> params;  // every param of every group, in the order of "state"
    // Schema 2, optional: the checkpoint's loss scaler state and user blob.
    bool has_loss_scaler = false;
    ckpt::LossScalerEntry loss_scaler;
    std::string user_blob;
};

// A loss scaler's state as one JSON object, {"scale", "growth_tracker", "growth_interval",
// "growth_factor", "backoff_factor"}: PREFIX.json's "loss_scaler" and inspect --json's.
void write_loss_scaler(interop::JsonWriter &j, const ckpt::LossScalerEntry &ls);

// PREFIX.json for the checkpoint `m`: every param group, every param's step counts,
// unit and trainable flag, the step and the format version. One line, UTF-8. With
// `run_state`, also (schema 2) m's loss scaler and its user blob (in hexadecimal).
std::string optimizer_json(const ckpt::Manifest &m, bool run_state = false);

// Reads PREFIX.json's text, checking the schema: the schema version; every key known
// and every required one there; optimizers SGD, Adam, AdamW with exactly their
// hyperparameters, as sx_add_param_group accepts them, and optionally "state_dtype"
// ("fp32", "bf16", "8bit": how the imported group keeps its state) and
// "bf16_stochastic_round" (a bool: the group keeps its bf16 params without masters); each param in exactly one
// group and with exactly one "state" entry; 0 <= momentum_steps <= step, and
// momentum_steps only for SGD; "loss_scaler" with exactly its five keys and "user_blob"
// of hexadecimal digit pairs, where given. SX_ERR_INVALID_ARGUMENT naming the group, the param and
// the field; SX_ERR_VERSION for a newer schema. `what` names the file in messages.
Status parse_optimizer_json(const std::string &text, const std::string &what, OptimizerDoc *out);

}  // namespace tool
}  // namespace sx
