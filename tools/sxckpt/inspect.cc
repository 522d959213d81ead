// sxckpt inspect [--json] DIR: what a checkpoint holds, from its MANIFEST, and the
// sizes of its files. Reads no tensor data.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "checkpoint_dir.h"
#include "commands.h"
#include "optimizer_json.h"

namespace sx {
namespace tool {

namespace {

struct FileInfo {
    std::string name;
    bool present = false;
    std::string error;     // why its size is unknown (missing, unreadable)
    uint64_t bytes = 0;    // actual size, when present
    uint64_t needed = 0;   // what its chunks need
    size_t chunks = 0;
    std::string index_error;  // 2.0: why its index could not be read
};

std::vector<FileInfo> file_infos(io::FileOps &ops, const CheckpointDir &c) {
    const auto by_file = chunks_by_file(c.manifest);
    std::vector<FileInfo> out;
    for (size_t f = 0; f < c.manifest.files.size(); ++f) {
        FileInfo info;
        info.name = c.manifest.files[f];
        info.needed = c.bytes_needed(static_cast<uint32_t>(f), bytes_needed(by_file[f]));
        // From format 2.0 the MANIFEST knows each file's chunk count, read or not.
        info.chunks = c.manifest.chunks_in_files() ? c.manifest.file_indexes[f].chunks : by_file[f].size();
        if (!c.indexes[f].ok()) info.index_error = c.indexes[f].message();
        const std::string path = c.file_path(static_cast<uint32_t>(f));
        int fd = -1;
        Status s = ops.open_read(path, &fd);
        if (s.ok()) {
            s = ops.file_size(fd, &info.bytes, path);
            ops.close(fd, path);
        }
        info.present = s.ok();
        if (!s.ok()) info.error = s.code() == SX_ERR_NOT_FOUND ? "missing" : s.message();
        out.push_back(info);
    }
    return out;
}

std::string tensors_text(const ckpt::Manifest &m, const ckpt::ParamEntry &p) {
    std::string s;
    for (const ckpt::Tensor &t : p.tensors)
        s += (s.empty() ? "" : " ") + ckpt::tensor_name(m.param_groups[static_cast<size_t>(p.param_group)], t.kind) +
             (t.dtype == SX_DTYPE_F32 ? "" : ":" + dtype_name(t.dtype));  // 4.0: packed state
    return s;
}

// Display width of UTF-8 text: code points (continuation bytes do not count).
size_t width(const std::string &s) {
    size_t n = 0;
    for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    return n;
}

std::string pad(const std::string &s, size_t w, bool right = false) {
    const size_t have = width(s);
    const std::string fill(have < w ? w - have : 0, ' ');
    return right ? fill + s : s + fill;
}

std::string text(double v) { return shortest_double(v); }
std::string text(bool v) { return v ? "true" : "false"; }

std::string hyper_text(const ckpt::ParamGroupEntry &g) {
    const auto d = [](double v) { return shortest_double(v); };
    if (g.optimizer == ckpt::kCustomOptimizer) {
        std::string out = "(custom) lr=" + d(g.lr);
        for (size_t i = 0; i < g.custom_names.size(); ++i) out += " " + g.custom_names[i] + "=" + d(g.custom_values[i]);
        return out;
    }
    // The hyperparameters of the group's optimizer (the table's, in its order; beta1 and
    // beta2 as torch's betas pair).
    const optim::Kind kind = static_cast<optim::Kind>(g.optimizer);
    std::string out;
    const auto item = [&](const char *name, auto v) {
        if (std::strcmp(name, "beta2") == 0) return;
        if (!out.empty()) out += " ";
        out += std::strcmp(name, "beta1") == 0 ? "betas=(" + d(v) + ", " + d(g.beta2) + ")"
                                               : std::string(name) + "=" + text(v);
    };
#define SX_TEXT(name, type, dflt, key, rule) \
    if (optim::applies_to(key, kind)) item(#name, g.name);
    SX_HYPERPARAMETERS(SX_TEXT)
#undef SX_TEXT
    return out;
}

void print_text(const CheckpointDir &c, const std::vector<FileInfo> &files) {
    const ckpt::Manifest &m = c.manifest;
    uint64_t elements = 0;
    for (const ckpt::ParamEntry &p : m.params) elements += p.numel();
    std::printf("checkpoint  %s\n", printable(c.path).c_str());
    std::printf("format      %u.%u (written by sx %s)\n", m.format_major, m.format_minor,
                library_version_text(m.library_version).c_str());
    std::printf("step        %" PRIu64 "\n", m.step);
    std::printf("world size  %d (ZeRO stage %d, alignment %d bytes)\n", m.world_size, m.stage, m.alignment);
    const int32_t shard_size = m.shard_size ? m.shard_size : m.world_size;
    if (shard_size != m.world_size)
        std::printf("mesh        %d shards x %d replicas (HSDP; the first replica group wrote the files)\n", shard_size,
                    m.world_size / shard_size);
    std::printf("created     %s\n", utc_time_text(m.created_unix_ms).c_str());
    std::printf("user blob   %s\n", bytes_text(m.user_blob.size()).c_str());
    std::printf("loss scale  %s (growth_tracker=%" PRId64 " growth_interval=%" PRId64 " growth_factor=%s "
                "backoff_factor=%s)\n",
                shortest_double(m.loss_scaler.scale).c_str(), m.loss_scaler.growth_tracker,
                m.loss_scaler.growth_interval, shortest_double(m.loss_scaler.growth_factor).c_str(),
                shortest_double(m.loss_scaler.backoff_factor).c_str());

    std::printf("\nparams (%zu, %" PRIu64 " elements)\n", m.params.size(), elements);
    const std::vector<std::string> head = {"name", "shape", "dtype", "unit", "group", "trainable", "step", "stored"};
    std::vector<std::vector<std::string>> rows;
    for (const ckpt::ParamEntry &p : m.params)
        rows.push_back({printable(p.name), shape_text(p.shape), dtype_name(p.dtype), format("%d", p.unit),
                        format("%d", p.param_group), p.trainable ? "yes" : "no", format("%" PRId64, p.step),
                        tensors_text(m, p)});
    std::vector<size_t> w(head.size());
    for (size_t i = 0; i < head.size(); ++i) {
        w[i] = width(head[i]);
        for (const auto &r : rows) w[i] = std::max(w[i], width(r[i]));
    }
    // Numbers right-aligned; the last column is not padded.
    const std::vector<bool> right = {false, false, false, true, true, false, true, false};
    const auto print_row = [&](const std::vector<std::string> &r) {
        std::string line = " ";
        for (size_t i = 0; i < r.size(); ++i)
            line += " " + (i + 1 == r.size() ? r[i] : pad(r[i], w[i], right[i]));
        std::printf("%s\n", line.c_str());
    };
    print_row(head);
    for (const auto &r : rows) print_row(r);

    std::printf("\nparam groups (%zu)\n", m.param_groups.size());
    for (size_t g = 0; g < m.param_groups.size(); ++g) {
        size_t n = 0;
        for (const ckpt::ParamEntry &p : m.params) n += p.param_group == static_cast<int32_t>(g);
        const ckpt::ParamGroupEntry &e = m.param_groups[g];
        std::printf("  %zu  %-5s  %s  (%zu params)\n", g,
                    (e.optimizer == ckpt::kCustomOptimizer ? e.optimizer_name : optimizer_name(e.optimizer)).c_str(),
                    hyper_text(m.param_groups[g]).c_str(), n);
    }

    std::printf("\nfiles\n");
    size_t name_w = std::string("MANIFEST").size();
    for (const FileInfo &f : files) name_w = std::max(name_w, width(f.name));
    uint64_t total = c.manifest_bytes;
    std::printf("  %s  %s\n", pad("MANIFEST", name_w).c_str(), bytes_text(c.manifest_bytes).c_str());
    for (const FileInfo &f : files) {
        std::string what;
        if (!f.present) {
            what = f.error + format(" (its %zu chunks need %" PRIu64 " bytes)", f.chunks, f.needed);
        } else {
            total += f.bytes;
            what = bytes_text(f.bytes) + format(", %zu chunks", f.chunks);
            if (f.bytes != f.needed) what += format("; its chunks need %" PRIu64 " bytes", f.needed);
            if (!f.index_error.empty()) what += "; " + f.index_error;
        }
        std::printf("  %s  %s\n", pad(printable(f.name), name_w).c_str(), what.c_str());
    }
    std::printf("  %s  %s\n", pad("total", name_w).c_str(), bytes_text(total).c_str());
}

void print_json(const CheckpointDir &c, const std::vector<FileInfo> &files) {
    const ckpt::Manifest &m = c.manifest;
    JsonWriter j;
    j.begin_object();
    j.key("path"), j.string(c.path);
    j.key("format_version"), j.string(format("%u.%u", m.format_major, m.format_minor));
    j.key("library_version"), j.string(library_version_text(m.library_version));
    j.key("step"), j.number(m.step);
    j.key("world_size"), j.number(m.world_size);
    j.key("shard_size"), j.number(m.shard_size ? m.shard_size : m.world_size);
    j.key("stage"), j.number(m.stage);
    j.key("alignment"), j.number(m.alignment);
    j.key("created_unix_ms"), j.number(m.created_unix_ms);
    j.key("created"), j.string(utc_time_text(m.created_unix_ms));
    j.key("user_blob_bytes"), j.number(static_cast<uint64_t>(m.user_blob.size()));
    j.key("loss_scaler"), write_loss_scaler(j, m.loss_scaler);

    j.key("params");
    j.begin_array();
    for (const ckpt::ParamEntry &p : m.params) {
        j.begin_object();
        j.key("name"), j.string(p.name);
        j.key("shape");
        j.begin_array();
        for (int64_t e : p.shape) j.number(e);
        j.end_array();
        j.key("numel"), j.number(p.numel());
        j.key("dtype"), j.string(dtype_name(p.dtype));
        j.key("unit"), j.number(p.unit);
        j.key("param_group"), j.number(p.param_group);
        j.key("trainable"), j.boolean(p.trainable);
        j.key("step"), j.number(p.step);
        j.key("momentum_steps"), j.number(p.momentum_steps);
        j.key("tensors");
        j.begin_array();
        for (const ckpt::Tensor &t : p.tensors) {
            j.begin_object();
            j.key("kind"), j.string(ckpt::tensor_name(m.param_groups[static_cast<size_t>(p.param_group)], t.kind));
            j.key("dtype"), j.string(dtype_name(t.dtype));
            j.key("chunks"), j.number(static_cast<uint64_t>(t.chunks.size()));
            j.end_object();
        }
        j.end_array();
        j.end_object();
    }
    j.end_array();

    j.key("param_groups");
    j.begin_array();
    for (const ckpt::ParamGroupEntry &g : m.param_groups) {
        j.begin_object();
        j.key("optimizer"), j.string(g.optimizer == ckpt::kCustomOptimizer ? g.optimizer_name : optimizer_name(g.optimizer));
#define SX_JSON_FIELD(name, type, dflt, hp_key, applies) j.key(#name), j.value(g.name);
        SX_HYPERPARAMETERS(SX_JSON_FIELD)
#undef SX_JSON_FIELD
        j.end_object();
    }
    j.end_array();

    uint64_t total = c.manifest_bytes;
    j.key("manifest_bytes"), j.number(c.manifest_bytes);
    j.key("files");
    j.begin_array();
    for (const FileInfo &f : files) {
        j.begin_object();
        j.key("name"), j.string(f.name);
        j.key("bytes");
        if (f.present) {
            j.number(f.bytes);
            total += f.bytes;
        } else {
            j.null();
            j.key("error"), j.string(f.error);
        }
        j.key("bytes_needed"), j.number(f.needed);
        j.key("chunks"), j.number(static_cast<uint64_t>(f.chunks));
        j.end_object();
    }
    j.end_array();
    j.key("total_bytes"), j.number(total);
    j.end_object();
    std::printf("%s\n", j.text().c_str());
}

}  // namespace

int inspect_command(const std::vector<std::string> &args) {
    bool json = false;
    std::vector<std::string> dirs;
    for (const std::string &a : args) {
        if (is_help(a)) {
            std::fputs(kUsage, stdout);
            return kExitOk;
        }
        if (a == "--json")
            json = true;
        else if (a.size() > 1 && a[0] == '-')
            return usage_error("inspect: unknown option '" + a + "'");
        else
            dirs.push_back(a);
    }
    if (dirs.size() != 1) return usage_error("inspect takes one checkpoint directory");
    auto ops = io::posix_file_ops();
    CheckpointDir c;
    Status s = open_checkpoint(*ops, dirs[0], &c);
    if (!s.ok()) return failure(s);
    const std::vector<FileInfo> files = file_infos(*ops, c);
    if (json)
        print_json(c, files);
    else
        print_text(c, files);
    return kExitOk;
}

}  // namespace tool
}  // namespace sx
