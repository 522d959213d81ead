// Loading into any layout: verify the manifest, match params by name, read exactly the
// chunks this rank's shard needs (each verified by its CRC32C), agree that every rank
// succeeded, and only then change the group.
#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include "ckpt/checkpointer.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace {

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// Open shard files of one load, closed when it ends.
class OpenFiles {
  public:
    OpenFiles(io::FileOps &ops, std::string dir) : ops_(ops), dir_(std::move(dir)) {}
    ~OpenFiles() {
        for (auto &f : fds_) ops_.close(f.second, dir_ + "/" + names_[f.first]);
    }
    Status get(const Manifest &m, uint32_t file, int *fd) {
        auto it = fds_.find(file);
        if (it != fds_.end()) {
            *fd = it->second;
            return Status::Ok();
        }
        const std::string path = dir_ + "/" + m.files[file];
        SX_TRY(ops_.open_read(path, fd));
        fds_[file] = *fd;
        names_[file] = m.files[file];
        return Status::Ok();
    }

  private:
    io::FileOps &ops_;
    std::string dir_;
    std::map<uint32_t, int> fds_;
    std::map<uint32_t, std::string> names_;
};

}  // namespace

Status Checkpointer::load(const LoadOptions &options, std::string *user_blob) {
    core::ShardGroup &g = *group_;
    SX_TRY(g.check_usable());
    SX_CHECK(g.finalized(), SX_ERR_INVALID_STATE, "the group is not finalized yet; call sx_finalize first");
    SX_CHECK_ARG(!options.path.empty(), "the checkpoint path is empty");
    // A save in flight reads the shard (and owns staging) until it completes.
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    const core::Layout &layout = g.layout();
    const int rank = g.rank();
    const int32_t np = g.num_params();

    // Staging for this rank's shard of every unit: params and state slots. Filled from
    // the live values first, so that whatever the checkpoint does not hold stays.
    struct UnitStage {
        HostBuffer params, state[3];
        int slots = 0;
    };
    std::vector<UnitStage> stage(layout.units().size());
    Manifest m;
    std::vector<int32_t> index(np, -1);

    Status local = [&]() -> Status {
        std::string bytes;
        SX_TRY(io::read_file(*ops_, options.path + "/MANIFEST", kMaxManifestBytes, &bytes));
        Status d = decode_manifest(bytes.data(), bytes.size(), &m);
        if (!d.ok()) return d.prefix(format("%s/MANIFEST: ", options.path.c_str()));

        // Match params by name; shapes must agree; missing and extra are errors unless allowed.
        std::unordered_map<std::string, int32_t> by_name;
        for (size_t i = 0; i < m.params.size(); ++i) by_name.emplace(m.params[i].name, static_cast<int32_t>(i));
        std::vector<bool> used(m.params.size(), false);
        for (int32_t p = 0; p < np; ++p) {
            const core::ParamSpec &spec = g.param(p);
            auto it = by_name.find(spec.name);
            if (it == by_name.end()) {
                SX_CHECK(options.allow_missing, SX_ERR_NOT_FOUND,
                         "param '%s' is not in the checkpoint (allow missing params to keep its values)",
                         spec.name.c_str());
                continue;
            }
            const ParamEntry &e = m.params[it->second];
            SX_CHECK(e.shape == spec.shape, SX_ERR_MISMATCH,
                     "param '%s' has shape %s here but %s in the checkpoint", spec.name.c_str(),
                     shape_text(spec.shape).c_str(), shape_text(e.shape).c_str());
            SX_CHECK(e.dtype == spec.dtype, SX_ERR_MISMATCH, "param '%s' has dtype %d here but %d in the checkpoint",
                     spec.name.c_str(), spec.dtype, e.dtype);
            if (!options.params_only) {
                const int32_t here = static_cast<int32_t>(g.param_groups()[spec.group].hyper.kind);
                const int32_t there = m.param_groups[e.param_group].optimizer;
                SX_CHECK(here == there, SX_ERR_MISMATCH,
                         "param '%s' uses optimizer %d here but %d in the checkpoint (load params only "
                         "to start afresh)",
                         spec.name.c_str(), here, there);
            }
            // This build reads fp32 tensors only; anything else is refused, not misread.
            for (const Tensor &t : e.tensors)
                SX_CHECK(t.dtype == SX_DTYPE_F32, SX_ERR_UNSUPPORTED,
                         "param '%s'%s is stored as dtype %d; this build loads fp32 tensors only",
                         spec.name.c_str(), tensor_suffix(t.kind), t.dtype);
            index[p] = it->second;
            used[it->second] = true;
        }
        if (!options.allow_extra)
            for (size_t i = 0; i < m.params.size(); ++i)
                SX_CHECK(used[i], SX_ERR_MISMATCH,
                         "the checkpoint has param '%s', which this group does not (allow extra params to "
                         "ignore it)",
                         m.params[i].name.c_str());
        if (!options.params_only)
            SX_CHECK(m.param_groups.size() == g.param_groups().size(), SX_ERR_MISMATCH,
                     "the checkpoint has %zu param groups, this group %zu", m.param_groups.size(),
                     g.param_groups().size());

        // What to read: values always; the optimizer state the checkpoint holds, which
        // must be all the current optimizer keeps (or none: a param never trained).
        std::vector<std::vector<TensorKind>> want(np);
        std::vector<int> slots_needed(layout.units().size(), 0);
        for (int32_t p = 0; p < np; ++p) {
            if (index[p] < 0) continue;
            want[p] = {TensorKind::kParam};
            if (options.params_only) continue;
            const ParamEntry &e = m.params[index[p]];
            if (e.tensors.size() <= 1) continue;
            const std::vector<TensorKind> kinds = stored_kinds(g.param_groups()[g.param(p).group].hyper);
            for (size_t k = 1; k < kinds.size(); ++k) {
                bool present = false;
                for (const Tensor &t : e.tensors) present |= t.kind == kinds[k];
                SX_CHECK(present, SX_ERR_MISMATCH, "param '%s': the checkpoint has no %s state, which its "
                         "optimizer here keeps", e.name.c_str(), tensor_suffix(kinds[k]) + 1);
            }
            want[p] = kinds;
            int &need = slots_needed[layout.placement(p).unit_index];
            need = std::max(need, static_cast<int>(kinds.size()) - 1);
        }
        std::vector<ReadOp> ops;
        SX_TRY(plan_read(m, layout, rank, index, want, &ops));

        for (size_t u = 0; u < stage.size(); ++u) {
            SX_TRY(g.reserve_state(u, slots_needed[u]));
            const core::ShardGroup::UnitView v = g.unit_view(u);
            const uint64_t bytes = v.shard_numel * sizeof(float);
            UnitStage &us = stage[u];
            SX_TRY(us.params.allocate(bytes, "checkpoint load staging"));
            std::memcpy(us.params.data(), v.params + static_cast<uint64_t>(rank) * v.shard_numel, bytes);
            us.slots = slots_needed[u];
            for (int k = 0; k < us.slots; ++k) {
                SX_TRY(us.state[k].allocate(bytes, "checkpoint load staging"));
                std::memcpy(us.state[k].data(), v.state[k], bytes);
            }
        }

        // Read whole chunks (their CRC covers them whole) and keep the part this shard owns.
        OpenFiles files(*ops_, options.path);
        std::vector<char> buf;
        for (const ReadOp &op : ops) {
            const Chunk &c = *op.chunk;
            int fd = -1;
            SX_TRY(files.get(m, c.file, &fd));
            buf.resize(c.length);
            const std::string path = options.path + "/" + m.files[c.file];
            SX_TRY(ops_->pread_all(fd, buf.data(), c.length, c.offset, path));
            SX_CHECK(io::crc32c(buf.data(), c.length) == c.crc32c, SX_ERR_CORRUPT,
                     "%s: the chunk of param '%s'%s at byte %llu fails its CRC32C check", path.c_str(),
                     m.params[op.manifest_param].name.c_str(), tensor_suffix(op.kind),
                     static_cast<unsigned long long>(c.offset));
            UnitStage &us = stage[op.unit_index];
            // want[p] lists kinds in slot order: kinds[k] lives in slot k - 1.
            const std::vector<TensorKind> &kinds = want[op.param];
            const size_t k = static_cast<size_t>(std::find(kinds.begin(), kinds.end(), op.kind) - kinds.begin());
            float *dst = k == 0 ? us.params.as<float>() : us.state[k - 1].as<float>();
            std::memcpy(dst + op.shard_offset, buf.data() + (op.copy_begin - c.begin) * sizeof(float),
                        (op.copy_end - op.copy_begin) * sizeof(float));
        }
        return Status::Ok();
    }();

    // All ranks agree: the highest failing status code wins everywhere.
    uint64_t verdict[1] = {local.ok() ? 0u : static_cast<uint64_t>(local.code())};
    SX_TRY(g.collective([&](comm::Communicator &c) { return c.all_reduce_max(verdict, 1); }));
    if (!local.ok()) return local;
    SX_CHECK(verdict[0] == 0, static_cast<sx_status_t>(verdict[0]),
             "loading %s failed on another rank (see that rank's error)", options.path.c_str());

    // Commit: the staged shard replaces the live one, then the params are gathered.
    for (size_t u = 0; u < stage.size(); ++u) {
        const core::ShardGroup::UnitView v = g.unit_view(u);
        const uint64_t bytes = v.shard_numel * sizeof(float);
        std::memcpy(v.params + static_cast<uint64_t>(rank) * v.shard_numel, stage[u].params.data(), bytes);
        for (int k = 0; k < stage[u].slots; ++k) std::memcpy(v.state[k], stage[u].state[k].data(), bytes);
    }
    if (!options.params_only) {
        for (int32_t p = 0; p < np; ++p) {
            if (index[p] < 0) continue;
            core::ParamSpec &spec = g.mutable_param(p);
            spec.step = m.params[index[p]].step;
            spec.momentum_steps = m.params[index[p]].momentum_steps;
        }
        for (size_t i = 0; i < m.param_groups.size(); ++i) {
            optim::Hyper &h = g.param_groups()[i].hyper;
            const ParamGroupEntry &e = m.param_groups[i];
            h.lr = e.lr, h.weight_decay = e.weight_decay, h.beta1 = e.beta1, h.beta2 = e.beta2, h.eps = e.eps;
            h.momentum = e.momentum, h.dampening = e.dampening;
            h.nesterov = e.nesterov, h.maximize = e.maximize, h.amsgrad = e.amsgrad;
        }
        g.set_steps_taken(m.step);
    }
    if (g.world_size() > 1) {
        for (size_t u = 0; u < stage.size(); ++u) {
            const core::ShardGroup::UnitView v = g.unit_view(u);
            SX_TRY(g.collective([&](comm::Communicator &c) {
                return c.all_gather(v.params, v.shard_numel * sizeof(float));
            }));
        }
    }
    if (user_blob) *user_blob = m.user_blob;
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
