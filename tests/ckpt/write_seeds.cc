// Writes the fuzz corpus's seed manifests into a directory: ckpt_manifest_seeds DIR.
// valid-* files are manifests this format writes or must read (replay_corpus checks
// that they keep decoding): 4.0 (packed optimizer state), 3.0, 2.0, and the 1.0 to 1.2
// that earlier releases wrote (no 1.x
// minor after 1.2 was ever written, and 2.0 took the field slots one would have used; so
// did the params' placement, written since 1.7, for the 3.9 seed's unknown fields);
// the others are refused for one reason each.
#include <cstdio>
#include <fstream>
#include <string>

#include "ckpt/manifest.h"
#include "manifest_testing.h"

namespace {

bool write(const std::string &dir, const std::string &name, const std::string &bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return out.good();
}

}  // namespace

int main(int argc, char **argv) {
    using namespace sx::ckpt;
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    std::string rich, small, empty, packed;
    Manifest none;  // a group of one rank with no params: one file, an empty index
    none.files = {"shard-00000-of-00001.bin"};
    none.file_indexes = {FileIndex{0, 8, 0, 0}};
    if (!encode_manifest(testing::rich_manifest(), &rich).ok() ||
        !encode_manifest(testing::small_manifest(), &small).ok() || !encode_manifest(none, &empty).ok() ||
        !encode_manifest(testing::packed_manifest(), &packed).ok()) {
        std::fprintf(stderr, "cannot encode the example manifests\n");
        return 1;
    }
    std::string flipped = small;
    flipped[40] = static_cast<char>(flipped[40] ^ 0x10);
    Manifest bad = testing::small_manifest_v1();
    bad.params[0].tensors[0].chunks[0].offset = 100;
    Manifest outside = testing::small_manifest();
    outside.params[0].unit_offset = 1;
    bool ok = write(dir, "valid-rich-3.0", rich) && write(dir, "valid-small-3.0", small) &&
              write(dir, "valid-empty-3.0", empty) && write(dir, "valid-packed-4.0", packed) &&
              write(dir, "packed-state-in-3.0",
                    testing::raw_encode(testing::packed_manifest(), 3, 0)) &&
              write(dir, "valid-rich-3.0-stored-defaults", testing::raw_encode(testing::rich_manifest(), 3, 0)) &&
              write(dir, "valid-rich-2.0-stored-defaults", testing::raw_encode(testing::rich_manifest(), 2, 0)) &&
              write(dir, "valid-rich-3.9-unknown-fields", testing::raw_encode(testing::rich_manifest(), 3, 9, true)) &&
              write(dir, "valid-rich-1.2", testing::raw_encode(testing::rich_manifest_v1(), 1, 2)) &&
              write(dir, "version-4.0-retyped", testing::retyped_manifest(4)) &&
              write(dir, "truncated-small-3.0", small.substr(0, small.size() / 2)) &&
              write(dir, "flipped-small-3.0", flipped) &&
              write(dir, "unaligned-chunk-small", testing::raw_encode(bad, 1, 0)) &&
              write(dir, "param-outside-its-files-small", testing::raw_encode(outside, 3, 0));
    if (!ok) {
        std::fprintf(stderr, "cannot write into %s\n", dir.c_str());
        return 1;
    }
    return 0;
}
