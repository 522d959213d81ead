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

// The shard file name of `rank` of `world`: shard-RRRRR-of-WWWWW.bin.
std::string shard_file_name(int rank, int world);

// Reads and decodes (verifies) dir/MANIFEST; errors name the file. Any thread.
Status read_manifest(io::FileOps &ops, const std::string &dir, Manifest *out);

// The user blob of the checkpoint in `dir`, from its verified MANIFEST.
Status read_user_blob(io::FileOps &ops, const std::string &dir, std::string *out);

}  // namespace ckpt
}  // namespace sx
