// Saving and loading a group's sharded state (docs/design.md, "Checkpoint").
//
// Saving is split in three so that the caller waits only for the first part:
//   snapshot  (caller's thread) records the param table and where every chunk of this
//             rank's shard comes from (a mesh's first replica group alone writes; the
//             other replicas hold the same shards), makes sure staging memory exists (allocated
//             once, pre-faulted, reused), and holds the group's shard fence;
//   stage     (any thread) copies the shard of params and optimizer state into staging,
//             laid out exactly as its shard file will be, then releases the fence: until
//             then the group's own writers of the shard (the step's update, a broadcast,
//             a load) wait, so the checkpoint holds the values of the step boundary at
//             which the save was called;
//   persist   (any thread) writes and fsyncs the shard file into the checkpoint's
//             temporary directory, agrees through the rendezvous store (never the
//             training communicator) that every rank finished, and on rank 0 writes
//             MANIFEST, fsyncs it, renames the directory into place, fsyncs the parent,
//             then moves the `latest` pointer and applies retention.
// A crash at any point leaves the previous checkpoint or the new one, never a torn one
// that loads: MANIFEST exists only inside a directory that is complete.
#pragma once

#include <array>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/memory.h"
#include "ckpt/directory.h"
#include "ckpt/future.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "core/shard_state.h"
#include "io/file_ops.h"
#include "io/io_loop.h"

namespace sx {
namespace ckpt {

struct SaveOptions {
    std::string path;        // the checkpoint directory to create (must not exist)
    std::string user_blob;   // stored opaque in the manifest
    int keep_last = 0;       // > 0: keep only the newest K checkpoints beside it
};

struct LoadOptions {
    std::string path;
    bool params_only = false;       // values only: no optimizer state, steps or hyperparameters
    bool allow_missing = false;     // params of the group absent from the checkpoint keep their values
    bool allow_extra = false;       // params of the checkpoint absent from the group are ignored
};

// One save's snapshot: what stage and persist need, independent of the live group's
// tables (only the shard's memory is read, through `sources`, while `hold` lives).
struct Snapshot {
    uint64_t sequence = 0;
    int rank = 0, world_size = 1;
    // The mesh: the first replica group's ranks (replica_rank 0) write shard file
    // shard_rank of shard_size; the other ranks write nothing (their plan is empty) but
    // report and wait for the commit like the writers.
    int shard_rank = 0, shard_size = 1;
    bool writer = true;
    WritePlan plan;
    std::vector<const void *> sources;  // per plan chunk: its first byte in live memory
    std::unique_ptr<core::ShardFence::Hold> hold;     // released once staged
    Manifest skeleton;  // everything but files and chunks
    SaveOptions options;
};

// How much of a snapshot's file stage() has copied into staging, in file order: persist()
// writes each piece once it is there, so that the device starts writing while the rest
// is still being copied. Thread-safe.
class StagedBytes {
  public:
    // [0, end) of the file is staged.
    void advance(uint64_t end);
    // Staging ended: all of it, or with this failure.
    void finish(const Status &s);
    // Waits until [0, end) is staged; the failure if staging failed first.
    Status wait(uint64_t end);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t end_ = 0;
    bool finished_ = false;
    Status status_;
};

class Checkpointer {
  public:
    Checkpointer(core::ShardAccess *group, std::shared_ptr<io::FileOps> ops);
    // Waits for a save still in flight.
    ~Checkpointer();

    // Collective in order (every rank calls it for the same save).
    Status snapshot(const SaveOptions &options, Snapshot *out);
    // Copies the snapshot's chunks into staging and releases the shard fence, telling
    // `staged` how far it got, and how it ended. A copy can fail only on a device;
    // persist() then tells the peers.
    Status stage(Snapshot *snap, StagedBytes *staged);
    // Reads only the snapshot and the staging memory; talks to peers through the store.
    // progress (may be null) receives the byte counts and is asked about cancellation.
    // Each piece of the file is written once `staged` says it is there; a failed
    // staging is reported to the peers through the store, as a failed write is, so that
    // every rank's save fails at once.
    Status persist(const Snapshot &snap, SaveFuture *progress, StagedBytes *staged);
    Status save(const SaveOptions &options);  // snapshot, then stage and persist at once
    // As save(), but what makes the call invalid (the snapshot's checks: the group's
    // state, the options) is returned, as save_async returns it, and how the save itself
    // went is put in *outcome.
    Status save_checked(const SaveOptions &options, Status *outcome);
    // Snapshots on this thread, then stages and persists on the I/O loop's thread
    // pool (the future reports when it is staged). A save
    // still in flight is waited for first (its staging memory is reused). `callback`
    // runs on the I/O loop's thread when the save completes.
    Status save_async(const SaveOptions &options, SaveFuture::Callback callback,
                      std::shared_ptr<SaveFuture> *out);

    // Collective. All ranks succeed or all fail; a failed load changes no value.
    Status load(const LoadOptions &options, std::string *user_blob);

    // The staging memory kept: staging_ and the spare state buffers.
    uint64_t staging_bytes() const;
    // Allocates (and faults in) the staging of this rank's shard file ahead of the first
    // save, sized for every optimizer state the params' groups may keep
    // (SX_GROUP_RESERVE_CHECKPOINT_STAGING), and starts the thread that persists
    // asynchronous saves. A rank that writes no file (a mesh's other
    // replicas) reserves nothing. Owner's thread.
    Status reserve_staging();

  private:
    class Load;  // one load's phases (load.cc)

    // staging_ holds at least `bytes` (a new buffer, populated as `populate` says, where
    // it held fewer; its contents are not kept).
    Status grow_staging(uint64_t bytes, HostBuffer::Populate populate);
    // stage() on a thread of its own while persist() runs on this one; `future` (may be
    // null) is told when the snapshot is staged.
    Status stage_and_persist(Snapshot *snap, SaveFuture *future);

    core::ShardAccess *group_;
    std::shared_ptr<io::FileOps> ops_;
    HostBuffer staging_;
    // Per unit and state slot: the buffer the last load staged that slot in, which the
    // commit swapped with the group's (so it now holds the state that load replaced).
    // The next load stages into it again: fresh memory would have to be faulted in page
    // by page, which cost more here than reading the same bytes from disk. Kept only
    // after a load that follows an earlier successful one (loads in a row, as when an
    // evaluation goes through checkpoints): a trainer loads once, then trains, and would
    // carry a shard of unused memory into training. A save releases them too, so that a
    // trainer that saves keeps the save's staging alone.
    std::vector<std::array<core::Buffer, 3>> spare_state_;  // where the group keeps its state
    std::vector<std::array<core::Buffer, 3>> spare_scales_;  // and its 8-bit slots' scales
    bool loaded_ = false;  // a load has succeeded
    std::unique_ptr<io::IoLoop> loop_;        // started by the first asynchronous save
    std::shared_ptr<SaveFuture> in_flight_;   // the last asynchronous save
};

}  // namespace ckpt
}  // namespace sx
