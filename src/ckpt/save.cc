// Saving: snapshot into staging, then persist and commit (see checkpointer.h).
#include <algorithm>
#include <thread>
#include <chrono>
#include <cstring>

#include "base/log.h"
#include "ckpt/checkpointer.h"
#include "ckpt/directory.h"
#include "ckpt/progress.h"
#include "ckpt/shard_index.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace {

std::string encode_status(const Status &s) {
    std::string out(sizeof(int32_t), '\0');
    const int32_t code = s.code();
    std::memcpy(&out[0], &code, sizeof code);
    return out + s.message();
}

Status decode_status(const std::string &v, const char *who) {
    if (v.size() < sizeof(int32_t)) return SX_ERROR(SX_ERR_INTERNAL, "%s sent a malformed status", who);
    int32_t code;
    std::memcpy(&code, v.data(), sizeof code);
    if (code == SX_OK) return Status::Ok();
    return SX_ERROR(code, "%s: %s", who, v.c_str() + sizeof code);
}

void split_path(const std::string &path, std::string *parent, std::string *base) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    *parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
    *base = slash == std::string::npos ? p : p.substr(slash + 1);
}

// A save's final name may be none of the names sx gives other things in the parent: the
// pointer to the newest checkpoint and its temporary copy, or a directory that the next
// save removes as a crashed save's leftover.
Status check_save_name(const std::string &path) {
    std::string parent, base;
    split_path(path, &parent, &base);
    SX_CHECK_ARG(!base.empty() && base != "/" && base != "." && base != "..",
                 "the checkpoint path '%s' names no directory of its own", path.c_str());
    return check_checkpoint_name(path, "a save");
}

// The save creates the checkpoint directory, never its parent: a parent that is missing
// (or not a directory) fails the call itself, naming it, rather than the save in the
// background, where the first thing to fail would be listing it.
Status check_save_parent(io::FileOps &ops, const std::string &path) {
    std::string parent, base;
    split_path(path, &parent, &base);
    bool is_dir = false;
    SX_TRY(ops.is_directory(parent, &is_dir));
    if (is_dir) return Status::Ok();
    bool exists = false;
    SX_TRY(ops.exists(parent, &exists));
    SX_CHECK_ARG(!exists, "the checkpoint path '%s': its parent '%s' is not a directory", path.c_str(),
                 parent.c_str());
    return SX_ERROR(SX_ERR_NOT_FOUND,
                    "the checkpoint path '%s': its parent directory '%s' does not exist (a save creates only "
                    "the checkpoint's own directory: create its parent first)",
                    path.c_str(), parent.c_str());
}

// Removes the checkpoint parent/name so that no directory holding a MANIFEST is ever
// incomplete, whenever the process stops: the directory is renamed out of the way first
// (to name.sx-partial, what a save that never committed is called, and what the next
// save in `parent` removes), then its MANIFEST is removed and that made durable, and only
// then the rest.
// The directory stays locked throughout (the lock follows it through the rename), so
// that another process's save sees the removal as live; one that another process is
// removing already is left to it.
Status remove_checkpoint(io::FileOps &ops, const std::string &parent, const std::string &name) {
    const std::string dir = parent + "/" + name, doomed = dir + kPartialSuffix;
    DirectoryLock lock;
    bool busy = false;
    const Status locked = lock.acquire(ops, dir, &busy);
    if (locked.code() == SX_ERR_NOT_FOUND || busy) return Status::Ok();
    SX_TRY(locked);
    SX_TRY(clear_unfinished(ops, doomed));
    SX_TRY(ops.rename(dir, doomed));
    SX_TRY(ops.fsync_dir(parent));
    SX_TRY(ops.unlink(doomed + "/" + kManifestName));
    SX_TRY(ops.fsync_dir(doomed));
    return ops.remove_tree(doomed);
}

// Keeps the newest `keep` checkpoints (by step, then creation time) among the
// directories of `parent` that hold a MANIFEST; `current` is never removed.
Status apply_retention(io::FileOps &ops, const std::string &parent, const std::string &current, int keep) {
    struct Entry {
        uint64_t step, created;
        std::string name;
    };
    std::vector<Entry> found;
    std::vector<std::string> names;
    SX_TRY(ops.list_dir(parent, &names));
    for (const std::string &name : names) {
        if (is_partial_name(name)) continue;  // the next save's to clear
        bool has = false;
        const std::string manifest = parent + "/" + name + "/" + kManifestName;
        if (!ops.exists(manifest, &has).ok() || !has) continue;
        Manifest m;
        // A directory whose manifest does not verify is not ours to judge: leave it.
        if (!read_manifest(ops, parent + "/" + name, &m).ok()) continue;
        found.push_back({m.step, m.created_unix_ms, name});
    }
    std::sort(found.begin(), found.end(), [](const Entry &a, const Entry &b) {
        return a.step != b.step ? a.step > b.step : a.created > b.created;
    });
    for (size_t i = static_cast<size_t>(keep); i < found.size(); ++i)
        if (found[i].name != current) SX_TRY(remove_checkpoint(ops, parent, found[i].name));
    return Status::Ok();
}

// How each param keeps its state slots (SX_STATE_*, core::param_state_dtype) under the
// hyperparameters `hypers` (per param group).
std::vector<int32_t> state_dtypes_of(const core::ShardAccess &g, const std::vector<optim::Hyper> &hypers) {
    std::vector<int32_t> out(static_cast<size_t>(g.num_params()));
    for (int32_t p = 0; p < g.num_params(); ++p)
        out[p] = optim::param_state_dtype(static_cast<int32_t>(hypers[g.param(p).group].state_dtype), g.param(p).numel);
    return out;
}

// Where chunk c's bytes are in the group's memory: the values, a state slot (fp32 at its
// shard offset, or a packed unit's piece of the param) or a slot's scales.
const void *source_of(const core::UnitShard &v, const WriteChunk &c) {
    if (c.slot < 0) return v.values + c.shard_offset;
    if (v.pieces.empty()) return v.state[c.slot] + c.shard_offset;
    const core::StatePiece *piece = core::find_state_piece(v.pieces, c.param);
    if (is_scales(c.kind)) return v.scales[c.slot] + piece->scale_offset + c.piece_offset;
    return reinterpret_cast<const char *>(v.state[c.slot]) + piece->byte_offset + c.piece_offset * dtype_bytes(c.dtype);
}

// The manifest of a save but for its files and their indexes.
Manifest skeleton_of(const core::ShardAccess &g, const core::ShardState &shard,
                     const std::vector<std::vector<TensorKind>> &kinds, const std::vector<int32_t> &state_dtypes,
                     const SaveOptions &options) {
    Manifest m;
    m.library_version = SX_VERSION_NUMBER;
    m.step = shard.progress.steps_taken;
    m.world_size = g.world_size();
    m.shard_size = g.shard_size();
    m.stage = g.stage();
    m.alignment = g.alignment();
    m.user_blob = options.user_blob;
    m.created_unix_ms = now_unix_ms();
    const core::LossScaling &ls = g.loss_scaling();
    if (ls.mode != SX_LOSS_SCALING_NONE) {
        m.loss_scaler.scale = shard.progress.scaler.scale;
        m.loss_scaler.growth_tracker = shard.progress.scaler.growth_tracker;
        m.loss_scaler.growth_interval = ls.growth_interval;
        m.loss_scaler.growth_factor = ls.growth_factor;
        m.loss_scaler.backoff_factor = ls.backoff_factor;
    }
    for (size_t i = 0; i < shard.progress.hypers.size(); ++i) {
        m.param_groups.push_back(param_group_entry(shard.progress.hypers[i]));
        if (i < shard.progress.group_steps.size()) m.param_groups.back().steps = shard.progress.group_steps[i];
    }
    for (int32_t p = 0; p < g.num_params(); ++p) {
        const core::ParamSpec &spec = g.param(p);
        ParamEntry e;
        e.name = spec.name;
        e.shape = spec.shape;
        e.dtype = spec.dtype;
        e.unit = spec.unit;
        e.param_group = spec.group;
        e.trainable = shard.trainable[p] != 0;
        e.step = shard.progress.params[p].step;
        e.momentum_steps = shard.progress.params[p].momentum_steps;
        e.mu_product = shard.progress.params[p].mu_product;
        e.row_var = shard.progress.params[p].row_var;
        e.col_var = shard.progress.params[p].col_var;
        e.placement = spec.placement.kind;
        e.split_dim = spec.placement.split_dim;
        e.global_shape = spec.placement.global_shape;
        e.split_offset = spec.placement.offset;
        e.replica = spec.placement.replica;
        e.replicas = spec.placement.replicas;
        const core::ParamPlacement &at = g.layout().placement(p);
        e.unit_offset = at.offset;
        e.unit_shard_numel = g.layout().units()[at.unit_index].shard_numel;
        for (TensorKind k : kinds[p]) {
            Tensor t;
            t.kind = k;
            if (k != TensorKind::kParam) t.dtype = state_tensor_dtype(state_dtypes[p]);
            e.tensors.push_back(t);
        }
        for (size_t k = 1; k < kinds[p].size() && state_dtypes[p] == SX_STATE_8BIT; ++k) {
            Tensor t;
            t.kind = scales_kind(static_cast<int>(k) - 1);
            e.tensors.push_back(t);
        }
        m.params.push_back(std::move(e));
    }
    return m;
}


// Where a save writes: its final directory, and the temporary one renamed into it.
struct SavePaths {
    std::string parent, base, final_dir, tmp_dir;
    explicit SavePaths(const std::string &path) {
        split_path(path, &parent, &base);
        final_dir = parent + "/" + base;
        tmp_dir = final_dir + kPartialSuffix;
    }
};

// What a save's waits on its peers (through the rendezvous store) watch besides their
// key: the future's cancellation and sx_abort, each noticed within one slice of the wait.
struct SaveWatch {
    const SaveFuture *future;  // null: a synchronous save
    const core::ShardAccess *group;
    Millis timeout;  // of each wait as a whole
};

constexpr Millis kWaitSlice(50);

// Why the save stops now (cancelled, or the group aborted), or ok.
Status stopped(const SaveWatch &w, const char *doing) {
    if (w.future && w.future->cancel_requested())
        return SX_ERROR(SX_ERR_CANCELLED, "the save was cancelled while %s", doing);
    if (w.group->aborted()) return SX_ERROR(SX_ERR_ABORTED, "the save was stopped by sx_abort() while %s", doing);
    return Status::Ok();
}

// store.get(key) within w.timeout, in slices, so that a cancellation or an abort ends
// the wait at once; `who` is whom the key comes from, for the errors.
Status await_key(rdzv::Store &store, const std::string &key, std::string *value, const SaveWatch &w,
                 const char *who) {
    const std::string doing = format("waiting for %s", who);
    const auto deadline = std::chrono::steady_clock::now() + w.timeout;
    for (;;) {
        SX_TRY(stopped(w, doing.c_str()));
        const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return SX_ERROR(SX_ERR_TIMEOUT, "%s did not answer within the group's timeout (%lld ms; rendezvous key '%s')",
                            who, static_cast<long long>(w.timeout.count()), key.c_str());
        Status s = store.get(key, value, std::min(left, kWaitSlice));
        if (s.code() != SX_ERR_TIMEOUT) return s;
    }
}

// Step 1 of persist: rank 0 prepares the temporary directory (clearing leftovers of
// crashed saves, never a live one's) and tells the others how that went; it holds `lock`
// on the directory until persist returns.
Status open_save(io::FileOps &ops, rdzv::Store &store, const std::string &prefix, const SavePaths &at, int rank,
                 const SaveWatch &watch, DirectoryLock *lock) {
    if (rank != 0) {
        std::string v;
        SX_TRY(await_key(store, prefix + "start", &v, watch, "rank 0 to open the save"));
        return decode_status(v, "rank 0");
    }
    Status st = [&]() -> Status {
        bool exists = false;
        SX_TRY(ops.exists(at.final_dir, &exists));
        SX_CHECK(!exists, SX_ERR_ALREADY_EXISTS, "the checkpoint directory %s already exists", at.final_dir.c_str());
        std::vector<std::string> names;
        SX_TRY(ops.list_dir(at.parent, &names));
        for (const std::string &name : names) {
            if (is_partial_name(name)) SX_TRY(clear_unfinished(ops, at.parent + "/" + name));
            if (is_latest_temporary_name(name)) SX_TRY(clear_stale_temporary(ops, at.parent + "/" + name));
        }
        return make_unfinished_directory(ops, at.final_dir, at.tmp_dir, lock);
    }();
    SX_TRY(store.set(prefix + "start", encode_status(st)));
    return st;
}

// Step 2: writes this rank's shard file from staging (`data`), each piece once `staged`
// says it is there, then its index (its chunks with their CRCs), and fsyncs it.
Status write_shard(io::FileOps &ops, const Snapshot &snap, const char *data, const std::string &file,
                   SaveFuture *progress, const SaveWatch &watch, ProgressLog *progress_log, StagedBytes *staged,
                   FileIndex *index, trace::Tracer *tracer) {
    SX_TRACE_SPAN(tracer, "ckpt", "save.write", trace::kNoUnit, snap.plan.file_bytes, file.c_str());
    int fd = -1;
    SX_TRY(ops.open_write(file, &fd));
    // In pieces, so that progress moves and a cancellation is noticed. The kernel is
    // asked to start writing each piece back at once: otherwise nothing reaches the
    // device before the fsync (a shard is far below the dirty-page thresholds), and
    // copying into the page cache, the CRCs and the device's work run one after the
    // other instead of together.
    const uint64_t piece = 64ull << 20;
    Status w;
    for (uint64_t off = 0; off < snap.plan.file_bytes && w.ok(); off += piece) {
        w = stopped(watch, "writing its shard file");
        if (!w.ok()) break;
        const uint64_t n = std::min(piece, snap.plan.file_bytes - off);
        w = staged->wait(off + n);
        if (w.ok()) w = ops.pwrite_all(fd, data + off, n, off, file);
        if (w.ok()) ops.start_writeback(fd, off, n);
        if (w.ok() && progress) progress->add_done(n);
        if (w.ok()) progress_log->add(n);
    }
    // The CRCs read staging, not the file: computed while the device writes, before
    // the fsync, they cost the save no time of their own.
    std::vector<IndexRecord> records;
    records.reserve(snap.plan.chunks.size());
    for (size_t i = 0; w.ok() && i < snap.plan.chunks.size(); ++i) {
        const WriteChunk &ch = snap.plan.chunks[i];
        IndexRecord r;
        r.param = ch.param;
        r.kind = static_cast<int32_t>(ch.kind);
        r.begin = ch.begin;
        r.end = ch.end;
        r.offset = ch.file_offset;
        r.length = ch.bytes;
        r.crc32c = io::crc32c(data + ch.file_offset, r.length);
        records.push_back(r);
    }
    if (w.ok()) w = append_index(ops, fd, file, snap.plan.file_bytes, records, index);
    if (w.ok()) w = ops.fsync(fd, file);
    Status c = ops.close(fd, file);
    SX_TRY(w);
    return c;
}

// What a rank tells rank 0 after step 2: its status, and on success where its file's
// index is (a rank that wrote no file: nothing more).
std::string encode_report(const Status &st, const FileIndex *index) {
    std::string report = encode_status(st);
    if (!st.ok()) return report;
    std::string payload(index ? sizeof *index : 0, '\0');
    if (index) std::memcpy(&payload[0], index, sizeof *index);
    return report + '\0' + payload;
}

// Step 3, on rank 0: every rank's report; the writers' (ranks [0, shard_size), which
// wrote file r) file names and indexes go into *m.
Status gather_file_indexes(rdzv::Store &store, const std::string &prefix, int world_size, int shard_size,
                           const SaveWatch &watch, Manifest *m) {
    for (int r = 0; r < world_size; ++r) {
        std::string v;
        const std::string who = format("rank %d", r);
        SX_TRY(await_key(store, prefix + format("rank/%d", r), &v, watch, (who + "'s report").c_str()));
        SX_TRY(decode_status(v, who.c_str()));
        const size_t head = sizeof(int32_t) + std::strlen(v.c_str() + sizeof(int32_t)) + 1;
        const size_t expected = r < shard_size ? sizeof(FileIndex) : 0;
        SX_CHECK(head <= v.size() && v.size() - head == expected, SX_ERR_INTERNAL,
                 "rank %d sent a malformed report (%zu bytes after its status; %zu expected)", r,
                 v.size() - std::min(head, v.size()), expected);
        if (r >= shard_size) continue;
        FileIndex index;
        std::memcpy(&index, v.data() + head, sizeof index);
        // A writer's report is read once, here: erased, so that the rendezvous store,
        // which caps what it holds, does not keep every save's.
        SX_TRY(store.erase(prefix + format("rank/%d", r)));
        m->files.push_back(shard_file_name(r, shard_size));
        m->file_indexes.push_back(index);
    }
    return Status::Ok();
}

// Every file the writers reported is in the directory rank 0 commits. A rank that was
// given another path wrote its file elsewhere and reported success: committing then
// would make a checkpoint that lacks its shard.
Status check_files_present(io::FileOps &ops, const std::string &dir, const Manifest &m) {
    std::vector<std::string> names;
    SX_TRY(ops.list_dir(dir, &names));
    std::sort(names.begin(), names.end());
    for (size_t r = 0; r < m.files.size(); ++r)
        SX_CHECK(std::binary_search(names.begin(), names.end(), m.files[r]), SX_ERR_MISMATCH,
                 "rank %zu wrote its shard file %s, but not into %s: every rank must pass the same checkpoint "
                 "path, on a file system they share",
                 r, m.files[r].c_str(), dir.c_str());
    return Status::Ok();
}

// The commit, on rank 0: MANIFEST written and fsynced into the complete temporary
// directory, which is fsynced and renamed into place, and the parent fsynced; only then,
// with the checkpoint durable, does `latest` move, and retention run.
Status commit_directory(io::FileOps &ops, const Manifest &m, const SavePaths &at, int keep_last) {
    SX_TRY(commit_checkpoint(ops, m, at.tmp_dir, at.final_dir, at.parent));
    const std::string latest = at.base + "\n";
    SX_TRY(io::write_file_atomic(ops, at.parent, kLatestName, latest.data(), latest.size()));
    if (keep_last > 0) SX_TRY(apply_retention(ops, at.parent, at.base, keep_last));
    return Status::Ok();
}

}  // namespace

Checkpointer::Checkpointer(core::ShardAccess *group, std::shared_ptr<io::FileOps> ops)
    : group_(group), ops_(std::move(ops)) {}

uint64_t Checkpointer::staging_bytes() const {
    uint64_t bytes = staging_.size();
    for (const auto &slots : spare_state_)
        for (const core::Buffer &b : slots) bytes += b.size();
    for (const auto &slots : spare_scales_)
        for (const core::Buffer &b : slots) bytes += b.size();
    return bytes;
}

Status Checkpointer::reserve_staging() {
    core::ShardAccess &g = *group_;
    SX_TRY(g.check_usable());
    SX_TRY(g.check_finalized());
    // The threads that persist asynchronous saves, started as the first save would start
    // them.
    if (!loop_) SX_TRY(io::IoLoop::create(&loop_));
    if (g.replica_rank() != 0) return Status::Ok();
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    std::vector<std::vector<TensorKind>> kinds(static_cast<size_t>(g.num_params()));
    std::vector<optim::Hyper> hypers;
    for (int32_t p = 0; p < g.num_params(); ++p)
        kinds[p] = stored_kinds(g.hyper(g.param(p).group), static_cast<int>(g.param(p).shape.size()));
    for (int32_t p = 0; p < g.num_params(); ++p) {
        const int32_t group = g.param(p).group;
        if (static_cast<size_t>(group) >= hypers.size()) hypers.resize(static_cast<size_t>(group) + 1);
        hypers[group] = g.hyper(group);
    }
    return grow_staging(plan_write(g.layout(), g.shard_rank(), kinds, state_dtypes_of(g, hypers)).file_bytes,
                        HostBuffer::kPopulate);
}

Status Checkpointer::grow_staging(uint64_t bytes, HostBuffer::Populate populate) {
    if (staging_.size() >= bytes) return Status::Ok();
    HostBuffer bigger;
    SX_TRY(bigger.allocate(bytes, "checkpoint staging", populate));
    staging_ = std::move(bigger);
    return Status::Ok();
}

Status Checkpointer::snapshot(const SaveOptions &options, Snapshot *out) {
    core::ShardAccess &g = *group_;
    SX_TRY(g.check_usable());
    SX_TRY(g.check_finalized());
    SX_TRACE_SPAN(g.tracer(), "ckpt", "save.snapshot", trace::kNoUnit, trace::kNoBytes, options.path.c_str());
    // This rank's verdict on its arguments goes into the call's header with its path, so
    // that a rank that refuses the call, or saves elsewhere, fails every rank at once.
    const Status local = [&]() -> Status {
        SX_CHECK_ARG(!options.path.empty(), "the checkpoint path is empty");
        SX_TRY(check_save_name(options.path));
        SX_TRY(check_save_parent(*ops_, options.path));
        SX_CHECK_ARG(options.user_blob.size() <= kMaxUserBlobBytes, "the user blob has %zu bytes; at most %llu",
                     options.user_blob.size(), static_cast<unsigned long long>(kMaxUserBlobBytes));
        SX_CHECK_ARG(options.keep_last >= 0, "keep_last is %d; it must be >= 0", options.keep_last);
        for (int32_t p = 0; p < g.num_params(); ++p) SX_TRY(check_storable(g.hyper(g.param(p).group)));
        return Status::Ok();
    }();
    SX_TRY(g.agree_call("sx_save_optim_state", {{"the checkpoint path", options.path}}, local));
    // The trainer's writes into the views first; 16-bit params: their fp32 masters are
    // what is stored.
    core::ShardState shard;
    SX_TRY(g.export_shard(&shard));

    const core::Layout &layout = g.layout();
    const int32_t np = g.num_params();
    std::vector<std::vector<TensorKind>> kinds(np);
    for (int32_t p = 0; p < np; ++p) {
        const int u = layout.placement(p).unit_index;
        std::vector<TensorKind> k =
            stored_kinds(shard.progress.hypers[g.param(p).group], static_cast<int>(g.param(p).shape.size()));
        // State exists only once the unit has been trainable; before that only values.
        k.resize(std::min(k.size(), static_cast<size_t>(shard.units[u].state_slots) + 1));
        kinds[p] = std::move(k);
    }
    Snapshot s;
    s.rank = g.rank();
    s.world_size = g.world_size();
    s.shard_rank = g.shard_rank();
    s.shard_size = g.shard_size();
    s.writer = g.replica_rank() == 0;
    const std::vector<int32_t> state_dtypes = state_dtypes_of(g, shard.progress.hypers);
    if (s.writer) s.plan = plan_write(layout, s.shard_rank, kinds, state_dtypes);
    s.options = options;

    // Staging: allocated once, grown when needed, pre-faulted (HostBuffer populates it).
    // A load's spare state buffers go first (see spare_state_).
    spare_state_.clear();
    spare_scales_.clear();
    SX_TRY(grow_staging(s.plan.file_bytes, HostBuffer::kPopulate));
    s.sources.reserve(s.plan.chunks.size());
    for (const WriteChunk &c : s.plan.chunks) s.sources.push_back(source_of(shard.units[c.unit_index], c));
    s.skeleton = skeleton_of(g, shard, kinds, state_dtypes, options);
    s.sequence = shard.sequence;
    s.hold.reset(new core::ShardFence::Hold(g.shard_fence()));
    *out = std::move(s);
    return Status::Ok();
}

void StagedBytes::advance(uint64_t end) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        end_ = end;
    }
    cv_.notify_all();
}

void StagedBytes::finish(const Status &s) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        finished_ = true;
        status_ = s;
    }
    cv_.notify_all();
}

Status StagedBytes::wait(uint64_t end) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return end_ >= end || finished_; });
    if (end_ >= end) return Status::Ok();
    return status_.ok() ? SX_ERROR(SX_ERR_INTERNAL, "checkpoint staging ended at byte %llu of %llu",
                                   static_cast<unsigned long long>(end_), static_cast<unsigned long long>(end))
                        : status_;
}

Status Checkpointer::stage(Snapshot *snap, StagedBytes *staged) {
    core::DeviceOps &dev = group_->state_ops();  // where the values and the state live
    char *dst = static_cast<char *>(staging_.data());
    SX_TRACE_SPAN(group_->tracer(), "ckpt", "save.stage", trace::kNoUnit, snap->plan.file_bytes);
    // Whatever happens (an exception too), `staged` hears how it ended: persist() waits on it.
    const Status s = catching([&]() -> Status {
        uint64_t cursor = 0;
        for (size_t i = 0; i < snap->plan.chunks.size(); ++i) {
            const WriteChunk &c = snap->plan.chunks[i];
            // Alignment gaps are zeroed: staging is reused, and its bytes all reach the file.
            if (c.file_offset > cursor) std::memset(dst + cursor, 0, c.file_offset - cursor);
            const uint64_t bytes = c.bytes;
            Status st = dev.to_host(dst + c.file_offset, snap->sources[i], bytes);
            if (!st.ok()) return st.prefix("checkpoint staging: ");
            cursor = c.file_offset + bytes;
            staged->advance(cursor);
        }
        if (snap->plan.file_bytes > cursor) std::memset(dst + cursor, 0, snap->plan.file_bytes - cursor);
        return Status::Ok();
    });
    snap->hold.reset();
    if (s.ok()) staged->advance(snap->plan.file_bytes);
    staged->finish(s);
    return s;
}

Status Checkpointer::stage_and_persist(Snapshot *snap, SaveFuture *future) {
    StagedBytes staged;
    const std::thread::id caller = std::this_thread::get_id();
    auto stage_all = [&] {
        if (std::this_thread::get_id() != caller) trace::name_this_thread("sx checkpoint stager");
        stage(snap, &staged);
        if (future) future->set_staged();
    };
    std::thread stager;
    try {
        stager = std::thread(stage_all);
    } catch (...) {
        stage_all();  // no thread to be had: the file is written after the whole copy
    }
    // Caught here, so that the stager is joined whatever persist() does.
    const Status s = catching([&] { return persist(*snap, future, &staged); });
    if (stager.joinable()) stager.join();
    return s;
}

Status Checkpointer::persist(const Snapshot &snap, SaveFuture *progress, StagedBytes *staged) {
    io::FileOps &ops = *ops_;
    rdzv::Store &store = group_->store();
    const Millis timeout(group_->timeout_ms());
    const std::string prefix = format("ckpt/%llu/", static_cast<unsigned long long>(snap.sequence));
    const SavePaths at(snap.options.path);
    if (progress) progress->set_total(snap.plan.file_bytes);
    trace::Tracer *tracer = group_->tracer();
    SX_TRACE_SPAN(tracer, "ckpt", "save.persist", trace::kNoUnit, snap.plan.file_bytes, snap.options.path.c_str());
    ProgressLog progress_log("saving", at.final_dir, snap.rank, snap.plan.file_bytes,
                             format("step %llu, %s", static_cast<unsigned long long>(snap.skeleton.step),
                                    snap.writer ? format("shard file %d of %d", snap.shard_rank, snap.shard_size).c_str()
                                                : "a replica: no file of its own"));

    const SaveWatch watch{progress, group_, timeout};
    Status opened;
    DirectoryLock lock;  // rank 0's, on the save's directory
    {
        // Rank 0 clears what crashed saves left and makes the directory; the others wait for it.
        SX_TRACE_SPAN(tracer, "ckpt", "save.open");
        opened = open_save(ops, store, prefix, at, snap.rank, watch, &lock);
    }
    FileIndex index;
    Status written = opened;
    if (opened.ok() && snap.writer) {
        const std::string file = at.tmp_dir + "/" + shard_file_name(snap.shard_rank, snap.shard_size);
        written = write_shard(ops, snap, static_cast<const char *>(staging_.data()), file, progress, watch,
                              &progress_log, staged, &index, tracer);
    }
    // Every rank reports, also one stopped while it waited for rank 0 to open the save
    // (rank 0 may have gone on), so that rank 0 does not wait for it. A failure to open
    // otherwise is rank 0's, which every rank has heard of already.
    const bool stopped_early = opened.code() == SX_ERR_CANCELLED || opened.code() == SX_ERR_ABORTED;
    if (!opened.ok() && !stopped_early) return opened;
    SX_TRY(store.set(prefix + format("rank/%d", snap.rank), encode_report(written, snap.writer ? &index : nullptr)));

    // Rank 0 gathers every rank's file index, writes MANIFEST and commits; the others
    // wait for its word.
    if (snap.rank != 0) {
        SX_TRY(written);
        std::string v;
        {
            SX_TRACE_SPAN(tracer, "ckpt", "save.wait_commit");
            SX_TRY(await_key(store, prefix + "result", &v, watch, "rank 0 to commit the save"));
        }
        SX_TRY(decode_status(v, "rank 0"));
        progress_log.finish("committed by rank 0");
        return Status::Ok();
    }
    Status result = [&]() -> Status {
        SX_TRACE_SPAN(tracer, "ckpt", "save.commit");
        Manifest m = snap.skeleton;
        SX_TRY(written);
        SX_TRY(gather_file_indexes(store, prefix, snap.world_size, snap.shard_size, watch, &m));
        SX_TRY(check_files_present(ops, at.tmp_dir, m));
        return commit_directory(ops, m, at, snap.options.keep_last);
    }();
    if (!result.ok()) {
        bool exists = false;
        if (ops.exists(at.tmp_dir, &exists).ok() && exists) ops.remove_tree(at.tmp_dir);
        log(SX_LOG_ERROR, "sx: checkpoint %s failed: %s", at.final_dir.c_str(), result.message().c_str());
    }
    SX_TRY(store.set(prefix + "result", encode_status(result)));
    if (result.ok()) progress_log.finish(format("committed: MANIFEST written, %s moved", kLatestName).c_str());
    return result;
}

Checkpointer::~Checkpointer() {
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    loop_.reset();
}

Status Checkpointer::save(const SaveOptions &options) {
    Status outcome;
    SX_TRY(save_checked(options, &outcome));
    return outcome;
}

Status Checkpointer::save_checked(const SaveOptions &options, Status *outcome) {
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    Snapshot snap;
    SX_TRY(snapshot(options, &snap));
    *outcome = stage_and_persist(&snap, nullptr);
    return Status::Ok();
}

Status Checkpointer::save_async(const SaveOptions &options, SaveFuture::Callback callback,
                                std::shared_ptr<SaveFuture> *out) {
    if (!loop_) SX_TRY(io::IoLoop::create(&loop_));
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    auto snap = std::make_shared<Snapshot>();
    SX_TRY(snapshot(options, snap.get()));
    auto future = std::make_shared<SaveFuture>(std::move(callback));
    future->set_total(snap->plan.file_bytes);
    in_flight_ = future;
    loop_->submit(
        [this, snap, future] {
            trace::name_this_thread("sx checkpoint I/O");
            return stage_and_persist(snap.get(), future.get());
        },
                  [future](Status s) { future->complete(s); });
    *out = future;
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
