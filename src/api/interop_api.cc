// Entry points: Hugging Face checkpoints and PEFT adapters out of and into a group's
// params (sx_interop.h). The files are interop's (HfWriter, HfReader); the exchange of
// whole values between the ranks and the root is the group's (core/whole_values.h).
#include <cmath>
#include <cstring>

#include "api/guard.h"
#include "api/handles.h"
#include "interop/hf_files.h"
#include "interop/json.h"
#include "interop/json_value.h"
#include "io/file_ops.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;
namespace interop = sx::interop;

namespace {

bool is_utf8(const char *s) {
    const std::string t(s);
    for (size_t i = 0; i < t.size();) {
        const size_t n = interop::utf8_sequence(t, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

// A C string argument: not NULL, not empty, UTF-8 (JSON text must be).
Status text_arg(const char *s, const std::string &what) {
    SX_CHECK_ARG(s != nullptr, "%s is NULL", what.c_str());
    SX_CHECK_ARG(s[0] != '\0', "%s is empty", what.c_str());
    SX_CHECK_ARG(is_utf8(s), "%s is not valid UTF-8", what.c_str());
    return Status::Ok();
}

Status name_map(int32_t num, const char *const *sx_names, const char *const *file_names, int32_t only_named,
                interop::NameMap *out) {
    SX_CHECK_ARG(num >= 0, "options->num_names is %d", num);
    SX_CHECK_ARG(num == 0 || (sx_names != nullptr && file_names != nullptr),
                 "options->num_names is %d but options->%s is NULL", num, sx_names == nullptr ? "sx_names" : "file_names");
    SX_CHECK_ARG(only_named == 0 || only_named == 1, "options->only_named is %d; it is 0 or 1", only_named);
    out->only_named = only_named != 0;
    for (int32_t i = 0; i < num; ++i) {
        SX_TRY(text_arg(sx_names[i], sx::format("options->sx_names[%d]", i)));
        SX_TRY(text_arg(file_names[i], sx::format("options->file_names[%d]", i)));
        out->pairs.emplace_back(sx_names[i], file_names[i]);
    }
    return Status::Ok();
}

std::vector<interop::ParamEntry> param_entries(const sx::core::ShardGroup &g) {
    std::vector<interop::ParamEntry> out;
    for (const sx::core::ParamSpec &p : g.table().params()) out.push_back({p.name, p.shape});
    return out;
}

// adapter_config.json: the caller's fields, peft_type and inference_mode, then extra_json's members.
Status peft_config_json(const sx_peft_config_t &c, std::string *out) {
    if (c.base_model_name_or_path) SX_TRY(text_arg(c.base_model_name_or_path, "config->base_model_name_or_path"));
    if (c.task_type) SX_TRY(text_arg(c.task_type, "config->task_type"));
    const char *bias = c.bias ? c.bias : "none";
    SX_CHECK_ARG(!std::strcmp(bias, "none") || !std::strcmp(bias, "all") || !std::strcmp(bias, "lora_only"),
                 "config->bias is '%s'; peft takes \"none\", \"all\" or \"lora_only\"", interop::printable(bias).c_str());
    SX_CHECK_ARG(c.num_target_modules > 0 && c.target_modules != nullptr,
                 "config->target_modules is empty; name the modules the adapter's LoRA layers wrap");
    SX_CHECK_ARG(c.r >= 0, "config->r is %d", c.r);
    SX_CHECK_ARG(std::isfinite(c.lora_alpha) && c.lora_alpha >= 0, "config->lora_alpha is %g", c.lora_alpha);
    SX_CHECK_ARG(c.lora_dropout >= 0 && c.lora_dropout < 1, "config->lora_dropout is %g; it lies in [0, 1)",
                 c.lora_dropout);
    SX_CHECK_ARG((c.use_rslora == 0 || c.use_rslora == 1) && (c.fan_in_fan_out == 0 || c.fan_in_fan_out == 1),
                 "config->use_rslora and fan_in_fan_out are 0 or 1");
    interop::JsonWriter j;
    j.begin_object();
    j.key("peft_type"), j.string("LORA");
    j.key("base_model_name_or_path");
    c.base_model_name_or_path ? j.string(c.base_model_name_or_path) : j.null();
    j.key("task_type");
    c.task_type ? j.string(c.task_type) : j.null();
    j.key("r"), j.number(static_cast<int64_t>(c.r ? c.r : 8));
    j.key("lora_alpha");
    const double alpha = c.lora_alpha ? c.lora_alpha : 8.0;
    if (alpha == std::floor(alpha) && alpha < 1e15) j.number(static_cast<int64_t>(alpha));
    else j.number(alpha);
    j.key("lora_dropout"), j.number(c.lora_dropout);
    j.key("target_modules"), j.begin_array();
    for (int32_t i = 0; i < c.num_target_modules; ++i) {
        SX_TRY(text_arg(c.target_modules[i], sx::format("config->target_modules[%d]", i)));
        j.string(c.target_modules[i]);
    }
    j.end_array();
    j.key("bias"), j.string(bias);
    j.key("use_rslora"), j.boolean(c.use_rslora != 0);
    j.key("fan_in_fan_out"), j.boolean(c.fan_in_fan_out != 0);
    j.key("inference_mode"), j.boolean(true);
    if (c.extra_json) {
        interop::JsonValue extra;
        Status s = interop::parse_json(c.extra_json, &extra);
        SX_CHECK_ARG(s.ok(), "config->extra_json: %s", s.message().c_str());
        SX_CHECK_ARG(extra.is_object(), "config->extra_json is %s, not an object", interop::json_kind_name(extra.kind));
        static const char *const ours[] = {"peft_type", "base_model_name_or_path", "task_type", "r", "lora_alpha",
                                           "lora_dropout", "target_modules", "bias", "use_rslora",
                                           "fan_in_fan_out", "inference_mode"};
        for (const auto &m : extra.members) {
            for (const char *k : ours)
                SX_CHECK_ARG(m.first != k, "config->extra_json has %s, which sx writes from config's fields",
                             interop::json_quoted(m.first).c_str());
            j.key(m.first), j.value_of(m.second);
        }
    }
    j.end_object();
    *out = j.text() + "\n";
    return Status::Ok();
}

Status read_export_options(const sx_hf_export_options_t *options, sx_hf_export_options_t *o) {
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    if (options) SX_TRY(sx::api::read_input(options, "options", sizeof(size_t), o));
    return Status::Ok();
}

// sx_export_hf and sx_export_peft (peft: the root's config must be there).
Status export_call(const char *function, sx_shard_group_t *group, const char *dir,
                   const sx_hf_export_options_t *options, bool peft, const sx_peft_config_t *config) {
    sx::core::ShardGroup *g;
    SX_TRY(resolve(group, &g));
    SX_TRY(text_arg(dir, "dir"));
    sx_hf_export_options_t o;
    SX_TRY(read_export_options(options, &o));
    auto ops = sx::io::posix_file_ops();
    interop::HfWriter writer(*ops);
    const std::vector<interop::ParamEntry> params = param_entries(*g);
    sx::core::ValuesCall call;
    call.plan = [&](sx::core::ValuesPlan *plan) -> Status {
        const int32_t dtype = o.dtype ? o.dtype : SX_DTYPE_F32;
        SX_CHECK_ARG(dtype == SX_DTYPE_F32 || dtype == SX_DTYPE_BF16 || dtype == SX_DTYPE_F16,
                     "options->dtype is %d; the files take SX_DTYPE_F32, SX_DTYPE_BF16 or SX_DTYPE_F16", o.dtype);
        std::string peft_json;
        if (peft) {
            SX_CHECK_ARG(config != nullptr, "config is NULL on the root");
            sx_peft_config_t c;
            std::memset(&c, 0, sizeof c);
            SX_TRY(sx::api::read_input(config, "config", sizeof(size_t), &c));
            SX_TRY(peft_config_json(c, &peft_json));
            SX_CHECK_ARG(o.num_names > 0, "options name no param: a PEFT adapter holds the params its name map names");
        }
        interop::NameMap map;
        SX_TRY(name_map(o.num_names, o.sx_names, o.file_names, peft ? 1 : o.only_named, &map));
        std::vector<std::string> keys;
        SX_TRY(interop::resolve_keys(params, map, &keys));
        SX_TRY(writer.plan(dir, params, keys, dtype, o.max_shard_bytes, peft_json));
        for (const std::string &k : keys) plan->selected.push_back(!k.empty());
        return Status::Ok();
    };
    call.take = [&](int32_t p, const float *v, uint64_t n) { return writer.write(p, v, n); };
    call.finish = [&] { return writer.commit(); };
    std::string note;
    return g->values_call(function, dir, o.root, true, call, &note);
}

// The last import's report on this thread: the names sx_hf_import_report_t points into.
struct ReportNames {
    interop::KeyReport report;
    std::vector<const char *> missing, missing_keys, unexpected;
};
thread_local ReportNames last_report;

void fill_report(const std::string &note, sx_hf_import_report_t *out) {
    ReportNames &r = last_report;
    r.report = interop::decode_report(note);
    r.missing.clear(), r.missing_keys.clear(), r.unexpected.clear();
    for (const auto &m : r.report.missing) r.missing.push_back(m.first.c_str()), r.missing_keys.push_back(m.second.c_str());
    for (const std::string &u : r.report.unexpected) r.unexpected.push_back(u.c_str());
    if (!out) return;
    sx_hf_import_report_t rep;
    std::memset(&rep, 0, sizeof rep);
    rep.struct_size = sizeof rep;
    rep.num_loaded = r.report.loaded;
    rep.num_missing = static_cast<int32_t>(r.missing.size());
    rep.num_unexpected = static_cast<int32_t>(r.unexpected.size());
    rep.missing = r.missing.data();
    rep.missing_keys = r.missing_keys.data();
    rep.unexpected = r.unexpected.data();
    sx::api::write_output(out, rep);
}

Status import_call(sx_shard_group_t *group, const char *path, const sx_hf_import_options_t *options,
                   sx_hf_import_report_t *report) {
    sx::core::ShardGroup *g;
    SX_TRY(resolve(group, &g));
    SX_TRY(text_arg(path, "path"));
    if (report) SX_TRY(sx::api::check_output(report, "report"));
    sx_hf_import_options_t o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    if (options) SX_TRY(sx::api::read_input(options, "options", sizeof(size_t), &o));
    fill_report(std::string(), report);
    auto ops = sx::io::posix_file_ops();
    interop::HfReader reader(*ops);
    const std::vector<interop::ParamEntry> params = param_entries(*g);
    sx::core::ValuesCall call;
    call.plan = [&](sx::core::ValuesPlan *plan) -> Status {
        SX_CHECK_ARG(o.reserved0 == 0, "options->reserved0 is %d; it must be 0", o.reserved0);
        SX_CHECK_ARG((o.allow_missing == 0 || o.allow_missing == 1) && (o.allow_unexpected == 0 || o.allow_unexpected == 1),
                     "options->allow_missing and allow_unexpected are 0 or 1");
        interop::NameMap map;
        SX_TRY(name_map(o.num_names, o.sx_names, o.file_names, o.only_named, &map));
        std::vector<std::string> keys;
        SX_TRY(interop::resolve_keys(params, map, &keys));
        interop::KeyReport found;
        Status s = reader.plan(path, params, keys, o.allow_missing != 0, o.allow_unexpected != 0, &plan->selected,
                               &found);
        plan->note = interop::encode_report(found);  // the report, also of a refusal for its keys
        plan->selected.resize(params.size(), 0);
        return s;
    };
    call.fill = [&](int32_t p, float *v, uint64_t n) { return reader.read(p, v, n); };
    std::string note;
    Status s = g->values_call("sx_import_hf", path, o.root, false, call, &note);
    fill_report(note, report);
    return s;
}

}  // namespace

extern "C" {

SX_API sx_status_t sx_hf_export_options_init(sx_hf_export_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_hf_export_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_peft_config_init(sx_peft_config_t *config, size_t size) {
    return guard(__func__, [&] {
        sx_peft_config_t c;
        std::memset(&c, 0, sizeof c);
        return sx::api::init_struct(config, size, c, "config");
    });
}

SX_API sx_status_t sx_hf_import_options_init(sx_hf_import_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_hf_import_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_hf_import_report_init(sx_hf_import_report_t *report, size_t size) {
    return guard(__func__, [&] {
        sx_hf_import_report_t r;
        std::memset(&r, 0, sizeof r);
        return sx::api::init_struct(report, size, r, "report");
    });
}

SX_API sx_status_t sx_export_hf(sx_shard_group_t *group, const char *dir, const sx_hf_export_options_t *options) {
    return guard(__func__, [&] { return export_call("sx_export_hf", group, dir, options, false, nullptr); });
}

SX_API sx_status_t sx_export_peft(sx_shard_group_t *group, const char *dir, const sx_hf_export_options_t *options,
                                  const sx_peft_config_t *config) {
    return guard(__func__, [&] { return export_call("sx_export_peft", group, dir, options, true, config); });
}

SX_API sx_status_t sx_import_hf(sx_shard_group_t *group, const char *path, const sx_hf_import_options_t *options,
                                sx_hf_import_report_t *report) {
    return guard(__func__, [&] { return import_call(group, path, options, report); });
}

}  // extern "C"
