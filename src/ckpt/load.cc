// Loading into any layout: verify the manifest, match params by name, read exactly the
// chunks this rank's shard needs (each verified by its CRC32C), agree that every rank
// succeeded, and only then keep the change (or put everything back).
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
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

// Reads a load's chunks: chunk i whole into the place that place(i) gives (its final
// one), or where that is null into a buffer of the reader's own, reused once the caller
// has released the chunk that used it before. Each file is read by one thread, in the
// order of the chunks, up to kMaxStreams threads (files beyond that share them): every
// file is a sequential stream with its own readahead, and a stream whose thread is late
// (copying, or waiting for a processor) leaves the device the other streams' requests.
// place(i) runs on a thread of its own, in order, ahead of the reads (it may copy aside
// what chunk i will overwrite, which then costs the reads nothing). Only buffered chunks
// wait for the caller, which waits for chunk i, checks it and releases it. Destroying
// the reader stops its threads (after the call under way) and joins them.
class ChunkReader {
  public:
    static constexpr size_t kMaxStreams = 4;
    static constexpr size_t kBuffers = 4;  // per stream
    // Sets *into to chunk i's place, or to null for a buffer; an error stops the reads.
    using Place = std::function<Status(size_t i, char **into)>;

    ChunkReader(io::FileOps &ops, const std::string &dir, const Manifest &m, const std::vector<ReadOp> &reads,
                Place place)
        : ops_(ops), dir_(dir), m_(m), reads_(reads), place_(std::move(place)), placed_(reads.size(), nullptr),
          where_(reads.size(), nullptr) {
        std::map<uint32_t, size_t> stream_of;  // file -> stream
        for (const ReadOp &r : reads) stream_of.emplace(r.chunk->file, 0);
        size_t next = 0;
        for (auto &f : stream_of) f.second = next++ % kMaxStreams;
        for (size_t k = 0; k < std::min(stream_of.size(), kMaxStreams); ++k)
            streams_.emplace_back(new Stream(ops, dir));
        for (size_t i = 0; i < reads.size(); ++i) streams_[stream_of[reads[i].chunk->file]]->chunks.push_back(i);
        try {
            placer_ = std::thread([this] { run([this] { return place_all(); }); });
            for (auto &st : streams_)
                st->thread = std::thread([this, s = st.get()] { run([this, s] { return read_stream(*s); }); });
        } catch (...) {
            stop_and_join();
            throw;
        }
    }
    ~ChunkReader() { stop_and_join(); }

    // Waits until chunk i has been read; *data is where its bytes are. The error that
    // stopped the reads before chunk i was read, if one did.
    Status wait(size_t i, const char **data) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return where_[i] != nullptr || !error_.ok(); });
        if (!where_[i]) return error_;
        *data = where_[i];
        return Status::Ok();
    }
    // The caller is done with chunks [0, i] (their buffers may be reused).
    void release(size_t i) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            released_ = i + 1;
        }
        cv_.notify_all();
    }

  private:
    struct Stream {
        Stream(io::FileOps &ops, const std::string &dir) : files(ops, dir) {}
        OpenFiles files;             // used by the stream's thread alone, closed after it ended
        std::vector<size_t> chunks;  // the chunks it reads, in order
        std::vector<char> bufs[kBuffers];
        std::thread thread;
    };

    void stop_and_join() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto &st : streams_)
            if (st->thread.joinable()) st->thread.join();
        if (placer_.joinable()) placer_.join();
    }

    // A thread's body; its error (an exception too) stops every thread.
    template <typename F>
    void run(F body) {
        const Status s = catching(body);
        if (!s.ok()) fail(s);
    }

    // The first error stops every thread.
    void fail(const Status &s) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (error_.ok()) error_ = s;
        }
        cv_.notify_all();
    }

    // The threads' bodies: an error, or ok once done or stopped.
    Status place_all() {
        for (size_t i = 0; i < reads_.size(); ++i) {
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (stop_ || !error_.ok()) return Status::Ok();
            }
            char *into = nullptr;
            SX_TRY(place_(i, &into));
            {
                std::lock_guard<std::mutex> lock(mu_);
                placed_[i] = into;
                num_placed_ = i + 1;
            }
            cv_.notify_all();
        }
        return Status::Ok();
    }

    Status read_stream(Stream &st) {
        std::array<size_t, kBuffers> user;  // the last chunk read into each buffer
        user.fill(SIZE_MAX);
        size_t buffered = 0;
        for (const size_t i : st.chunks) {
            const Chunk &c = *reads_[i].chunk;
            char *into = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return stop_ || !error_.ok() || num_placed_ > i; });
                if (stop_ || !error_.ok()) return Status::Ok();
                into = placed_[i];
                if (!into) {
                    const size_t b = buffered++ % kBuffers;
                    cv_.wait(lock, [&] {
                        return stop_ || !error_.ok() || user[b] == SIZE_MAX || released_ > user[b];
                    });
                    if (stop_ || !error_.ok()) return Status::Ok();
                    user[b] = i;
                    st.bufs[b].resize(c.length);
                    into = st.bufs[b].data();
                }
            }
            int fd = -1;
            SX_TRY(st.files.get(m_, c.file, &fd));
            SX_TRY(ops_.pread_all(fd, into, c.length, c.offset, dir_ + "/" + m_.files[c.file]));
            {
                std::lock_guard<std::mutex> lock(mu_);
                where_[i] = into;
            }
            cv_.notify_all();
        }
        return Status::Ok();
    }

    io::FileOps &ops_;
    const std::string dir_;
    const Manifest &m_;
    const std::vector<ReadOp> &reads_;
    const Place place_;
    std::vector<char *> placed_;  // chunk i's place (null: a buffer), once num_placed_ > i
    std::vector<char *> where_;   // chunk i's bytes, once read
    std::vector<std::unique_ptr<Stream>> streams_;
    std::mutex mu_;
    std::condition_variable cv_;
    size_t num_placed_ = 0;
    size_t released_ = 0;
    bool stop_ = false;
    Status error_;
    std::thread placer_;
};

// The read goes to the fp32 values (region 0), in place, rather than to a state slot.
bool reads_values(const ReadOp &op) { return op.kind == TensorKind::kParam; }

// Region of `kind` in a unit's staging: want lists a param's kinds in slot order, so
// kinds[k] lives in region k (0: values, k: state slot k - 1).
int slot_of(const std::vector<TensorKind> &kinds, TensorKind kind) {
    return static_cast<int>(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
}

// Copies the live values into every part of the staging regions that no read covers
// (params the checkpoint lacks, padding), so that staging ends up as the whole new
// shard; a state slot the unit does not have yet gets zeros, as a new slot holds.
// region(u, k) is unit u's staging region k (or the live buffer itself, left alone),
// in the group's memory.
Status fill_uncovered(core::ShardGroup &g, const std::vector<ReadOp> &ops,
                      const std::vector<std::vector<TensorKind>> &want,
                      const std::function<float *(int32_t, int)> &region) {
    // Covered intervals per (unit, region).
    std::map<std::pair<int32_t, int>, std::vector<std::pair<uint64_t, uint64_t>>> covered;
    for (const ReadOp &op : ops)
        covered[{op.unit_index, slot_of(want[op.param], op.kind)}].push_back(
            {op.shard_offset, op.shard_offset + (op.copy_end - op.copy_begin)});
    const size_t units = g.layout().units().size();
    for (size_t u = 0; u < units; ++u) {
        const core::ShardGroup::UnitView v = g.unit_view(u);
        for (int k = 0; k <= v.state_slots; ++k) {
            float *dst = region(static_cast<int32_t>(u), k);
            if (dst == nullptr) continue;
            const float *live = k == 0 ? v.values : v.state[k - 1];
            if (dst == live) continue;  // read in place: what no read covers stays as it is
            std::vector<std::pair<uint64_t, uint64_t>> &iv = covered[{static_cast<int32_t>(u), k}];
            std::sort(iv.begin(), iv.end());
            uint64_t at = 0;
            iv.push_back({v.shard_numel, v.shard_numel});
            for (const auto &r : iv) {
                const size_t bytes = (r.first - at) * sizeof(float);
                if (r.first > at && live) SX_TRY(g.ops().copy(dst + at, live + at, bytes));
                if (r.first > at && !live) SX_TRY(g.ops().zero(dst + at, bytes));
                at = std::max(at, r.second);
            }
        }
    }
    return Status::Ok();
}

}  // namespace

Status Checkpointer::load(const LoadOptions &options, std::string *user_blob) {
    core::ShardGroup &g = *group_;
    SX_TRY(g.check_usable());
    SX_CHECK(g.finalized(), SX_ERR_INVALID_STATE, "the group is not finalized yet; call sx_finalize first");
    SX_CHECK_ARG(!options.path.empty(), "the checkpoint path is empty");
    // A save in flight reads the shard (and owns staging) until it completes.
    if (in_flight_) in_flight_->wait(std::chrono::milliseconds(-1));
    SX_TRY(g.ops().wait_for(nullptr));  // a device: the trainer's writes into the views first
    SX_TRY(g.ensure_masters());         // what a 16-bit param the checkpoint lacks keeps
    core::DeviceOps &dev = g.ops();
    const bool on_host = dev.device() == SX_DEVICE_CPU;
    const core::Layout &layout = g.layout();
    const int rank = g.rank();
    const int32_t np = g.num_params();

    // Where this rank's shard of every unit is read, each region shard_numel floats.
    // The fp32 values (the params' own shard, or the masters) are read in place, each
    // range copied first into the checkpointer's staging memory (kept between saves and
    // loads), from which a failed load puts it back: those copies are made while the
    // device reads, where the commit would have had to copy after every read finished.
    // Each state slot is read into its spare buffer (spare_state_), which the commit swaps
    // with the live one (so the spare then holds the replaced state, for the next load to
    // stage into), or adds as a slot the unit did not have (a frozen unit has none): a
    // failed load leaves even the slot count as it was. Only what the checkpoint does not
    // cover is filled from the live values, so that it stays as it was.
    struct UnitStage {
        float *region[4] = {nullptr, nullptr, nullptr, nullptr};  // [0] values (live), [1..3] slots
        float *kept = nullptr;  // staging: the values as they were before the load
        int slots = 0;
    };
    // However this load ends, its spares stay only if an earlier load succeeded.
    struct KeepSpares {
        std::vector<std::array<core::Buffer, 3>> &spares;
        const bool keep;
        ~KeepSpares() {
            if (!keep) spares.clear();
        }
    } keep_spares{spare_state_, loaded_};
    std::vector<UnitStage> stage(layout.units().size());
    Manifest m;
    std::vector<int32_t> index(np, -1);
    std::vector<std::vector<TensorKind>> want(np);
    std::vector<ReadOp> ops;
    std::vector<uint8_t> kept(0);  // kept[i]: read i overwrote values, saved in staging first
    auto target = [&](const ReadOp &op) {
        return stage[op.unit_index].region[slot_of(want[op.param], op.kind)] + op.shard_offset;
    };
    // Unless the load commits, the values go back to what they were (a device that fails
    // the copy back fails the group: its values are then neither the old nor the new).
    auto put_back = [&]() -> Status {
        for (size_t i = 0; i < kept.size(); ++i) {
            if (!kept[i]) continue;
            const ReadOp &op = ops[i];
            SX_TRY(dev.from_host(target(op), stage[op.unit_index].kept + op.shard_offset,
                                 (op.copy_end - op.copy_begin) * sizeof(float)));
        }
        kept.clear();
        return Status::Ok();
    };
    bool committed = false;
    struct OnExit {
        const std::function<void()> fn;
        ~OnExit() { fn(); }
    } put_back_unless_committed{[&] {
        if (committed) return;
        Status s = put_back();
        if (!s.ok()) g.fail(s.prefix("putting the values back after a failed load: "));
    }};
    // The params hold the values of every rank's shard: each narrows its masters (if any)
    // into its own shard of the params, and the ranks gather the rest.
    auto gather_params = [&]() -> Status {
        SX_TRY(g.masters_to_params());
        if (g.world_size() == 1) return Status::Ok();
        for (size_t u = 0; u < stage.size(); ++u) {
            const core::ShardGroup::UnitView v = g.unit_view(u);
            SX_TRY(g.collective([&](comm::Communicator &c) {
                return c.all_gather(v.params, v.shard_numel * core::dtype_size(v.dtype));
            }));
        }
        return Status::Ok();
    };
    // Every rank votes; the highest failing status code wins everywhere.
    auto agree = [&](const Status &mine) -> Status {
        uint64_t verdict[1] = {mine.ok() ? 0u : static_cast<uint64_t>(mine.code())};
        SX_TRY(g.collective([&](comm::Communicator &c) { return c.all_reduce_max(verdict, 1); }));
        if (!mine.ok()) return mine;
        SX_CHECK(verdict[0] == 0, static_cast<sx_status_t>(verdict[0]),
                 "loading %s failed on another rank (see that rank's error)", options.path.c_str());
        return Status::Ok();
    };
    std::unique_ptr<ChunkReader> reader;
    size_t values_reads = 0;  // ops[0, values_reads) read values, the rest state

    // Whole chunks are read (their CRC covers them whole): straight to their place when
    // this shard owns all of it and the group keeps it in host memory, else through a
    // buffer keeping the part it owns. The reader's threads run ahead so that the device
    // keeps working while this thread checks the CRCs of what arrived; the copies aside
    // of the values read in place are made by its placing thread, ahead of the reads,
    // rather than between them.
    auto whole = [](const ReadOp &op) { return op.copy_begin == op.chunk->begin && op.copy_end == op.chunk->end; };
    auto direct = [&](size_t i) { return on_host && whole(ops[i]); };
    auto keep = [&](size_t i) -> Status {  // before read i overwrites values
        const ReadOp &op = ops[i];
        if (!reads_values(op)) return Status::Ok();
        SX_TRY(dev.to_host(stage[op.unit_index].kept + op.shard_offset, target(op),
                           (op.copy_end - op.copy_begin) * sizeof(float)));
        kept[i] = 1;
        return Status::Ok();
    };
    // Waits for reads [begin, end), checks their CRCs and puts them in place; stops early
    // (the result then does not matter) once *abandon is set. Its failure (an exception
    // too) becomes this rank's, and stops the reads at once.
    Status local;
    auto check_reads = [&](size_t begin, size_t end, const std::atomic<bool> *abandon) {
        if (!local.ok()) return;
        local = catching([&]() -> Status {
            for (size_t i = begin; i < end && !(abandon && abandon->load()); ++i) {
                const ReadOp &op = ops[i];
                const Chunk &c = *op.chunk;
                const char *data = nullptr;
                SX_TRY(reader->wait(i, &data));
                const std::string path = options.path + "/" + m.files[c.file];
                SX_CHECK(io::crc32c(data, c.length) == c.crc32c, SX_ERR_CORRUPT,
                         "%s: the chunk of param '%s'%s at byte %llu fails its CRC32C check", path.c_str(),
                         m.params[op.manifest_param].name.c_str(), tensor_suffix(op.kind),
                         static_cast<unsigned long long>(c.offset));
                if (!direct(i)) {
                    SX_TRY(keep(i));
                    SX_TRY(dev.from_host(target(op), data + (op.copy_begin - c.begin) * sizeof(float),
                                         (op.copy_end - op.copy_begin) * sizeof(float)));
                }
                reader->release(i);
            }
            return Status::Ok();
        });
        if (!local.ok()) reader.reset();
    };

    // Whatever fails here (an exception too) is this rank's vote, so that no peer waits.
    local = catching([&]() -> Status {
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
            // The dtypes may differ: the stored values are fp32 (the masters of 16-bit params).
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
        SX_TRY(plan_read(m, layout, rank, index, want, &ops));

        // Sequential reads, file by file, so that the kernel's readahead keeps the device
        // busy while the CRCs of what arrived are checked. Its own readahead, not one asked
        // for with POSIX_FADV_WILLNEED: that path fills the page cache with 4 KiB pages,
        // where sequential readahead allocates large folios; here it cost more CPU than
        // the copy out of the page cache itself (perf), the plain reader none of it.
        // The values come first (a save puts them first in each file), so that the ranks
        // can gather them while the states are read.
        std::sort(ops.begin(), ops.end(), [](const ReadOp &a, const ReadOp &b) {
            if (reads_values(a) != reads_values(b)) return reads_values(a);
            return a.chunk->file != b.chunk->file ? a.chunk->file < b.chunk->file
                                                  : a.chunk->offset < b.chunk->offset;
        });
        values_reads = static_cast<size_t>(std::count_if(ops.begin(), ops.end(), reads_values));
        uint64_t floats = 0;
        for (size_t u = 0; u < stage.size(); ++u) floats += layout.units()[u].shard_numel;
        if (staging_.size() < floats * sizeof(float)) {
            HostBuffer bigger;
            SX_TRY(bigger.allocate(floats * sizeof(float), "checkpoint staging", HostBuffer::kLazy));
            staging_ = std::move(bigger);
        }
        float *next = staging_.as<float>();
        spare_state_.resize(stage.size());
        for (size_t u = 0; u < stage.size(); ++u) {
            const uint64_t n = layout.units()[u].shard_numel;
            UnitStage &us = stage[u];
            us.slots = slots_needed[u];
            us.region[0] = g.unit_view(u).values;
            us.kept = next;
            next += n;
            for (int k = 0; k < us.slots; ++k) {
                core::Buffer &spare = spare_state_[u][k];
                if (spare.size() != n * sizeof(float))
                    SX_TRY(dev.allocate(n * sizeof(float), "checkpoint load staging", &spare, true));
                us.region[k + 1] = spare.as<float>();
            }
        }
        SX_TRY(fill_uncovered(g, ops, want, [&](int32_t u, int k) { return stage[u].region[k]; }));

        kept.assign(ops.size(), 0);
        reader.reset(new ChunkReader(*ops_, options.path, m, ops, [&](size_t i, char **into) -> Status {
            if (!direct(i)) return Status::Ok();
            SX_TRY(keep(i));
            *into = reinterpret_cast<char *>(target(ops[i]));
            return Status::Ok();
        }));
        return Status::Ok();
    });
    check_reads(0, values_reads, nullptr);

    // The ranks agree on the values and gather the params on a thread of their own (on a
    // device: on this one, first), while this one reads the states: a rank that read its
    // values first does not wait for the others. If the load fails from here on, each
    // rank puts its values back and the params are gathered again, which leaves them as
    // the ranks' shards were: what the next step would gather.
    Status values_agreed, gathered;
    std::atomic<bool> abandon{false};  // another rank failed: stop reading
    auto agree_and_gather = [&, values_read = local] {
        values_agreed = catching([&] { return agree(values_read); });
        if (values_agreed.ok()) {
            gathered = catching(gather_params);
        } else {
            abandon = true;
        }
    };
    std::thread gatherer;
    if (on_host) {
        try {
            gatherer = std::thread(agree_and_gather);
        } catch (...) {
            agree_and_gather();  // no thread to be had: the gather goes first, as on a device
        }
    } else {
        agree_and_gather();
    }
    check_reads(values_reads, ops.size(), &abandon);
    if (gatherer.joinable()) gatherer.join();
    reader.reset();
    if (!values_agreed.ok()) return values_agreed;
    if (!gathered.ok()) return g.fail(gathered);  // the params are neither old nor new
    Status verdict = agree(local);
    if (!verdict.ok()) {
        if (!g.check_usable().ok()) return verdict;  // the vote failed: the values only go back
        committed = true;                            // the values go back here, then the params
        Status s = put_back();
        if (s.ok()) s = gather_params();
        if (!s.ok()) g.fail(s.prefix("restoring the params after a failed load: "));
        return verdict;
    }

    // Commit: the values and the params are in place; the staged state replaces the live
    // one. Nothing below can be undone: a failure fails the group.
    committed = true;
    for (size_t u = 0; u < stage.size(); ++u) {
        for (int k = 0; k < stage[u].slots; ++k) {
            Status s = g.swap_state(u, k, &spare_state_[u][k]);
            if (!s.ok()) return g.fail(s);
        }
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
            const optim::Kind kind = h.kind;  // the same for every param the checkpoint holds
            h = hyper_of(m.param_groups[i]);
            h.kind = kind;
        }
        g.set_steps_taken(m.step);
        // The scale carries on where it was, if this group scales dynamically and the
        // checkpoint's group scaled too (growth_interval 0 marks none).
        if (g.loss_scaling().mode == SX_LOSS_SCALING_DYNAMIC && m.loss_scaler.growth_interval > 0) {
            core::LossScalerState st;
            st.scale = m.loss_scaler.scale;
            st.growth_tracker = m.loss_scaler.growth_tracker;
            g.set_loss_scaler(st);
        }
    }
    loaded_ = true;
    if (user_blob) *user_blob = m.user_blob;
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
