#include "optimizer_json.h"

#include <cstring>

#include "checkpoint_dir.h"
#include "json.h"

namespace sx {
namespace tool {

namespace {

void write_group(JsonWriter &j, const ckpt::ParamGroupEntry &g, const ckpt::Manifest &m, int32_t index) {
    const optim::Kind kind = static_cast<optim::Kind>(g.optimizer);
    j.begin_object();
    j.key("optimizer"), j.string(optimizer_name(g.optimizer));
#define SX_WRITE(name, type, dflt, hp_key, applies)                                   \
    if (optim::applies_to(optim::Applies::applies, kind)) {                           \
        if (std::strcmp(#name, "beta1") == 0) {                                       \
            j.key("betas"), j.begin_array(), j.number(g.beta1), j.number(g.beta2);     \
            j.end_array();                                                            \
        } else if (std::strcmp(#name, "beta2") != 0) {                                \
            j.key(#name), j.value(g.name);                                            \
        }                                                                             \
    }
    SX_HYPERPARAMETERS(SX_WRITE)
#undef SX_WRITE
    j.key("params");
    j.begin_array();
    for (const ckpt::ParamEntry &p : m.params)
        if (p.param_group == index) j.string(p.name);
    j.end_array();
    j.end_object();
}

}  // namespace

std::string optimizer_json(const ckpt::Manifest &m) {
    JsonWriter j;
    j.begin_object();
    j.key("schema_version"), j.number(kOptimizerSchemaVersion);
    j.key("format_version"), j.string(format("%u.%u", m.format_major, m.format_minor));
    j.key("step"), j.number(m.step);
    j.key("param_groups");
    j.begin_array();
    for (size_t g = 0; g < m.param_groups.size(); ++g) write_group(j, m.param_groups[g], m, static_cast<int32_t>(g));
    j.end_array();
    j.key("state");
    j.begin_object();
    for (const ckpt::ParamEntry &p : m.params) {
        j.key(p.name);
        j.begin_object();
        j.key("step"), j.number(p.step);
        if (m.param_groups[p.param_group].optimizer == SX_OPTIM_SGD)
            j.key("momentum_steps"), j.number(p.momentum_steps);
        j.key("unit"), j.number(p.unit);
        j.key("trainable"), j.boolean(p.trainable);
        j.end_object();
    }
    j.end_object();
    j.end_object();
    return j.text() + "\n";
}

}  // namespace tool
}  // namespace sx
