#include "ckpt/chunk_reader.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace sx {
namespace ckpt {

OpenFiles::~OpenFiles() {
    for (auto &f : fds_) ops_.close(f.second, dir_ + "/" + names_[f.first]);
}

Status OpenFiles::get(const Manifest &m, uint32_t file, int *fd) {
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

ChunkReader::ChunkReader(io::FileOps &ops, const std::string &dir, const Manifest &m,
                         const std::vector<ReadOp> &reads, Place place)
    : ops_(ops), dir_(dir), m_(m), reads_(reads), place_(std::move(place)), placed_(reads.size(), nullptr),
      where_(reads.size(), nullptr) {
    std::map<uint32_t, size_t> stream_of;  // file -> stream
    for (const ReadOp &r : reads) stream_of.emplace(r.chunk->file, 0);
    size_t next = 0;
    for (auto &f : stream_of) f.second = next++ % kMaxStreams;
    for (size_t k = 0; k < std::min(stream_of.size(), kMaxStreams); ++k) streams_.emplace_back(new Stream(ops, dir));
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

ChunkReader::~ChunkReader() { stop_and_join(); }

Status ChunkReader::wait(size_t i, const char **data) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return where_[i] != nullptr || !error_.ok(); });
    if (!where_[i]) return error_;
    *data = where_[i];
    return Status::Ok();
}

void ChunkReader::release(size_t i) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        released_ = i + 1;
    }
    cv_.notify_all();
}

void ChunkReader::stop_and_join() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto &st : streams_)
        if (st->thread.joinable()) st->thread.join();
    if (placer_.joinable()) placer_.join();
}

void ChunkReader::run(const std::function<Status()> &body) {
    const Status s = catching(body);
    if (!s.ok()) fail(s);
}

void ChunkReader::fail(const Status &s) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.ok()) error_ = s;
    }
    cv_.notify_all();
}

Status ChunkReader::place_all() {
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

bool ChunkReader::follows(size_t prev, size_t next) const {
    const Chunk &a = *reads_[prev].chunk, &b = *reads_[next].chunk;
    return placed_[next] != nullptr && a.file == b.file && a.offset + a.length == b.offset &&
           placed_[prev] + a.length == placed_[next];
}

Status ChunkReader::read_stream(Stream &st) {
    std::array<size_t, kBuffers> user;  // the last chunk read into each buffer
    user.fill(SIZE_MAX);
    size_t buffered = 0;
    uint64_t run_limit = kFirstRunBytes;
    for (size_t k = 0; k < st.chunks.size();) {
        const size_t i = st.chunks[k];
        const Chunk &c = *reads_[i].chunk;
        char *into = nullptr;
        size_t end = k + 1;  // the read covers st.chunks[k, end)
        uint64_t bytes = c.length;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !error_.ok() || num_placed_ > i; });
            if (stop_ || !error_.ok()) return Status::Ok();
            into = placed_[i];
            if (into) {
                // Chunks in place that follow each other in the file and in memory: one
                // read, so that the kernel reads ahead as far as the run goes.
                while (end < st.chunks.size() && bytes + reads_[st.chunks[end]].chunk->length <= run_limit) {
                    const size_t j = st.chunks[end];
                    cv_.wait(lock, [&] { return stop_ || !error_.ok() || num_placed_ > j; });
                    if (stop_ || !error_.ok()) return Status::Ok();
                    if (!follows(st.chunks[end - 1], j)) break;
                    bytes += reads_[j].chunk->length;
                    ++end;
                }
            } else {
                const size_t b = buffered++ % kBuffers;
                cv_.wait(lock,
                         [&] { return stop_ || !error_.ok() || user[b] == SIZE_MAX || released_ > user[b]; });
                if (stop_ || !error_.ok()) return Status::Ok();
                user[b] = i;
                st.bufs[b].resize(c.length);
                into = st.bufs[b].data();
            }
        }
        int fd = -1;
        SX_TRY(st.files.get(m_, c.file, &fd));
        SX_TRY(ops_.pread_all(fd, into, bytes, c.offset, dir_ + "/" + m_.files[c.file]));
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (size_t q = k; q < end; ++q) {
                where_[st.chunks[q]] = into;
                into += reads_[st.chunks[q]].chunk->length;
            }
        }
        cv_.notify_all();
        k = end;
        run_limit = std::min(run_limit * 2, kMaxRunBytes);
    }
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
