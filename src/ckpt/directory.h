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

// The user blob of the checkpoint in `dir`, from its verified MANIFEST.
Status read_user_blob(io::FileOps &ops, const std::string &dir, std::string *out);

}  // namespace ckpt
}  // namespace sx
