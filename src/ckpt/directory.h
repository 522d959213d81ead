// What a checkpoint directory holds, by name (docs/format.md), and reading its MANIFEST.
#pragma once

#include <string>

#include "base/status.h"
#include "ckpt/manifest.h"
#include "io/file_ops.h"

namespace sx {
namespace ckpt {

constexpr const char *kManifestName = "MANIFEST";        // written last: the commit marker
constexpr const char *kLatestName = "latest";            // beside the checkpoints: the newest one's name
constexpr const char *kPartialSuffix = ".sx-partial";    // a save's directory until it commits

// Whether `name` ends in kPartialSuffix: a save that never committed, or a removal cut
// short, which the next save in that directory clears.
inline bool is_partial_name(const std::string &name) {
    const std::string suffix = kPartialSuffix;
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether `name` is a temporary file of `latest` (latest.tmp, latest.tmp.PID.N: what
// io::write_file_atomic writes before its rename, left behind only by a crash).
inline bool is_latest_temporary_name(const std::string &name) {
    const std::string prefix = std::string(kLatestName) + ".tmp";
    return name.compare(0, prefix.size(), prefix) == 0;
}

// Refuses (SX_ERR_INVALID_ARGUMENT, saying what the name is) a checkpoint path whose
// last component is a name sx keeps for something else: an unfinished save
// (NAME.sx-partial, which never holds a checkpoint to load, even where a save was killed
// after writing its MANIFEST), the file naming the newest checkpoint (`latest`) or its
// temporary copy. `use`: what the path is for ("load", "save"), for the message.
Status check_checkpoint_name(const std::string &path, const char *use);

// The shard file name of `rank` of `world`: shard-RRRRR-of-WWWWW.bin.
std::string shard_file_name(int rank, int world);

// Reads and decodes (verifies) dir/MANIFEST; errors name the file. *file_crc (may be
// null) receives the CRC32C of the MANIFEST's bytes, the checkpoint's identity. Any thread.
Status read_manifest(io::FileOps &ops, const std::string &dir, Manifest *out, uint32_t *file_crc = nullptr);

// Creates (or truncates) `path` holding `bytes`, fsynced and closed. A failure leaves
// what was written for the caller to remove. Any thread.
Status write_durable_file(io::FileOps &ops, const std::string &path, const std::string &bytes);

// Commits a checkpoint whose shard files are complete and durable in `tmp_dir`: encodes
// `m` (so validate() runs first: SX_ERR_INVALID_ARGUMENT for a manifest sx would refuse),
// writes tmp_dir/MANIFEST and fsyncs it, fsyncs tmp_dir, renames it to `final_dir`
// and fsyncs `parent`, the directory holding both. Until the rename no directory
// without the kPartialSuffix holds the checkpoint; after it, the checkpoint is whole.
// On failure tmp_dir is left as it is, for the caller to remove. Any thread.
Status commit_checkpoint(io::FileOps &ops, const Manifest &m, const std::string &tmp_dir,
                         const std::string &final_dir, const std::string &parent);

// A lock on a directory that a save writes into or a removal takes apart, held for the
// object's life (io::FileOps::lock_directory): another process's save never removes a
// directory that a live process holds. Neither copied nor moved.
class DirectoryLock {
  public:
    DirectoryLock() = default;
    ~DirectoryLock() { release(); }
    DirectoryLock(const DirectoryLock &) = delete;
    DirectoryLock &operator=(const DirectoryLock &) = delete;

    // Locks `dir`. *busy (may be null): whether a live process holds it; then nothing is
    // held. A filesystem without directory locks holds nothing and is not an error.
    Status acquire(io::FileOps &ops, const std::string &dir, bool *busy);
    void release();
    // Whether the filesystem keeps the lock (false after an acquire where it keeps none).
    bool held() const { return fd_ >= 0; }

  private:
    io::FileOps *ops_ = nullptr;
    int fd_ = -1;
};

// The wall-clock time in milliseconds since the Unix epoch: a MANIFEST's creation time,
// and what file modification times are compared with.
uint64_t now_unix_ms();

// How long an unfinished save on a filesystem without directory locks must have gone
// unchanged (its directory and its files) before another save removes it as dead.
constexpr uint64_t kUnlockedPartialQuietMs = 10 * 60 * 1000;

// Removes `dir`, an unfinished save (NAME.sx-partial) or a removal cut short, unless a
// live process holds it: its save's rank 0 holds a DirectoryLock on it from its creation
// to its commit (or its removal after a failure), so only a save whose rank 0 died (or
// a removal's) is removed. Where the filesystem keeps no locks, one unchanged for
// kUnlockedPartialQuietMs. *removed (may be null): whether it was. Gone already: ok.
Status clear_unfinished(io::FileOps &ops, const std::string &dir, bool *removed = nullptr);

// Makes `tmp_dir` (final_dir + kPartialSuffix), the unfinished directory of a save or an
// import into `final_dir`, and locks it in *lock, which the caller holds until it has
// committed or removed it. The caller has cleared dead unfinished directories first, so
// one there already is a live process's: SX_ERR_ALREADY_EXISTS naming both. Made again
// if another process's clearing removed it between its creation and its lock.
Status make_unfinished_directory(io::FileOps &ops, const std::string &final_dir, const std::string &tmp_dir,
                                 DirectoryLock *lock);

// Removes the temporary file `path` of `latest` that a crashed writer left, once it has
// gone unchanged for kUnlockedPartialQuietMs (a live writer's exists for milliseconds).
// Gone already: ok.
Status clear_stale_temporary(io::FileOps &ops, const std::string &path);

// The user blob of the checkpoint in `dir`, from its verified MANIFEST.
Status read_user_blob(io::FileOps &ops, const std::string &dir, std::string *out);

}  // namespace ckpt
}  // namespace sx
