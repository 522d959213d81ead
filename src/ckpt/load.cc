// Loading into any layout (docs/design.md, "Checkpoint"): verify the manifest, match
// params by name, read exactly the chunks this rank's shard needs (each verified by its
// CRC32C), agree that every rank succeeded, and only then keep the change (or put
// everything back). Checkpointer::Load runs it phase by phase.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>

#include "ckpt/checkpointer.h"
#include "ckpt/chunk_reader.h"
#include "ckpt/directory.h"
#include "ckpt/progress.h"
#include "ckpt/shard_index.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace {

using core::shape_text;

// The read goes to the fp32 values (region 0), in place, rather than to a state slot.
bool reads_values(const ReadOp &op) { return op.kind == TensorKind::kParam; }

// The read takes its chunk whole (its CRC covers it whole), not a part of it.
bool whole(const ReadOp &op) { return op.copy_begin == op.chunk->begin && op.copy_end == op.chunk->end; }

// Region of `kind` in a unit's staging: want lists a param's kinds in slot order, so
// kinds[k] lives in region k (0: values, k: state slot k - 1); the scales of slot k in
// region kScalesRegion + k.
constexpr int kScalesRegion = 4, kRegions = 7;
int region_of(const std::vector<TensorKind> &kinds, TensorKind kind) {
    if (is_scales(kind)) return kScalesRegion + scales_slot(kind);
    return static_cast<int>(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
}

// Where one unit's shard is read, in the group's memory: the values (shard_numel
// floats), each state slot laid out as the unit keeps it (UnitShard::slot_bytes) and a
// packed unit's scales (slot_scales floats).
struct UnitStage {
    // [0] values (live), [1..3] state slots, [4..6] their scales
    char *region[kRegions] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    float *kept = nullptr;  // staging: the values as they were before the load
    int slots = 0;          // state slots read
};

// Bytes of region r of unit shard v, and where the group keeps it now (null: nowhere yet).
uint64_t region_bytes(const core::UnitShard &v, int r) {
    return r == 0 ? v.shard_numel * sizeof(float) : r < kScalesRegion ? v.slot_bytes : v.slot_scales * sizeof(float);
}
const char *live_region(const core::UnitShard &v, int r) {
    const float *live = r == 0 ? v.values : r < kScalesRegion ? v.state[r - 1] : v.scales[r - kScalesRegion];
    return reinterpret_cast<const char *>(live);
}

// The values a load overwrites in place, each range copied aside (into staging) before
// its read: put back unless the load commits. A device that fails the copy back fails
// the group (its values are then neither the old nor the new). keep() may run on
// several threads at once, for different reads.
class ValuesRollback {
  public:
    ValuesRollback(core::ShardAccess &g) : g_(g) {}
    ~ValuesRollback() {
        Status s = restore();
        if (!s.ok()) g_.fail(s.prefix("putting the values back after a failed load: "));
    }
    // Room for `reads` reads (before any keep()).
    void reserve(size_t reads) { kept_.assign(reads, Kept()); }
    // Copies what read i will overwrite, `bytes` at `live`, to `aside`.
    Status keep(size_t i, float *live, float *aside, size_t bytes) {
        SX_TRY(g_.state_ops().to_host(aside, live, bytes));
        kept_[i] = {live, aside, bytes};
        return Status::Ok();
    }
    // Puts every kept range back, once: afterwards the rollback has nothing to do.
    Status restore() {
        std::vector<Kept> kept;
        kept.swap(kept_);
        for (const Kept &k : kept)
            if (k.live) SX_TRY(g_.state_ops().from_host(k.live, k.aside, k.bytes));
        return Status::Ok();
    }
    // The load committed: nothing goes back.
    void commit() { kept_.clear(); }

  private:
    struct Kept {
        float *live = nullptr;  // null: read i did not overwrite values
        const float *aside = nullptr;
        size_t bytes = 0;
    };
    core::ShardAccess &g_;
    std::vector<Kept> kept_;  // per read
};

// Copies the live values and state into every part of the staging regions that no read
// covers (params the checkpoint lacks, padding, the gaps between a packed unit's pieces),
// so that staging ends up as the whole new shard; a state slot the unit does not have yet
// gets zeros, as a new slot holds. covered[{u, r}] lists the byte ranges the reads fill
// of unit u's region r, region(u, r) is that region (or the live buffer itself, left
// alone), in the group's memory.
using Covered = std::map<std::pair<int32_t, int>, std::vector<std::pair<uint64_t, uint64_t>>>;
Status fill_uncovered(core::DeviceOps &dev, const std::vector<core::UnitShard> &units, Covered covered,
                      const std::function<char *(int32_t, int)> &region) {
    for (size_t u = 0; u < units.size(); ++u) {
        const core::UnitShard &v = units[u];
        for (int r = 0; r < kRegions; ++r) {
            char *dst = region(static_cast<int32_t>(u), r);
            if (dst == nullptr) continue;
            const char *live = live_region(v, r);
            if (dst == live) continue;  // read in place: what no read covers stays as it is
            std::vector<std::pair<uint64_t, uint64_t>> &iv = covered[{static_cast<int32_t>(u), r}];
            std::sort(iv.begin(), iv.end());
            uint64_t at = 0;
            const uint64_t size = region_bytes(v, r);
            iv.push_back({size, size});
            for (const auto &c : iv) {
                if (c.first > at && live) SX_TRY(dev.copy(dst + at, live + at, c.first - at));
                if (c.first > at && !live) SX_TRY(dev.zero(dst + at, c.first - at));
                at = std::max(at, c.second);
            }
        }
    }
    return Status::Ok();
}

}  // namespace

// One load, from its plan to its commit. The phases run in order on the caller's thread
// (run()), but for the ranks' agreement on the values and the gather of the params,
// which overlap the reads of the states on a thread of their own.
class Checkpointer::Load {
  public:
    Load(Checkpointer &ck, const LoadOptions &options)
        : ck_(ck), g_(*ck.group_), dev_(g_.state_ops()), options_(options), on_host_(dev_.device() == SX_DEVICE_CPU),
          keep_spares_(ck.loaded_), tracer_(g_.tracer()), rollback_(g_) {}
    // However the load ends, the spare state buffers stay only if an earlier load
    // succeeded (see Checkpointer::spare_state_).
    ~Load() {
        reader_.reset();
        if (!keep_spares_) {
            ck_.spare_state_.clear();
            ck_.spare_scales_.clear();
        }
    }

    Status run(std::string *user_blob) {
        SX_TRACE_SPAN(tracer_, "ckpt", "load", trace::kNoUnit, trace::kNoBytes, options_.path.c_str());
        SX_TRY(agree_on_the_checkpoint());  // before anything changes
        SX_TRY(g_.export_shard(&shard_));  // the trainer's writes first; the masters are the values
        // Whatever fails while planning and starting the reads (an exception too) is this
        // rank's vote, so that no peer waits.
        {
            SX_TRACE_SPAN(tracer_, "ckpt", "load.plan");
            local_ = catching([&] { return prepare(); });
        }
        uint64_t total = 0, values = 0;
        for (size_t i = 0; i < reads_.size(); ++i) {
            total += reads_[i].chunk->length;
            if (i < values_reads_) values += reads_[i].chunk->length;
        }
        progress_.reset(new ProgressLog(
            "loading", options_.path, g_.rank(), total,
            local_.ok() ? format("step %llu, saved by %d ranks, %zu chunks", static_cast<unsigned long long>(m_.step),
                                 m_.world_size, reads_.size())
                        : "failed before its reads: " + local_.message()));
        {
            SX_TRACE_SPAN(tracer_, "ckpt", "load.read_values", trace::kNoUnit, values);
            check_reads(0, values_reads_, nullptr);
        }
        SX_TRY(agree_on_values_while_reading_states(total - values));
        SX_TRY(finish(user_blob));
        progress_->finish(format("loaded, step %llu", static_cast<unsigned long long>(m_.step)).c_str());
        return Status::Ok();
    }

  private:
    // The call's header: every rank names the checkpoint it loads (the path as given, its
    // MANIFEST's CRC32C and step) and the load's flags, before anything changes, so that
    // ranks loading different checkpoints (or in another call) fail at once, each told
    // every rank's. A rank that cannot read its MANIFEST says why, and fails with that.
    Status agree_on_the_checkpoint() {
        uint32_t crc = 0;
        const Status read = catching([&]() -> Status {
            SX_CHECK_ARG(!options_.path.empty(), "the checkpoint path is empty");
            SX_TRY(check_checkpoint_name(options_.path, "a load"));
            return read_manifest(*ck_.ops_, options_.path, &m_, &crc);
        });
        std::vector<core::Fact> facts = {{"the checkpoint", options_.path}};
        if (read.ok()) {
            facts.push_back({"its MANIFEST's CRC32C", format("%08x", crc)});
            facts.push_back({"its step", std::to_string(m_.step)});
        }
        facts.push_back({"the load's flags", format("params_only %d, allow_missing %d, allow_extra %d",
                                                    options_.params_only, options_.allow_missing,
                                                    options_.allow_extra)});
        return g_.agree_call("sx_load_optim_state", std::move(facts), read);
    }

    Status prepare() {
        SX_TRY(match_params());
        SX_TRY(read_indexes());
        SX_TRY(plan_reads());
        SX_TRY(stage_regions());
        return start_reads();
    }

    // Phase 1: every param of the group to its entry in the manifest, by name; shapes
    // must agree; missing and extra params are errors unless allowed.
    Status match_params() {
        const int32_t np = g_.num_params();
        index_.assign(static_cast<size_t>(np), -1);
        cuts_.assign(static_cast<size_t>(np), PieceCut());
        // A checkpoint's param group's hyperparameters replace the group's, and its slots
        // are read as they are, in the layout the group's state dtype gives them (blocks
        // follow every layout's shards: no requantization).
        for (size_t i = 0; i < std::min(m_.param_groups.size(), shard_.progress.hypers.size()) && !options_.params_only; ++i)
            SX_CHECK(m_.param_groups[i].state_dtype == shard_.progress.hypers[i].state_dtype, SX_ERR_MISMATCH,
                     "param group %zu keeps %s optimizer state here but %s in the checkpoint (give it the "
                     "checkpoint's state_dtype before sx_finalize, or load params only)",
                     i, optim::state_dtype_name(shard_.progress.hypers[i].state_dtype),
                     optim::state_dtype_name(m_.param_groups[i].state_dtype));

        std::unordered_map<std::string, int32_t> by_name;
        for (size_t i = 0; i < m_.params.size(); ++i) by_name.emplace(m_.params[i].name, static_cast<int32_t>(i));
        std::vector<bool> used(m_.params.size(), false);
        for (int32_t p = 0; p < np; ++p) {
            const core::ParamSpec &spec = g_.param(p);
            auto it = by_name.find(spec.name);
            if (it == by_name.end()) {
                SX_CHECK(options_.allow_missing, SX_ERR_NOT_FOUND,
                         "param '%s' is not in the checkpoint (allow missing params to keep its values)",
                         spec.name.c_str());
                continue;
            }
            SX_TRY(check_entry(spec, m_.params[it->second], &cuts_[p]));
            index_[p] = it->second;
            used[it->second] = true;
        }
        if (!options_.allow_extra)
            for (size_t i = 0; i < m_.params.size(); ++i)
                SX_CHECK(used[i], SX_ERR_MISMATCH,
                         "the checkpoint has param '%s', which this group does not (allow extra params to "
                         "ignore it)",
                         m_.params[i].name.c_str());
        // Param groups match by index. A group the checkpoint lacks (added after it was
        // saved) keeps its hyperparameters where missing params are allowed; one this
        // group lacks is ignored where extra params are.
        const size_t saved = m_.param_groups.size(), here = shard_.progress.hypers.size();
        if (!options_.params_only)
            SX_CHECK(saved == here || (saved < here && options_.allow_missing) || (saved > here && options_.allow_extra),
                     SX_ERR_MISMATCH,
                     "the checkpoint has %zu param groups, this group %zu (allow %s params to load it anyway: "
                     "param groups match by index)",
                     saved, here, saved < here ? "missing" : "extra");
        return Status::Ok();
    }

    // Format 2.0: the chunk tables of the files that hold what this rank reads, and of no
    // other file: what a rank reads grows with its own shard, not with the checkpoint's
    // number of files.
    Status read_indexes() {
        if (!m_.chunks_in_files()) return Status::Ok();
        return read_file_indexes(*ck_.ops_, options_.path,
                                 files_for_shard(m_, g_.layout(), g_.shard_rank(), index_, cuts_), &m_);
    }

    // How param `spec` keeps its state slots in a param group of state dtype `group_dtype`.
    static int32_t state_dtype_of(const core::ParamSpec &spec, double group_dtype) {
        return optim::param_state_dtype(static_cast<int32_t>(group_dtype), spec.numel);
    }

    // "AdamW", "the custom optimizer 'MyLion'", for messages.
    static std::string optimizer_label(const ParamGroupEntry &g) {
        return g.optimizer == kCustomOptimizer ? optimizer_text(g) : optim::optimizer_name(g.optimizer);
    }

    // Where param `spec`'s values are in its entry `e` of the manifest (*cut): the same
    // shape and a placement that loads into it, or a piece of a split tensor within the
    // saved tensor (docs/model-parallel.md). Anything else would load the wrong values.
    Status find_piece(const core::ParamSpec &spec, const ParamEntry &e, PieceCut *cut) const {
        const core::Placement saved = entry_placement(e);
        if (cut_of(e.shape, saved, spec.shape, spec.placement, cut)) return Status::Ok();
        SX_CHECK(e.shape != spec.shape, SX_ERR_MISMATCH,
                 "param '%s' is %s here but %s in the checkpoint: a saved piece of a split tensor loads only into "
                 "a piece within it (join the slices' checkpoints with `sxckpt join` first)",
                 spec.name.c_str(), core::placement_text(spec.placement).c_str(), core::placement_text(saved).c_str());
        SX_CHECK(spec.placement.kind != SX_PLACEMENT_SPLIT, SX_ERR_MISMATCH,
                 "param '%s' is %s with shape %s here, which is not within what the checkpoint holds: %s, shape %s "
                 "(a piece loads from its logical tensor whole, or from a saved piece of it on the same dimension "
                 "that contains it; join the slices' checkpoints with `sxckpt join` first)",
                 spec.name.c_str(), core::placement_text(spec.placement).c_str(), shape_text(spec.shape).c_str(),
                 core::placement_text(saved).c_str(), shape_text(e.shape).c_str());
        return SX_ERROR(SX_ERR_MISMATCH, "param '%s' has shape %s here but %s in the checkpoint", spec.name.c_str(),
                        shape_text(spec.shape).c_str(), shape_text(e.shape).c_str());
    }

    // A param and its entry in the manifest can be loaded into each other; *cut says where.
    Status check_entry(const core::ParamSpec &spec, const ParamEntry &e, PieceCut *cut) const {
        SX_TRY(find_piece(spec, e, cut));
        // The dtypes may differ: the stored values are fp32 (the masters of 16-bit params).
        if (!options_.params_only) {
            // A custom optimizer is the one registered here under the checkpoint's name.
            const ParamGroupEntry here = param_group_entry(shard_.progress.hypers[spec.group]);
            const ParamGroupEntry &there = m_.param_groups[e.param_group];
            SX_CHECK(here.optimizer == there.optimizer && here.optimizer_name == there.optimizer_name, SX_ERR_MISMATCH,
                     "param '%s' uses %s here but %s in the checkpoint (load params only to start afresh)",
                     spec.name.c_str(), optimizer_label(here).c_str(), optimizer_label(there).c_str());
        }
        // The values are fp32; anything else is refused, not misread.
        for (const Tensor &t : e.tensors)
            SX_CHECK(t.kind != TensorKind::kParam || t.dtype == SX_DTYPE_F32, SX_ERR_UNSUPPORTED,
                     "param '%s' is stored as dtype %d; this build loads fp32 values only", spec.name.c_str(), t.dtype);
        return options_.params_only ? Status::Ok() : check_state_cut(spec, e, *cut);
    }

    // Its state is read as it is stored: the param keeps it the same way here (its
    // group's state dtype matched in match_params; validate() matched its tensors'). A
    // piece cut from a larger saved tensor takes elementwise state only: 8-bit blocks
    // and Adafactor's factored moments are the saved tensor's, not the piece's.
    Status check_state_cut(const core::ParamSpec &spec, const ParamEntry &e, const PieceCut &cut) const {
        const int32_t here = state_dtype_of(spec, shard_.progress.hypers[spec.group].state_dtype);
        const int32_t there =
            optim::param_state_dtype(static_cast<int32_t>(m_.param_groups[e.param_group].state_dtype), e.numel());
        SX_CHECK(here == there, SX_ERR_MISMATCH,
                 "param '%s' keeps %s optimizer state here but %s in the checkpoint (load params only to start "
                 "afresh)",
                 spec.name.c_str(), optim::state_dtype_name(here), optim::state_dtype_name(there));
        if (cut.identity()) return Status::Ok();
        SX_CHECK(there != SX_STATE_8BIT, SX_ERR_UNSUPPORTED,
                 "param '%s': its 8-bit optimizer state cannot be cut exactly from the checkpoint's %s (its blocks "
                 "are the saved tensor's, not the piece's): load params only, or keep the state in fp32 or bf16",
                 spec.name.c_str(), shape_text(e.shape).c_str());
        SX_CHECK(e.row_var.empty() && e.col_var.empty(), SX_ERR_UNSUPPORTED,
                 "param '%s': Adafactor's factored moments of the checkpoint's %s cannot be cut exactly into a "
                 "piece (a piece's row or column means are not the whole's): load params only",
                 spec.name.c_str(), shape_text(e.shape).c_str());
        return Status::Ok();
    }

    // A custom optimizer's slots match by name: the checkpoint's slot k becomes the kind
    // of the slot of that name here (the optimizer may list its slots in another order
    // now). Once, after the files' indexes (which name the kinds as saved) were read.
    Status match_custom_slots() {
        if (options_.params_only) return Status::Ok();
        for (size_t p = 0; p < index_.size(); ++p) {
            if (index_[p] < 0) continue;
            ParamEntry &e = m_.params[index_[p]];
            const ParamGroupEntry &there = m_.param_groups[e.param_group];
            if (there.optimizer != kCustomOptimizer) continue;
            const ParamGroupEntry here = param_group_entry(shard_.progress.hypers[g_.param(static_cast<int32_t>(p)).group]);
            std::string listed;
            for (const std::string &n : here.slot_names) listed += (listed.empty() ? "" : ", ") + n;
            for (Tensor &t : e.tensors) {
                const int k = static_cast<int>(t.kind) - static_cast<int>(TensorKind::kSlot0);
                if (k < 0 || t.kind > TensorKind::kSlot2) continue;
                const std::string &name = there.slot_names[static_cast<size_t>(k)];
                const auto it = std::find(here.slot_names.begin(), here.slot_names.end(), name);
                SX_CHECK(it != here.slot_names.end(), SX_ERR_MISMATCH,
                         "param '%s': the checkpoint holds state '%s' of the custom optimizer '%s', which keeps "
                         "other slots here (%s)",
                         e.name.c_str(), name.c_str(), there.optimizer_name.c_str(),
                         listed.empty() ? "none" : listed.c_str());
                t.kind = static_cast<TensorKind>(static_cast<int>(TensorKind::kSlot0) + (it - here.slot_names.begin()));
            }
        }
        return Status::Ok();
    }

    // Phase 2: what to read: values always; the optimizer state the checkpoint holds,
    // which must be all the current optimizer keeps (or none: a param never trained).
    // Sequential reads, file by file, so that the kernel's readahead keeps the device
    // busy while the CRCs of what arrived are checked. Its own readahead, not one asked
    // for with POSIX_FADV_WILLNEED: that path fills the page cache with 4 KiB pages,
    // where sequential readahead allocates large folios; here it cost more CPU than the
    // copy out of the page cache itself (perf), the plain reader none of it. The values
    // come first (a save puts them first in each file), so that the ranks can gather
    // them while the states are read.
    Status plan_reads() {
        SX_TRY(match_custom_slots());
        const core::Layout &layout = g_.layout();
        const int32_t np = g_.num_params();
        want_.assign(static_cast<size_t>(np), {});
        slots_.assign(layout.units().size(), 0);
        for (int32_t p = 0; p < np; ++p) {
            if (index_[p] < 0) continue;
            want_[p] = {TensorKind::kParam};
            if (options_.params_only) continue;
            const ParamEntry &e = m_.params[index_[p]];
            if (e.tensors.size() <= 1) continue;
            const std::vector<TensorKind> kinds =
                stored_kinds(shard_.progress.hypers[g_.param(p).group], static_cast<int>(g_.param(p).shape.size()));
            for (size_t k = 1; k < kinds.size(); ++k) {
                bool present = false;
                for (const Tensor &t : e.tensors) present |= t.kind == kinds[k];
                SX_CHECK(present, SX_ERR_MISMATCH,
                         "param '%s': the checkpoint has no %s state, which its optimizer here keeps",
                         e.name.c_str(),
                         tensor_name(param_group_entry(shard_.progress.hypers[g_.param(p).group]), kinds[k]).c_str());
            }
            // State the checkpoint holds that the group here would not keep (amsgrad's
            // max_exp_avg_sq, SGD's or RMSprop's momentum_buffer, RMSprop's grad_avg): the
            // load restores the checkpoint's options with its hyperparameters, so that
            // state would start from zero instead. Refused, as the reverse is above, once
            // an update has written it (before, it is what a new slot starts from).
            for (const Tensor &t : e.tensors)
                SX_CHECK(e.step == 0 || t.kind == TensorKind::kParam || is_scales(t.kind) ||
                             std::find(kinds.begin(), kinds.end(), t.kind) != kinds.end(),
                         SX_ERR_MISMATCH,
                         "param '%s': the checkpoint has %s state (%s), which its optimizer here (%s) does not keep: "
                         "give the param group the checkpoint's options before loading, or load params only",
                         e.name.c_str(), tensor_suffix(t.kind) + 1, optimizer_text(m_.param_groups[e.param_group]).c_str(),
                         optimizer_text(param_group_entry(shard_.progress.hypers[g_.param(p).group])).c_str());
            want_[p] = kinds;
            // 8-bit slots: their scales too (region kScalesRegion + slot).
            if (state_dtype_of(g_.param(p), shard_.progress.hypers[g_.param(p).group].state_dtype) == SX_STATE_8BIT)
                for (size_t k = 1; k < kinds.size(); ++k) want_[p].push_back(scales_kind(static_cast<int>(k) - 1));
            int &need = slots_[layout.placement(p).unit_index];
            need = std::max(need, static_cast<int>(kinds.size()) - 1);
        }
        SX_TRY(plan_read(m_, layout, g_.shard_rank(), index_, want_, &reads_, cuts_));
        std::sort(reads_.begin(), reads_.end(), [](const ReadOp &a, const ReadOp &b) {
            if (reads_values(a) != reads_values(b)) return reads_values(a);
            return a.chunk->file != b.chunk->file ? a.chunk->file < b.chunk->file : a.chunk->offset < b.chunk->offset;
        });
        values_reads_ = static_cast<size_t>(std::count_if(reads_.begin(), reads_.end(), reads_values));
        return Status::Ok();
    }

    // Phase 3: where this rank's shard of every unit is read. The fp32 values (the
    // params' own shard, or the masters) are read in place, each range copied first into
    // the checkpointer's staging memory (kept between saves and loads), from which a
    // failed load puts it back (the rollback): those copies are made while the device
    // reads, where the commit would have had to copy after every read finished. Each
    // state slot is read into its spare buffer (spare_state_), which the commit swaps
    // with the live one (so the spare then holds the replaced state, for the next load
    // to stage into), or adds as a slot the unit did not have (a frozen unit has none):
    // a failed load leaves even the slot count as it was. Only what the checkpoint does
    // not cover is filled from the live values, so that it stays as it was.
    Status stage_regions() {
        const size_t units = shard_.units.size();
        uint64_t floats = 0;
        for (const core::UnitShard &v : shard_.units) floats += v.shard_numel;
        SX_TRY(ck_.grow_staging(floats * sizeof(float), HostBuffer::kLazy));
        float *next = ck_.staging_.as<float>();
        ck_.spare_state_.resize(units);
        ck_.spare_scales_.resize(units);
        stage_.assign(units, UnitStage());
        piece_of_.assign(static_cast<size_t>(g_.num_params()), nullptr);
        for (size_t u = 0; u < units; ++u) {
            const core::UnitShard &v = shard_.units[u];
            for (const core::StatePiece &piece : v.pieces) piece_of_[piece.param] = &piece;
            UnitStage &us = stage_[u];
            us.slots = slots_[u];
            us.region[0] = reinterpret_cast<char *>(v.values);
            us.kept = next;
            next += v.shard_numel;
            for (int k = 0; k < us.slots; ++k) {
                SX_TRY(spare(&ck_.spare_state_[u][k], v.slot_bytes, &us.region[k + 1]));
                SX_TRY(spare(&ck_.spare_scales_[u][k], v.slot_scales * sizeof(float), &us.region[kScalesRegion + k]));
            }
        }
        Covered covered;
        for (const ReadOp &op : reads_) {
            const int r = region_of(want_[op.param], op.kind);
            const uint64_t at = static_cast<uint64_t>(target(op) - stage_[op.unit_index].region[r]);
            covered[{op.unit_index, r}].push_back({at, at + (op.copy_end - op.copy_begin) * op.elem_bytes});
        }
        return fill_uncovered(dev_, shard_.units, std::move(covered),
                              [&](int32_t u, int r) { return stage_[u].region[r]; });
    }

    // *b as a spare buffer of `bytes` (none: no region), reused if it has that size.
    Status spare(core::Buffer *b, uint64_t bytes, char **region) {
        if (bytes == 0) {
            *b = core::Buffer();
            return Status::Ok();
        }
        if (b->size() != bytes) SX_TRY(dev_.allocate(bytes, "checkpoint load staging", b, true));
        *region = b->as<char>();
        return Status::Ok();
    }

    // Phase 4: the reader's threads start. Whole chunks are read straight to their place
    // when this shard owns all of it and the group keeps it in host memory, else through
    // a buffer keeping the part it owns. The reader runs ahead so that the device keeps
    // working while this thread checks the CRCs of what arrived; the copies aside of the
    // values read in place are made by its placing thread, ahead of the reads, rather
    // than between them.
    Status start_reads() {
        rollback_.reserve(reads_.size());
        reader_.reset(new ChunkReader(*ck_.ops_, options_.path, m_, reads_, [this](size_t i, char **into) -> Status {
            if (!direct(i)) return Status::Ok();
            SX_TRY(keep(i));
            *into = target(reads_[i]);
            return Status::Ok();
        }));
        return Status::Ok();
    }

    bool direct(size_t i) const { return on_host_ && whole(reads_[i]); }

    // Where read op goes: its region at the element's place (values, fp32 state), or in
    // a packed unit at the param's piece's bytes or scales.
    char *target(const ReadOp &op) const {
        const int r = region_of(want_[op.param], op.kind);
        char *base = stage_[op.unit_index].region[r];
        if (r == 0 || shard_.units[op.unit_index].pieces.empty()) return base + op.shard_offset * sizeof(float);
        const core::StatePiece &piece = *piece_of_[op.param];
        if (is_scales(op.kind)) return base + (piece.scale_offset + op.piece_offset) * sizeof(float);
        return base + piece.byte_offset + op.piece_offset * op.elem_bytes;
    }

    // Before read i overwrites values: their copy aside.
    Status keep(size_t i) {
        const ReadOp &op = reads_[i];
        if (!reads_values(op)) return Status::Ok();
        return rollback_.keep(i, reinterpret_cast<float *>(target(op)), stage_[op.unit_index].kept + op.shard_offset,
                              (op.copy_end - op.copy_begin) * sizeof(float));
    }

    // Phase 5: waits for reads [begin, end), checks their CRCs and puts them in place;
    // stops early (the result then does not matter) once *abandon is set. Its failure
    // (an exception too) becomes this rank's, and stops the reads at once.
    void check_reads(size_t begin, size_t end, const std::atomic<bool> *abandon) {
        if (!local_.ok()) return;
        local_ = catching([&]() -> Status {
            for (size_t i = begin; i < end && !(abandon && abandon->load()); ++i) SX_TRY(check_read(i));
            return Status::Ok();
        });
        if (!local_.ok()) reader_.reset();
    }

    Status check_read(size_t i) {
        const ReadOp &op = reads_[i];
        const Chunk &c = *op.chunk;
        const char *data = nullptr;
        SX_TRY(reader_->wait(i, &data));
        const std::string path = options_.path + "/" + m_.files[c.file];
        progress_->add(c.length);
        SX_CHECK(io::crc32c(data, c.length) == c.crc32c, SX_ERR_CORRUPT,
                 "%s: the chunk of param '%s'%s at byte %llu fails its CRC32C check", path.c_str(),
                 m_.params[op.manifest_param].name.c_str(), tensor_suffix(op.kind),
                 static_cast<unsigned long long>(c.offset));
        if (!direct(i)) {
            SX_TRY(keep(i));
            SX_TRY(dev_.from_host(target(op), data + (op.copy_begin - c.begin) * op.elem_bytes,
                                  (op.copy_end - op.copy_begin) * op.elem_bytes));
        }
        reader_->release(i);
        return Status::Ok();
    }

    // Every rank votes; the highest failing status code wins everywhere.
    Status agree(const Status &mine) {
        uint64_t verdict[1] = {mine.ok() ? 0u : static_cast<uint64_t>(mine.code())};
        SX_TRY(g_.collective([&](comm::Communicator &c) { return c.all_reduce_max(verdict, 1); }));
        if (!mine.ok()) return mine;
        SX_CHECK(verdict[0] == 0, static_cast<sx_status_t>(verdict[0]),
                 "loading %s failed on another rank (see that rank's error)", options_.path.c_str());
        return Status::Ok();
    }

    // Phase 6: the ranks agree on the values and gather the params on a thread of their
    // own (on a device: on this one, first), while this one reads the states: a rank
    // that read its values first does not wait for the others. If the load fails from
    // here on, each rank puts its values back and the params are gathered again, which
    // leaves them as the ranks' shards were: what the next step would gather.
    Status agree_on_values_while_reading_states(uint64_t state_bytes) {
        Status values_agreed, gathered;
        std::atomic<bool> abandon{false};  // another rank failed: stop reading
        const std::thread::id caller = std::this_thread::get_id();
        auto agree_and_gather = [&, values_read = local_] {
            if (std::this_thread::get_id() != caller) trace::name_this_thread("sx checkpoint load: gather");
            values_agreed = catching([&] {
                SX_TRACE_SPAN(tracer_, "ckpt", "load.agree_values");
                return agree(values_read);
            });
            if (values_agreed.ok()) {
                gathered = catching([&] { return g_.gather_params(); });
                // The params are neither old nor new: the group fails now, which also
                // fails the peers' gathers with this rank at once, and this rank stops
                // reading.
                if (!gathered.ok()) g_.fail(gathered);
            }
            if (!values_agreed.ok() || !gathered.ok()) abandon = true;
        };
        std::thread gatherer;
        if (on_host_) {
            try {
                gatherer = std::thread(agree_and_gather);
            } catch (...) {
                agree_and_gather();  // no thread to be had: the gather goes first, as on a device
            }
        } else {
            agree_and_gather();
        }
        {
            SX_TRACE_SPAN(tracer_, "ckpt", "load.read_states", trace::kNoUnit, state_bytes);
            check_reads(values_reads_, reads_.size(), &abandon);
        }
        if (gatherer.joinable()) gatherer.join();
        reader_.reset();
        SX_TRY(values_agreed);
        return gathered;  // a failed gather failed the group above
    }

    // Phase 7: the ranks agree on the whole load; it commits, or every rank puts its
    // values back and gathers the params again.
    Status finish(std::string *user_blob) {
        Status verdict;
        {
            SX_TRACE_SPAN(tracer_, "ckpt", "load.agree");
            verdict = agree(local_);
        }
        if (!verdict.ok()) {
            if (!g_.check_usable().ok()) return verdict;  // the vote failed: the values only go back
            Status s = rollback_.restore();
            if (s.ok()) s = g_.gather_params();
            if (!s.ok()) g_.fail(s.prefix("restoring the params after a failed load: "));
            return verdict;
        }
        rollback_.commit();
        SX_TRACE_SPAN(tracer_, "ckpt", "load.commit");
        return commit(user_blob);
    }

    // The values and the params are in place; the staged state and the checkpoint's
    // progress replace the live ones, in one call that cannot fail half-way (a failure
    // fails the group: nothing here can be undone).
    Status commit(std::string *user_blob) {
        core::ShardRestore r;
        r.state = &ck_.spare_state_;
        r.scales = &ck_.spare_scales_;
        for (const UnitStage &us : stage_) r.slots.push_back(us.slots);
        core::ShardProgress progress;
        if (!options_.params_only) {
            progress = restored_progress();
            r.progress = &progress;
        }
        Status s = g_.restore_shard(r);
        if (!s.ok()) return g_.fail(s);
        ck_.loaded_ = true;
        if (user_blob) *user_blob = m_.user_blob;
        return Status::Ok();
    }

    // The group's progress with what the checkpoint holds in its place: each param's
    // step counts, each group's hyperparameters (its optimizer stays: it matched every
    // param the checkpoint holds), the step count and, where this group scales
    // dynamically and the checkpoint's did too (growth_interval 0 marks none), the loss
    // scale.
    core::ShardProgress restored_progress() const {
        core::ShardProgress pr = shard_.progress;
        for (size_t p = 0; p < index_.size(); ++p) {
            if (index_[p] < 0) continue;
            const ParamEntry &e = m_.params[index_[p]];
            pr.params[p] = {e.step, e.momentum_steps, e.mu_product, e.row_var, e.col_var};
        }
        for (size_t i = 0; i < m_.param_groups.size() && i < pr.hypers.size(); ++i) {
            const optim::Kind kind = pr.hypers[i].kind;
            // How the group keeps its values stays (its units were laid out for it): the
            // checkpoint's fp32 values become its masters, or are rounded to nearest into
            // its bf16 params where it keeps none (bf16_stochastic_round).
            const bool stochastic_round = pr.hypers[i].bf16_stochastic_round;
            pr.hypers[i] = hyper_of(m_.param_groups[i]);
            pr.hypers[i].kind = kind;
            pr.hypers[i].bf16_stochastic_round = stochastic_round;
            if (i < pr.group_steps.size()) pr.group_steps[i] = m_.param_groups[i].steps;
        }
        pr.steps_taken = m_.step;
        if (g_.loss_scaling().mode == SX_LOSS_SCALING_DYNAMIC && m_.loss_scaler.growth_interval > 0) {
            pr.scaler.scale = m_.loss_scaler.scale;
            pr.scaler.growth_tracker = m_.loss_scaler.growth_tracker;
        }
        return pr;
    }

    Checkpointer &ck_;
    core::ShardAccess &g_;
    core::DeviceOps &dev_;
    const LoadOptions &options_;
    const bool on_host_;
    const bool keep_spares_;
    trace::Tracer *const tracer_;                  // null: no timeline
    std::unique_ptr<ProgressLog> progress_;        // from the end of the plan
    core::ShardState shard_;                       // the group's, at the start
    Manifest m_;
    std::vector<int32_t> index_;                   // per param: its entry in m_, or -1
    std::vector<PieceCut> cuts_;                   // per param: where its piece lies in its entry's tensor
    std::vector<std::vector<TensorKind>> want_;    // per param: the kinds to read, in slot order
    std::vector<int> slots_;                       // per unit: the state slots to read
    std::vector<ReadOp> reads_;                    // values first
    size_t values_reads_ = 0;                      // reads_[0, values_reads_) read values
    std::vector<UnitStage> stage_;                 // per unit
    std::vector<const core::StatePiece *> piece_of_;  // per param: its piece of a packed unit's state
    Status local_;                                 // this rank's vote
    ValuesRollback rollback_;                      // destroyed after the reader
    std::unique_ptr<ChunkReader> reader_;          // its threads write into stage_ and rollback_
};

Status Checkpointer::load(const LoadOptions &options, std::string *user_blob) {
    SX_TRY(group_->check_usable());
    SX_TRY(group_->check_finalized());
    // A save in flight reads the shard (and owns staging) until it completes.
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    Load load(*this, options);
    return load.run(user_blob);
}

}  // namespace ckpt
}  // namespace sx
