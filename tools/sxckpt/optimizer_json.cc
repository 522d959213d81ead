#include "optimizer_json.h"

#include <algorithm>
#include <cinttypes>
#include <iterator>
#include <cstring>
#include <unordered_map>

#include "checkpoint_dir.h"
#include "core/params.h"
#include "optim/custom.h"

namespace sx {
namespace tool {

namespace {

// Whether hyperparameter hp_key is a key of a torch param group of `kind`: one that applies
// to it, but for how sx stores the state (state_dtype), which is no torch hyperparameter:
// it is written apart ("state_dtype", by name), and only where it is not fp32; and
// bf16_stochastic_round (torchao's AdamW option, no key of torch.optim's), written apart
// only where set.
bool torch_key(int32_t hp_key, optim::Kind kind) {
    return optim::applies_to(hp_key, kind) && hp_key != SX_HP_STATE_DTYPE && hp_key != SX_HP_BF16_STOCHASTIC_ROUND;
}

// Every key of a param group of `kind`, as torch names them: the hyperparameters of
// optim/optimizer.h's table that apply to it, with beta1 and beta2 as one "betas".
std::vector<std::string> hyper_keys(optim::Kind kind) {
    std::vector<std::string> keys;
#define SX_KEY(name, type, dflt, hp_key, rule)                                  \
    if (torch_key(hp_key, kind) && std::strcmp(#name, "beta2") != 0)          \
        keys.push_back(std::strcmp(#name, "beta1") == 0 ? "betas" : #name);
    SX_HYPERPARAMETERS(SX_KEY)
#undef SX_KEY
    return keys;
}

// The names of the state dtypes in the JSON, by SX_STATE_* value (the Python binding's
// and train_charlm's).
const char *const kStateDtypeNames[] = {"fp32", "bf16", "8bit"};

Status read_state_dtype(const JsonValue &v, const std::string &what, double *out) {
    std::string name;
    SX_TRY(json_string(v, what + ": \"state_dtype\"", &name));
    for (int i = 0; i < 3; ++i)
        if (name == kStateDtypeNames[i]) {
            *out = i;
            return Status::Ok();
        }
    return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "%s: \"state_dtype\" is %s; it is \"fp32\", \"bf16\" or \"8bit\"",
                    what.c_str(), json_quoted(name).c_str());
}

// Whether kind counts its steps per param group rather than per param.
bool counts_group_steps(optim::Kind kind) {
    return !optim::is_custom(kind) && optim::spec_of(kind).step_count == optim::StepCount::kGroup;
}

void write_group(JsonWriter &j, const ckpt::ParamGroupEntry &g, const ckpt::Manifest &m, int32_t index,
                 bool run_state) {
    const optim::Kind kind = static_cast<optim::Kind>(g.optimizer);
    j.begin_object();
    if (g.optimizer == ckpt::kCustomOptimizer) {
        // A registered optimizer: its name, its lr (which every optimizer has) and its own
        // hyperparameters; no torch class loads it.
        j.key("optimizer"), j.string(g.optimizer_name);
        j.key("custom"), j.value(true);
        j.key("lr"), j.value(g.lr);
        for (size_t i = 0; i < g.custom_names.size(); ++i) j.key(g.custom_names[i]), j.value(g.custom_values[i]);
    } else {
        j.key("optimizer"), j.string(optimizer_name(g.optimizer));
    }
#define SX_WRITE(name, type, dflt, hp_key, rule)                                      \
    if (torch_key(hp_key, kind)) {                                                    \
        if (std::strcmp(#name, "beta1") == 0) {                                       \
            j.key("betas"), j.begin_array(), j.number(g.beta1), j.number(g.beta2);     \
            j.end_array();                                                            \
        } else if (std::strcmp(#name, "beta2") != 0) {                                \
            j.key(#name), j.value(g.name);                                            \
        }                                                                             \
    }
    if (g.optimizer != ckpt::kCustomOptimizer) SX_HYPERPARAMETERS(SX_WRITE)
#undef SX_WRITE
    // An optimizer that counts its steps per group (pytorch-optimizer's Lamb and AdEMAMix:
    // their bias corrections' t) keeps the count as the group's "step".
    if (counts_group_steps(kind)) j.key("step"), j.number(static_cast<uint64_t>(g.steps));
    // Schema 2 (a join, which must resume exactly): the steps the group took
    // (sx_get_param_group_steps), which torch's other classes do not keep.
    else if (run_state) j.key("group_steps"), j.number(static_cast<uint64_t>(g.steps));
    // How sx kept the state the exported tensors came from (fp32 is torch's, and unsaid).
    const int state_dtype = static_cast<int>(g.state_dtype);
    if (state_dtype > 0 && state_dtype < 3) j.key("state_dtype"), j.string(kStateDtypeNames[state_dtype]);
    if (g.bf16_stochastic_round) j.key("bf16_stochastic_round"), j.value(true);
    j.key("params");
    j.begin_array();
    for (const ckpt::ParamEntry &p : m.params)
        if (p.param_group == index) j.string(p.name);
    j.end_array();
    j.end_object();
}

Status read_value(const JsonValue &v, const std::string &what, double *out) { return json_double(v, what, out); }
Status read_value(const JsonValue &v, const std::string &what, bool *out) { return json_bool(v, what, out); }

// The optimizer named by torch's class name.
Status optimizer_of(const JsonValue *v, const std::string &what, int32_t *out) {
    SX_CHECK(v != nullptr, SX_ERR_INVALID_ARGUMENT, "%s has no \"optimizer\"", what.c_str());
    std::string name;
    SX_TRY(json_string(*v, what + ": \"optimizer\"", &name));
    size_t count = 0;
    const optim::OptimizerSpec *rows = optim::all_optimizers(&count);
    for (size_t k = 0; k < count; ++k)
        if (name == rows[k].name) {
            SX_TRY(ckpt::check_storable(optim::default_hyper(rows[k].kind)));  // a checkpoint must hold it
            *out = static_cast<int32_t>(rows[k].kind);
            return Status::Ok();
        }
    return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "%s: optimizer %s is not one sx has (%s)", what.c_str(),
                    json_quoted(name).c_str(), optim::optimizer_list().c_str());
}

Status read_group(const JsonValue &v, size_t index, OptimizerGroup *g) {
    std::string what = format("param group %zu", index);
    SX_TRY(json_expect(v, JsonValue::Kind::kObject, what));
    int32_t optimizer = 0;
    SX_TRY(optimizer_of(v.find("optimizer"), what, &optimizer));
    // The hyperparameters that do not apply to the optimizer keep sx's defaults, as in a
    // group sx_param_group_desc_init made.
    g->hyper = ckpt::param_group_entry(core::default_hyper(optimizer));
    const optim::Kind kind = static_cast<optim::Kind>(g->hyper.optimizer);
    what += " (" + optimizer_name(g->hyper.optimizer) + ")";
    const std::vector<std::string> keys = hyper_keys(kind);
    const bool group_step = counts_group_steps(kind);
    for (const auto &m : v.members) {
        bool known = m.first == "optimizer" || m.first == "params" || m.first == "state_dtype" ||
                     m.first == "bf16_stochastic_round" ||
                     (group_step && m.first == "step") || (!group_step && m.first == "group_steps");
        for (const std::string &k : keys) known |= m.first == k;
        if (known) continue;
        std::string expected;
        for (const std::string &k : keys) expected += k + ", ";
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "%s: unknown key %s; its keys are optimizer, %s%sstate_dtype, params",
                        what.c_str(), json_quoted(m.first).c_str(), expected.c_str(), group_step ? "step, " : "group_steps, ");
    }
    // The group's step count (0 where absent): torch's "step" where the class keeps one,
    // else schema 2's "group_steps".
    for (const char *key : {"step", "group_steps"}) {
        const JsonValue *step = v.find(key);
        if (step == nullptr) continue;
        SX_TRY(json_int64(*step, what + ": \"" + key + "\"", &g->hyper.steps));
        SX_CHECK(g->hyper.steps >= 0, SX_ERR_INVALID_ARGUMENT, "%s: \"%s\" is %" PRId64 "; it must be >= 0",
                 what.c_str(), key, g->hyper.steps);
    }
    for (const std::string &k : keys)
        SX_CHECK(v.find(k) != nullptr, SX_ERR_INVALID_ARGUMENT, "%s has no %s", what.c_str(), json_quoted(k).c_str());
    if (const JsonValue *betas = v.find("betas")) {
        SX_CHECK(betas->is_array() && betas->items.size() == 2, SX_ERR_INVALID_ARGUMENT,
                 "%s: \"betas\" is not [beta1, beta2]", what.c_str());
        SX_TRY(json_double(betas->items[0], what + ": betas[0]", &g->hyper.beta1));
        SX_TRY(json_double(betas->items[1], what + ": betas[1]", &g->hyper.beta2));
    }
#define SX_READ(name, type, dflt, hp_key, rule)                                                           \
    if (torch_key(hp_key, kind) && std::strcmp(#name, "beta1") != 0 &&                                    \
        std::strcmp(#name, "beta2") != 0)                                                                 \
        SX_TRY(read_value(*v.find(#name), what + ": \"" #name "\"", &g->hyper.name));
    SX_HYPERPARAMETERS(SX_READ)
#undef SX_READ
    if (const JsonValue *dtype = v.find("state_dtype")) SX_TRY(read_state_dtype(*dtype, what, &g->hyper.state_dtype));
    if (const JsonValue *sr = v.find("bf16_stochastic_round"))
        SX_TRY(read_value(*sr, what + ": \"bf16_stochastic_round\"", &g->hyper.bf16_stochastic_round));
    Status valid = optim::validate(ckpt::hyper_of(g->hyper));
    if (!valid.ok()) return valid.prefix(what + ": ");
    const JsonValue *params = v.find("params");
    SX_CHECK(params != nullptr, SX_ERR_INVALID_ARGUMENT, "%s has no \"params\"", what.c_str());
    SX_TRY(json_expect(*params, JsonValue::Kind::kArray, what + ": \"params\""));
    for (size_t i = 0; i < params->items.size(); ++i) {
        std::string name;
        SX_TRY(json_string(params->items[i], what + format(": params[%zu]", i), &name));
        g->params.push_back(std::move(name));
    }
    return Status::Ok();
}

Status read_state(const std::string &name, const JsonValue &v, const OptimizerGroup &g, OptimizerParam *p) {
    const std::string what = "state of param " + json_quoted(name);
    SX_TRY(json_expect(v, JsonValue::Kind::kObject, what));
    const bool sgd = g.hyper.optimizer == SX_OPTIM_SGD;
    const char *scalar = optim::spec_of(static_cast<optim::Kind>(g.hyper.optimizer)).param_scalar;
    for (const auto &m : v.members) {
        const bool known = m.first == "step" || m.first == "unit" || m.first == "trainable" ||
                           (sgd && m.first == "momentum_steps") || (scalar && m.first == scalar);
        SX_CHECK(known, SX_ERR_INVALID_ARGUMENT, "%s: unknown key %s; its keys are step, %s%sunit, trainable",
                 what.c_str(), json_quoted(m.first).c_str(), sgd ? "momentum_steps, " : "",
                 scalar ? (std::string(scalar) + ", ").c_str() : "");
    }
    if (scalar) {  // NAdam's mu_product
        const JsonValue *mu = v.find(scalar);
        SX_CHECK(mu != nullptr, SX_ERR_INVALID_ARGUMENT, "%s has no \"%s\"", what.c_str(), scalar);
        double value = 1.0;
        SX_TRY(json_double(*mu, what + ": \"" + scalar + "\"", &value));
        SX_CHECK(value >= 0.0 && value <= 1.0, SX_ERR_INVALID_ARGUMENT, "%s: %s is %g; it must be in [0, 1]",
                 what.c_str(), scalar, value);
        p->mu_product = static_cast<float>(value);
    }
    const JsonValue *step = v.find("step");
    SX_CHECK(step != nullptr, SX_ERR_INVALID_ARGUMENT, "%s has no \"step\"", what.c_str());
    SX_TRY(json_int64(*step, what + ": \"step\"", &p->step));
    if (const JsonValue *ms = v.find("momentum_steps"))
        SX_TRY(json_int64(*ms, what + ": \"momentum_steps\"", &p->momentum_steps));
    SX_CHECK(p->step >= 0 && p->momentum_steps >= 0 && p->momentum_steps <= p->step, SX_ERR_INVALID_ARGUMENT,
             "%s: step %" PRId64 " and momentum_steps %" PRId64 "; they must satisfy 0 <= momentum_steps <= step",
             what.c_str(), p->step, p->momentum_steps);
    if (const JsonValue *unit = v.find("unit")) {
        int64_t u = 0;
        SX_TRY(json_int64(*unit, what + ": \"unit\"", &u));
        SX_CHECK(u >= 0 && u <= INT32_MAX, SX_ERR_INVALID_ARGUMENT, "%s: unit is %" PRId64 "; it must be in [0, 2^31)",
                 what.c_str(), u);
        p->unit = static_cast<int32_t>(u);
    }
    if (const JsonValue *trainable = v.find("trainable"))
        SX_TRY(json_bool(*trainable, what + ": \"trainable\"", &p->trainable));
    p->name = name;
    return Status::Ok();
}

// Schema 2's "loss_scaler": {"scale", "growth_tracker", "growth_interval",
// "growth_factor", "backoff_factor"}, as the MANIFEST holds it.
Status read_loss_scaler(const JsonValue &v, ckpt::LossScalerEntry *out) {
    SX_TRY(json_expect(v, JsonValue::Kind::kObject, "\"loss_scaler\""));
    const char *const keys[] = {"scale", "growth_tracker", "growth_interval", "growth_factor", "backoff_factor"};
    for (const auto &m : v.members)
        SX_CHECK(std::find_if(std::begin(keys), std::end(keys), [&](const char *k) { return m.first == k; }) !=
                     std::end(keys),
                 SX_ERR_INVALID_ARGUMENT,
                 "\"loss_scaler\": unknown key %s; its keys are scale, growth_tracker, growth_interval, "
                 "growth_factor, backoff_factor",
                 json_quoted(m.first).c_str());
    for (const char *k : keys)
        SX_CHECK(v.find(k) != nullptr, SX_ERR_INVALID_ARGUMENT, "\"loss_scaler\" has no \"%s\"", k);
    SX_TRY(json_double(*v.find("scale"), "\"loss_scaler\": \"scale\"", &out->scale));
    SX_TRY(json_int64(*v.find("growth_tracker"), "\"loss_scaler\": \"growth_tracker\"", &out->growth_tracker));
    SX_TRY(json_int64(*v.find("growth_interval"), "\"loss_scaler\": \"growth_interval\"", &out->growth_interval));
    SX_TRY(json_double(*v.find("growth_factor"), "\"loss_scaler\": \"growth_factor\"", &out->growth_factor));
    return json_double(*v.find("backoff_factor"), "\"loss_scaler\": \"backoff_factor\"", &out->backoff_factor);
}

// Schema 2's "user_blob": the bytes as pairs of hexadecimal digits.
Status read_user_blob(const JsonValue &v, std::string *out) {
    std::string hex;
    SX_TRY(json_string(v, "\"user_blob\"", &hex));
    SX_CHECK(hex.size() % 2 == 0 && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
             SX_ERR_INVALID_ARGUMENT, "\"user_blob\" is not pairs of hexadecimal digits");
    out->clear();
    for (size_t i = 0; i < hex.size(); i += 2)
        out->push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return Status::Ok();
}

Status read_doc(const JsonValue &root, OptimizerDoc *doc) {
    SX_TRY(json_expect(root, JsonValue::Kind::kObject, "the document"));
    for (const auto &m : root.members)
        SX_CHECK(m.first == "schema_version" || m.first == "format_version" || m.first == "step" ||
                     m.first == "param_groups" || m.first == "state" || m.first == "loss_scaler" ||
                     m.first == "user_blob",
                 SX_ERR_INVALID_ARGUMENT,
                 "unknown key %s; the keys are schema_version, format_version, step, param_groups, state, "
                 "loss_scaler, user_blob",
                 json_quoted(m.first).c_str());
    if (const JsonValue *ls = root.find("loss_scaler")) {
        SX_TRY(read_loss_scaler(*ls, &doc->loss_scaler));
        doc->has_loss_scaler = true;
    }
    if (const JsonValue *blob = root.find("user_blob")) SX_TRY(read_user_blob(*blob, &doc->user_blob));
    const JsonValue *version = root.find("schema_version");
    SX_CHECK(version != nullptr, SX_ERR_INVALID_ARGUMENT, "there is no \"schema_version\"");
    int64_t v = 0;
    SX_TRY(json_int64(*version, "\"schema_version\"", &v));
    SX_CHECK(v <= kOptimizerSchemaVersion, SX_ERR_VERSION,
             "schema_version is %" PRId64 ", newer than this sxckpt's %" PRId64 "; import it with a newer sxckpt", v,
             kOptimizerSchemaVersion);
    SX_CHECK(v >= 1, SX_ERR_INVALID_ARGUMENT, "schema_version is %" PRId64 "; it must be >= 1", v);
    if (const JsonValue *fv = root.find("format_version"))
        SX_TRY(json_string(*fv, "\"format_version\"", &doc->format_version));
    const JsonValue *step = root.find("step");
    SX_CHECK(step != nullptr, SX_ERR_INVALID_ARGUMENT, "there is no \"step\"");
    int64_t s = 0;
    SX_TRY(json_int64(*step, "\"step\"", &s));
    SX_CHECK(s >= 0, SX_ERR_INVALID_ARGUMENT, "\"step\" is %" PRId64 "; it must be >= 0", s);
    doc->step = static_cast<uint64_t>(s);

    const JsonValue *groups = root.find("param_groups");
    SX_CHECK(groups != nullptr, SX_ERR_INVALID_ARGUMENT, "there is no \"param_groups\"");
    SX_TRY(json_expect(*groups, JsonValue::Kind::kArray, "\"param_groups\""));
    std::unordered_map<std::string, int32_t> group_of;
    for (size_t g = 0; g < groups->items.size(); ++g) {
        OptimizerGroup group;
        SX_TRY(read_group(groups->items[g], g, &group));
        for (const std::string &name : group.params) {
            const auto placed = group_of.emplace(name, static_cast<int32_t>(g));
            SX_CHECK(placed.second, SX_ERR_INVALID_ARGUMENT,
                     "param %s is in param group %d and again in param group %zu; a param is in one group",
                     json_quoted(name).c_str(), placed.first->second, g);
        }
        doc->groups.push_back(std::move(group));
    }

    const JsonValue *state = root.find("state");
    SX_CHECK(state != nullptr, SX_ERR_INVALID_ARGUMENT, "there is no \"state\"");
    SX_TRY(json_expect(*state, JsonValue::Kind::kObject, "\"state\""));
    for (const auto &m : state->members) {
        const auto it = group_of.find(m.first);
        SX_CHECK(it != group_of.end(), SX_ERR_INVALID_ARGUMENT,
                 "\"state\" has an entry for param %s, which no param group lists", json_quoted(m.first).c_str());
        OptimizerParam p;
        p.group = it->second;
        SX_TRY(read_state(m.first, m.second, doc->groups[it->second], &p));
        doc->params.push_back(std::move(p));
    }
    SX_CHECK(doc->params.size() == group_of.size(), SX_ERR_INVALID_ARGUMENT,
             "\"state\" has %zu entries, but the param groups list %zu params: every param needs one",
             doc->params.size(), group_of.size());
    return Status::Ok();
}

}  // namespace

void write_loss_scaler(JsonWriter &j, const ckpt::LossScalerEntry &ls) {
    j.begin_object();
    j.key("scale"), j.number(ls.scale);
    j.key("growth_tracker"), j.number(ls.growth_tracker);
    j.key("growth_interval"), j.number(ls.growth_interval);
    j.key("growth_factor"), j.number(ls.growth_factor);
    j.key("backoff_factor"), j.number(ls.backoff_factor);
    j.end_object();
}

std::string optimizer_json(const ckpt::Manifest &m, bool run_state) {
    JsonWriter j;
    j.begin_object();
    j.key("schema_version"), j.number(static_cast<int64_t>(run_state ? 2 : 1));
    j.key("format_version"), j.string(format("%u.%u", m.format_major, m.format_minor));
    j.key("step"), j.number(m.step);
    if (run_state) {
        j.key("loss_scaler"), write_loss_scaler(j, m.loss_scaler);
        std::string hex;
        for (unsigned char c : m.user_blob) hex += format("%02x", c);
        j.key("user_blob"), j.string(hex);
    }
    j.key("param_groups");
    j.begin_array();
    for (size_t g = 0; g < m.param_groups.size(); ++g)
        write_group(j, m.param_groups[g], m, static_cast<int32_t>(g), run_state);
    j.end_array();
    j.key("state");
    j.begin_object();
    for (const ckpt::ParamEntry &p : m.params) {
        j.key(p.name);
        j.begin_object();
        j.key("step"), j.number(p.step);
        const int32_t optimizer = m.param_groups[p.param_group].optimizer;
        if (optimizer == SX_OPTIM_SGD) j.key("momentum_steps"), j.number(p.momentum_steps);
        if (const char *scalar = optim::spec_of(static_cast<optim::Kind>(optimizer)).param_scalar)
            j.key(scalar), j.number(static_cast<double>(p.mu_product));
        j.key("unit"), j.number(p.unit);
        j.key("trainable"), j.boolean(p.trainable);
        j.end_object();
    }
    j.end_object();
    j.end_object();
    return j.text() + "\n";
}

Status parse_optimizer_json(const std::string &text, const std::string &what, OptimizerDoc *out) {
    JsonValue root;
    Status s = parse_json(text, &root);
    OptimizerDoc doc;
    if (s.ok()) s = read_doc(root, &doc);
    if (!s.ok()) return s.prefix(what + ": ");
    *out = std::move(doc);
    return Status::Ok();
}

}  // namespace tool
}  // namespace sx
