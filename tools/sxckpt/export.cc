// sxckpt export --safetensors OUT [--optimizer PREFIX] DIR: the full, unsharded params
// as one safetensors file (safetensors.h), and on request the optimizer state as
// PREFIX.safetensors and PREFIX.json (optimizer_json.h), in torch's names:
//
//   OUT                  NAME for every param, in its shape ([] for a scalar): what
//                        torch's Module.load_state_dict(strict=True) takes
//   PREFIX.safetensors   NAME.exp_avg, NAME.exp_avg_sq, NAME.max_exp_avg_sq,
//                        NAME.momentum_buffer, ...: the state tensors each param has
//                        (Adafactor's factored NAME.row_var and NAME.col_var, from
//                        the MANIFEST, in torch's shapes [..., R, 1] and [..., 1, C])
//   PREFIX.json          the param groups in torch's key names, each param's steps
//
// Each tensor keeps the dtype its chunks are stored in ("F32": sx stores fp32 master
// weights and state).
//
// Streaming: the headers come from the MANIFEST alone (every tensor's size is known
// from its shape), then the shard files are read one at a time, chunk by chunk in
// file order, each chunk's CRC32C checked while its bytes go straight to their place
// in their output. Memory: the manifest, the headers and one buffer of at most
// kPieceBytes, whatever the size of the checkpoint. Every output is written as
// NAME.tmp and fsynced; only once all are complete are they renamed into place, and
// their directories fsynced. A failure leaves no .tmp behind and none of the outputs
// this run renamed.
#include <cinttypes>
#include <cstdio>
#include <unordered_set>

#include "checkpoint_dir.h"
#include "ckpt/directory.h"
#include "commands.h"
#include "optimizer_json.h"
#include "safetensors.h"

namespace sx {
namespace tool {

namespace {

// One safetensors output.
struct OutFile {
    std::string path;
    std::vector<StTensor> tensors;
    std::string head;  // the length field and the header
    uint64_t data_bytes = 0;
    int fd = -1;
    // Tensors whose values the MANIFEST holds (Adafactor's factored moments): their
    // data's offset and values.
    std::vector<std::pair<uint64_t, const std::vector<float> *>> from_manifest;
};

// Where a stored tensor goes: file index into ExportPlan::files (-1: not exported) and
// the tensor's index there.
struct Route {
    int file = -1;
    size_t tensor = 0;
};

struct ExportPlan {
    std::vector<OutFile> files;               // [0] the params, [1] the optimizer state
    std::vector<std::vector<Route>> route;    // [param][tensor], as in the manifest
    std::string optimizer_json;               // "" unless asked for
};

// Names, offsets and headers, from the manifest alone. The params go to file 0; their
// optimizer state to file 1 if there is one, else nowhere.
Status plan_export(const ckpt::Manifest &m, ExportPlan *plan) {
    const std::vector<std::pair<std::string, std::string>> metadata = {
        {"writer", "sxckpt"},
        {"sx_format_version", format("%u.%u", m.format_major, m.format_minor)},
        {"sx_library_version", library_version_text(m.library_version)},
        {"step", format("%" PRIu64, m.step)},
        {"world_size", format("%d", m.world_size)},
    };
    std::vector<std::unordered_set<std::string>> names(plan->files.size(), {kMetadataKey});
    std::vector<uint64_t> cursor(plan->files.size(), 0);
    plan->route.clear();
    // 4.0's packed state (bf16 slots, 8-bit codes and scales) has no torch optimizer's
    // form yet; the params alone export as from any checkpoint.
    for (size_t g = 0; g < m.param_groups.size() && plan->files.size() > 1; ++g)
        SX_CHECK(m.param_groups[g].state_dtype == SX_STATE_FP32, SX_ERR_UNSUPPORTED,
                 "param group %zu keeps %s optimizer state, which sxckpt does not export yet (export without "
                 "--optimizer to get the params)",
                 g, sx::optim::state_dtype_name(m.param_groups[g].state_dtype));
    plan->route.clear();
    for (const ckpt::ParamEntry &p : m.params) {
        std::vector<Route> routes;
        for (const ckpt::Tensor &t : p.tensors) {
            Route r;
            r.file = t.kind == ckpt::TensorKind::kParam ? 0 : 1;
            if (static_cast<size_t>(r.file) >= plan->files.size()) {
                routes.push_back(Route());
                continue;
            }
            OutFile &f = plan->files[r.file];
            StTensor o;
            // A custom optimizer's slots carry the names it registered.
            o.name = t.kind == ckpt::TensorKind::kParam
                         ? p.name
                         : p.name + "." + ckpt::tensor_name(m.param_groups[static_cast<size_t>(p.param_group)], t.kind);
            // A param named like the metadata key would give two entries one name:
            // refuse rather than lose one. (State names cannot collide: every suffix
            // begins with the only '.' it holds.)
            SX_CHECK(names[r.file].insert(o.name).second, SX_ERR_INVALID_ARGUMENT,
                     "the checkpoint would give two tensors of %s the name '%s' (param '%s' %s); safetensors "
                     "names must be unique",
                     printable(f.path).c_str(), printable(o.name).c_str(), printable(p.name).c_str(),
                     kind_name(t.kind).c_str());
            o.dtype = t.dtype;
            o.shape = p.shape;
            // numel < 2^62 (validate), so bytes fit; the running total is checked.
            const uint64_t bytes = p.numel() * ckpt::dtype_bytes(t.dtype);
            SX_CHECK(cursor[r.file] + bytes >= cursor[r.file], SX_ERR_INVALID_ARGUMENT,
                     "the tensors exceed 2^64 bytes");
            o.begin = cursor[r.file];
            o.end = cursor[r.file] = o.begin + bytes;
            r.tensor = f.tensors.size();
            f.tensors.push_back(std::move(o));
            routes.push_back(r);
        }
        plan->route.push_back(std::move(routes));
        if (plan->files.size() < 2 || p.row_var.empty()) continue;
        // Adafactor's factored moments, in torch's shapes: row_var [..., R, 1], col_var
        // [..., 1, C].
        OutFile &f = plan->files[1];
        std::vector<int64_t> rows(p.shape.begin(), p.shape.end() - 1), cols(p.shape.begin(), p.shape.end() - 2);
        rows.push_back(1);
        cols.push_back(1);
        cols.push_back(p.shape.back());
        for (const auto &[suffix, shape, values] :
             {std::make_tuple(".row_var", rows, &p.row_var), std::make_tuple(".col_var", cols, &p.col_var)}) {
            StTensor o;
            o.name = p.name + suffix;
            SX_CHECK(names[1].insert(o.name).second, SX_ERR_INVALID_ARGUMENT,
                     "the checkpoint would give two tensors of %s the name '%s'", printable(f.path).c_str(),
                     printable(o.name).c_str());
            o.dtype = SX_DTYPE_F32;
            o.shape = shape;
            o.begin = cursor[1];
            o.end = cursor[1] = o.begin + values->size() * sizeof(float);
            f.from_manifest.emplace_back(o.begin, values);
            f.tensors.push_back(std::move(o));
        }
    }
    for (size_t i = 0; i < plan->files.size(); ++i) {
        SX_TRY(safetensors_header(metadata, plan->files[i].tensors, &plan->files[i].head));
        plan->files[i].data_bytes = cursor[i];
    }
    return Status::Ok();
}

// Writes every exported chunk of shard file f at its place in its output.
Status copy_file(io::FileOps &ops, const CheckpointDir &c, uint32_t f, const std::vector<ChunkRef> &chunks,
                 const ExportPlan &plan, std::vector<char> *buffer) {
    bool any = false;
    for (const ChunkRef &ref : chunks) any |= plan.route[ref.param][ref.tensor].file >= 0;
    if (!any) return Status::Ok();
    const std::string path = c.file_path(f);
    int fd = -1;
    SX_TRY(ops.open_read(path, &fd));
    Status s;
    for (const ChunkRef &ref : chunks) {
        const Route &r = plan.route[ref.param][ref.tensor];
        if (r.file < 0) continue;
        const OutFile &out = plan.files[r.file];
        const StTensor &t = out.tensors[r.tensor];
        const uint64_t at = out.head.size() + t.begin + ref.chunk->begin * ckpt::dtype_bytes(t.dtype);
        const std::string out_tmp = out.path + ".tmp";
        s = read_chunk(ops, fd, path, *ref.chunk, buffer, [&](const char *data, size_t n, uint64_t off) {
            return ops.pwrite_all(out.fd, data, n, at + off, out_tmp);
        });
        if (!s.ok()) {
            s.prefix(format("%s at byte %" PRIu64 " (%" PRIu64 " bytes): %s: ",
                            printable(c.manifest.files[f]).c_str(), ref.chunk->offset, ref.chunk->length,
                            describe_chunk(c.manifest, ref).c_str()));
            break;
        }
    }
    ops.close(fd, path);
    return s;
}

std::string parent_of(const std::string &path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes every output as PATH.tmp: the safetensors files streamed from the shard files,
// then the JSON.
Status write_temporaries(io::FileOps &ops, const CheckpointDir &c, ExportPlan *plan,
                         const std::string &json_path) {
    Status s;
    for (OutFile &f : plan->files) {
        const std::string tmp = f.path + ".tmp";
        s = ops.open_write(tmp, &f.fd);
        if (s.ok()) s = ops.pwrite_all(f.fd, f.head.data(), f.head.size(), 0, tmp);
        for (const auto &[at, values] : f.from_manifest)
            if (s.ok())
                s = ops.pwrite_all(f.fd, reinterpret_cast<const char *>(values->data()), values->size() * sizeof(float),
                                   f.head.size() + at, tmp);
        if (!s.ok()) break;
    }
    if (s.ok()) s = c.indexes_ok();  // a file whose chunks are unknown cannot be exported
    if (s.ok()) {
        const auto by_file = chunks_by_file(c.manifest);
        std::vector<char> buffer(piece_buffer_bytes(c.manifest));
        for (uint32_t f = 0; f < c.manifest.files.size() && s.ok(); ++f)
            s = copy_file(ops, c, f, by_file[f], *plan, &buffer);
    }
    for (OutFile &f : plan->files) {
        if (f.fd < 0) continue;
        const std::string tmp = f.path + ".tmp";
        if (s.ok()) s = ops.fsync(f.fd, tmp);
        Status closed = ops.close(f.fd, tmp);
        if (s.ok()) s = closed;
        f.fd = -1;
    }
    if (s.ok() && !json_path.empty()) s = ckpt::write_durable_file(ops, json_path + ".tmp", plan->optimizer_json);
    return s;
}

Status export_files(io::FileOps &ops, const CheckpointDir &c, const std::string &out, const std::string &prefix,
                    ExportPlan *plan) {
    plan->files.resize(prefix.empty() ? 1 : 2);
    plan->files[0].path = out;
    std::vector<std::string> finals = {out};
    std::string json_path;
    if (!prefix.empty()) {
        plan->files[1].path = prefix + ".safetensors";
        json_path = prefix + ".json";
        plan->optimizer_json = optimizer_json(c.manifest);
        finals.push_back(plan->files[1].path);
        finals.push_back(json_path);
    }
    SX_TRY(plan_export(c.manifest, plan));
    Status s = write_temporaries(ops, c, plan, json_path);
    size_t renamed = 0;
    for (; s.ok() && renamed < finals.size(); ++renamed) s = ops.rename(finals[renamed] + ".tmp", finals[renamed]);
    if (!s.ok()) {
        // Best effort: the error that matters is s.
        for (size_t i = 0; i < finals.size(); ++i) ops.unlink(finals[i] + (i < renamed ? "" : ".tmp"));
        return s;
    }
    std::unordered_set<std::string> dirs;
    for (const std::string &f : finals)
        if (dirs.insert(parent_of(f)).second) SX_TRY(ops.fsync_dir(parent_of(f)));
    return Status::Ok();
}

}  // namespace

int export_command(const std::vector<std::string> &args) {
    std::string out, prefix;
    std::vector<std::string> dirs;
    const int parsed = parse_args("export", args, {{"--safetensors", &out}, {"--optimizer", &prefix}}, &dirs);
    if (parsed >= 0) return parsed;
    if (out.empty()) return usage_error("export needs --safetensors OUT");
    if (dirs.size() != 1) return usage_error("export takes one checkpoint directory");
    if (!prefix.empty() && (out == prefix + ".safetensors" || out == prefix + ".json"))
        return usage_error("export: OUT and the files of --optimizer " + prefix + " must differ");
    auto ops = io::posix_file_ops();
    CheckpointDir c;
    Status s = open_checkpoint(*ops, dirs[0], &c);
    if (!s.ok()) return failure(s);
    ExportPlan plan;
    s = export_files(*ops, c, out, prefix, &plan);
    if (!s.ok()) return failure(s.prefix("export to " + printable(out) + " failed: "));
    std::printf("wrote %s: %zu params, %s\n", printable(out).c_str(), plan.files[0].tensors.size(),
                bytes_text(plan.files[0].head.size() + plan.files[0].data_bytes).c_str());
    if (!prefix.empty()) {
        std::printf("wrote %s: %zu optimizer state tensors, %s\n", printable(plan.files[1].path).c_str(),
                    plan.files[1].tensors.size(),
                    bytes_text(plan.files[1].head.size() + plan.files[1].data_bytes).c_str());
        std::printf("wrote %s: %zu param groups\n", printable(prefix + ".json").c_str(),
                    c.manifest.param_groups.size());
    }
    std::printf("step %" PRIu64 ", format %u.%u\n", c.manifest.step, c.manifest.format_major,
                c.manifest.format_minor);
    return kExitOk;
}

}  // namespace tool
}  // namespace sx
