// Saving: snapshot into staging, then persist and commit (see checkpointer.h).
#include <algorithm>
#include <thread>
#include <chrono>
#include <cstring>

#include "base/log.h"
#include "ckpt/checkpointer.h"
#include "ckpt/directory.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace {

// What a rank tells rank 0 through the store: its status, then its chunks.
struct ChunkRecord {
    int32_t param;
    int32_t kind;
    uint64_t begin, end, offset, length;
    uint32_t crc32c;
    uint32_t pad;
};

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

uint64_t now_unix_ms() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
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
        if (found[i].name != current) SX_TRY(ops.remove_tree(parent + "/" + found[i].name));
    return Status::Ok();
}

// The manifest of a save but for its files and chunks (the tensors' kinds only).
Manifest skeleton_of(const core::ShardGroup &g, const core::ShardState &shard,
                     const std::vector<std::vector<TensorKind>> &kinds, const SaveOptions &options) {
    Manifest m;
    m.library_version = SX_VERSION_NUMBER;
    m.step = shard.progress.steps_taken;
    m.world_size = g.world_size();
    m.shard_size = g.shard_size();
    m.stage = g.stage();
    m.alignment = g.config().alignment;
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
    for (const optim::Hyper &h : shard.progress.hypers) m.param_groups.push_back(param_group_entry(h));
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
        for (TensorKind k : kinds[p]) {
            Tensor t;
            t.kind = k;
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

// Step 1 of persist: rank 0 prepares the temporary directory (clearing leftovers of
// crashed saves) and tells the others how that went.
Status open_save(io::FileOps &ops, comm::Store &store, const std::string &prefix, const SavePaths &at, int rank,
                 comm::Millis timeout) {
    if (rank != 0) {
        std::string v;
        SX_TRY(store.get(prefix + "start", &v, timeout));
        return decode_status(v, "rank 0");
    }
    Status st = [&]() -> Status {
        bool exists = false;
        SX_TRY(ops.exists(at.final_dir, &exists));
        SX_CHECK(!exists, SX_ERR_ALREADY_EXISTS, "the checkpoint directory %s already exists", at.final_dir.c_str());
        std::vector<std::string> names;
        SX_TRY(ops.list_dir(at.parent, &names));
        const size_t n = std::strlen(kPartialSuffix);
        for (const std::string &name : names)
            if (name.size() > n && name.compare(name.size() - n, n, kPartialSuffix) == 0)
                SX_TRY(ops.remove_tree(at.parent + "/" + name));
        return ops.mkdir(at.tmp_dir);
    }();
    SX_TRY(store.set(prefix + "start", encode_status(st)));
    return st;
}

// Step 2: writes and fsyncs this rank's shard file from staging (`data`), each piece
// once `staged` says it is there, and lists its chunks with their CRCs.
Status write_shard(io::FileOps &ops, const Snapshot &snap, const char *data, const std::string &file,
                   SaveFuture *progress, StagedBytes *staged, std::vector<ChunkRecord> *records) {
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
        if (progress && progress->cancel_requested()) {
            w = SX_ERROR(SX_ERR_CANCELLED, "the save was cancelled");
            break;
        }
        const uint64_t n = std::min(piece, snap.plan.file_bytes - off);
        w = staged->wait(off + n);
        if (w.ok()) w = ops.pwrite_all(fd, data + off, n, off, file);
        if (w.ok()) ops.start_writeback(fd, off, n);
        if (w.ok() && progress) progress->add_done(n);
    }
    // The CRCs read staging, not the file: computed while the device writes, before
    // the fsync, they cost the save no time of their own.
    for (size_t i = 0; w.ok() && i < snap.plan.chunks.size(); ++i) {
        const WriteChunk &ch = snap.plan.chunks[i];
        ChunkRecord r;
        std::memset(&r, 0, sizeof r);
        r.param = ch.param;
        r.kind = static_cast<int32_t>(ch.kind);
        r.begin = ch.begin;
        r.end = ch.end;
        r.offset = ch.file_offset;
        r.length = (ch.end - ch.begin) * sizeof(float);
        r.crc32c = io::crc32c(data + ch.file_offset, r.length);
        records->push_back(r);
    }
    if (w.ok()) w = ops.fsync(fd, file);
    Status c = ops.close(fd, file);
    SX_TRY(w);
    return c;
}

// What a rank tells rank 0 after step 2: its status, and on success its chunks.
std::string encode_report(const Status &st, const std::vector<ChunkRecord> &records) {
    std::string report = encode_status(st);
    if (!st.ok()) return report;
    std::string payload(records.size() * sizeof(ChunkRecord), '\0');
    if (!records.empty()) std::memcpy(&payload[0], records.data(), payload.size());
    return report + '\0' + payload;
}

// Step 3, on rank 0: every rank's report; the chunks of the writers (ranks [0,
// shard_size), which wrote file r) go into *m (whose params hold their tensors' kinds),
// each tensor's sorted by element.
Status gather_chunks(comm::Store &store, const std::string &prefix, int world_size, int shard_size,
                     comm::Millis timeout, Manifest *m) {
    for (int r = 0; r < world_size; ++r) {
        std::string v;
        SX_TRY(store.get(prefix + format("rank/%d", r), &v, timeout));
        const std::string who = format("rank %d", r);
        SX_TRY(decode_status(v, who.c_str()));
        const size_t head = sizeof(int32_t) + std::strlen(v.c_str() + sizeof(int32_t)) + 1;
        SX_CHECK(head <= v.size() && (v.size() - head) % sizeof(ChunkRecord) == 0, SX_ERR_INTERNAL,
                 "rank %d sent a malformed chunk table", r);
        if (r >= shard_size) {
            SX_CHECK(v.size() == head, SX_ERR_INTERNAL, "rank %d, not a writer, reported chunks", r);
            continue;
        }
        // A writer's report (48 bytes a chunk) is read once, here: erased, so that the
        // rendezvous store, which caps what it holds, does not keep every save's.
        SX_TRY(store.erase(prefix + format("rank/%d", r)));
        m->files.push_back(shard_file_name(r, shard_size));
        const size_t n = (v.size() - head) / sizeof(ChunkRecord);
        for (size_t i = 0; i < n; ++i) {
            ChunkRecord rec;
            std::memcpy(&rec, v.data() + head + i * sizeof rec, sizeof rec);
            SX_CHECK(rec.param >= 0 && static_cast<size_t>(rec.param) < m->params.size(), SX_ERR_INTERNAL,
                     "rank %d reported a chunk of unknown param %d", r, rec.param);
            for (Tensor &t : m->params[rec.param].tensors) {
                if (static_cast<int32_t>(t.kind) != rec.kind) continue;
                Chunk c;
                c.begin = rec.begin, c.end = rec.end, c.file = static_cast<uint32_t>(r);
                c.offset = rec.offset, c.length = rec.length, c.crc32c = rec.crc32c;
                t.chunks.push_back(c);
            }
        }
    }
    for (ParamEntry &p : m->params)
        for (Tensor &t : p.tensors)
            std::sort(t.chunks.begin(), t.chunks.end(), [](const Chunk &a, const Chunk &b) { return a.begin < b.begin; });
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

Checkpointer::Checkpointer(core::ShardGroup *group, std::shared_ptr<io::FileOps> ops)
    : group_(group), ops_(std::move(ops)) {}

uint64_t Checkpointer::staging_bytes() const {
    uint64_t bytes = staging_.size();
    for (const auto &slots : spare_state_)
        for (const core::Buffer &b : slots) bytes += b.size();
    return bytes;
}

Status Checkpointer::snapshot(const SaveOptions &options, Snapshot *out) {
    core::ShardGroup &g = *group_;
    SX_TRY(g.check_usable());
    SX_TRY(g.check_finalized());
    SX_CHECK_ARG(!options.path.empty(), "the checkpoint path is empty");
    SX_CHECK_ARG(options.user_blob.size() <= kMaxUserBlobBytes, "the user blob has %zu bytes; at most %llu",
                 options.user_blob.size(), static_cast<unsigned long long>(kMaxUserBlobBytes));
    SX_CHECK_ARG(options.keep_last >= 0, "keep_last is %d; it must be >= 0", options.keep_last);
    // The trainer's writes into the views first; 16-bit params: their fp32 masters are
    // what is stored.
    core::ShardState shard;
    SX_TRY(g.export_shard(&shard));

    const core::Layout &layout = g.layout();
    const int32_t np = g.num_params();
    std::vector<std::vector<TensorKind>> kinds(np);
    for (int32_t p = 0; p < np; ++p) {
        const int u = layout.placement(p).unit_index;
        std::vector<TensorKind> k = stored_kinds(shard.progress.hypers[g.param(p).group]);
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
    if (s.writer) s.plan = plan_write(layout, s.shard_rank, kinds);
    s.options = options;

    // Staging: allocated once, grown when needed, pre-faulted (HostBuffer populates it).
    // A load's spare state buffers go first (see spare_state_).
    spare_state_.clear();
    if (staging_.size() < s.plan.file_bytes) {
        HostBuffer bigger;
        SX_TRY(bigger.allocate(s.plan.file_bytes, "checkpoint staging"));
        staging_ = std::move(bigger);
    }
    s.sources.reserve(s.plan.chunks.size());
    for (const WriteChunk &c : s.plan.chunks) {
        const core::UnitShard &v = shard.units[c.unit_index];
        const float *src = c.slot < 0 ? v.values : v.state[c.slot];
        s.sources.push_back(src + c.shard_offset);
    }
    s.skeleton = skeleton_of(g, shard, kinds, options);
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
    core::DeviceOps &dev = group_->ops();
    char *dst = static_cast<char *>(staging_.data());
    // Whatever happens (an exception too), `staged` hears how it ended: persist() waits on it.
    const Status s = catching([&]() -> Status {
        uint64_t cursor = 0;
        for (size_t i = 0; i < snap->plan.chunks.size(); ++i) {
            const WriteChunk &c = snap->plan.chunks[i];
            // Alignment gaps are zeroed: staging is reused, and its bytes all reach the file.
            if (c.file_offset > cursor) std::memset(dst + cursor, 0, c.file_offset - cursor);
            const uint64_t bytes = (c.end - c.begin) * sizeof(float);
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
    auto stage_all = [&] {
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
    comm::Store &store = group_->store();
    const comm::Millis timeout(group_->config().timeout_ms);
    const std::string prefix = format("ckpt/%llu/", static_cast<unsigned long long>(snap.sequence));
    const SavePaths at(snap.options.path);
    if (progress) progress->set_total(snap.plan.file_bytes);

    SX_TRY(open_save(ops, store, prefix, at, snap.rank, timeout));
    std::vector<ChunkRecord> records;
    Status written;
    if (snap.writer) {
        const std::string file = at.tmp_dir + "/" + shard_file_name(snap.shard_rank, snap.shard_size);
        written = write_shard(ops, snap, static_cast<const char *>(staging_.data()), file, progress, staged, &records);
    } else {
        written = Status::Ok();  // another replica group's rank writes this shard
    }
    SX_TRY(store.set(prefix + format("rank/%d", snap.rank), encode_report(written, records)));

    // Rank 0 gathers every rank's chunks, writes MANIFEST and commits; the others wait
    // for its word.
    if (snap.rank != 0) {
        std::string v;
        SX_TRY(store.get(prefix + "result", &v, timeout));
        return decode_status(v, "rank 0");
    }
    Status result = [&]() -> Status {
        Manifest m = snap.skeleton;
        SX_TRY(gather_chunks(store, prefix, snap.world_size, snap.shard_size, timeout, &m));
        return commit_directory(ops, m, at, snap.options.keep_last);
    }();
    if (!result.ok()) {
        bool exists = false;
        if (ops.exists(at.tmp_dir, &exists).ok() && exists) ops.remove_tree(at.tmp_dir);
        log(SX_LOG_ERROR, "sx: checkpoint %s failed: %s", at.final_dir.c_str(), result.message().c_str());
    }
    SX_TRY(store.set(prefix + "result", encode_status(result)));
    return result;
}

Checkpointer::~Checkpointer() {
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    loop_.reset();
}

Status Checkpointer::save(const SaveOptions &options) {
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    Snapshot snap;
    SX_TRY(snapshot(options, &snap));
    return stage_and_persist(&snap, nullptr);
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
        [this, snap, future] { return stage_and_persist(snap.get(), future.get()); },
                  [future](Status s) { future->complete(s); });
    *out = future;
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
