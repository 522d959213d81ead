// The reads of one load (ckpt/load.cc): every chunk a rank needs, each file read
// sequentially by a thread of its own, ahead of the caller that checks the chunks.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "io/file_ops.h"

namespace sx {
namespace ckpt {

// Open shard files of one load, closed when it ends.
class OpenFiles {
  public:
    OpenFiles(io::FileOps &ops, std::string dir) : ops_(ops), dir_(std::move(dir)) {}
    ~OpenFiles();
    // The descriptor of the manifest's file `file`, opened at its first use.
    Status get(const Manifest &m, uint32_t file, int *fd);

  private:
    io::FileOps &ops_;
    std::string dir_;
    std::map<uint32_t, int> fds_;
    std::map<uint32_t, std::string> names_;
};

// Reads a load's chunks: chunk i whole into the place that place(i) gives (its final
// one; runs of such chunks in one call, see kMaxRunBytes), or where that is null into
// a buffer of the reader's own, reused once the caller has released the chunk that used
// it before. Each file is read by one thread, in the
// order of the chunks, up to kMaxStreams threads (files beyond that share them): every
// file is a sequential stream with its own readahead, and a stream whose thread is late
// (copying, or waiting for a processor) leaves the device the other streams' requests.
// place(i) runs on a thread of its own, in order, ahead of the reads (it may copy aside
// what chunk i will overwrite, which then costs the reads nothing). Only buffered chunks
// wait for the caller, which waits for chunk i, checks it and releases it. Destroying
// the reader stops its threads (after the call under way) and joins them. The threads
// are described in docs/threads.md.
class ChunkReader {
  public:
    static constexpr size_t kMaxStreams = 4;
    static constexpr size_t kBuffers = 4;  // per stream
    // Chunks read in place that follow each other in the file and in memory are read by
    // one call, of at most kMaxRunBytes (the first of a stream at most kFirstRunBytes,
    // each next one up to twice the last): a large read has the kernel read ahead as far
    // as it goes, where 4 MiB reads keep a few MiB in flight (a cold read of 384 MiB here
    // took 0.84x as long in 64 MiB reads as in 4 MiB ones). The first is small so that
    // the device starts before many values are copied aside.
    static constexpr uint64_t kFirstRunBytes = 8ull << 20;
    static constexpr uint64_t kMaxRunBytes = 64ull << 20;
    // Sets *into to chunk i's place, or to null for a buffer; an error stops the reads.
    using Place = std::function<Status(size_t i, char **into)>;

    // Starts the threads; throws if one cannot be started (none is left running).
    // `m`, `reads` and `place` are borrowed until the reader is destroyed.
    ChunkReader(io::FileOps &ops, const std::string &dir, const Manifest &m, const std::vector<ReadOp> &reads,
                Place place);
    ~ChunkReader();

    // Waits until chunk i has been read; *data is where its bytes are. The error that
    // stopped the reads before chunk i was read, if one did.
    Status wait(size_t i, const char **data);
    // The caller is done with chunks [0, i] (their buffers may be reused).
    void release(size_t i);

  private:
    struct Stream {
        Stream(io::FileOps &ops, const std::string &dir) : files(ops, dir) {}
        OpenFiles files;             // used by the stream's thread alone, closed after it ended
        std::vector<size_t> chunks;  // the chunks it reads, in order
        std::vector<char> bufs[kBuffers];
        std::thread thread;
    };

    void stop_and_join();
    // A thread's body; its error (an exception too) stops every thread.
    void run(const std::function<Status()> &body);
    // The first error stops every thread.
    void fail(const Status &s);
    // The threads' bodies: an error, or ok once done or stopped.
    Status place_all();
    Status read_stream(Stream &st);
    // Chunk `next` (placed) is read in place right behind chunk `prev`, in its file and in
    // memory. Under mu_.
    bool follows(size_t prev, size_t next) const;

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

}  // namespace ckpt
}  // namespace sx
