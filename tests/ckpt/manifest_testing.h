// Manifests for the ckpt tests and the fuzz target: a rich example, an independent
// encoder that skips validate() and can write any format version (with fields this
// reader does not know, as a later minor would), and exact equality.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/manifest.h"

namespace sx {
namespace ckpt {
namespace testing {

// Three param groups (AdamW with amsgrad, SGD with nesterov momentum, Adam), four
// params (F32 matrix, BF16 vector, F16 scalar, a UTF-8 name) with their optimizer
// states split over three shard files, a loss scaler, a user blob holding NUL bytes:
// as format 2.0 (where each param lies in its unit, and each file's index) ...
Manifest rich_manifest();
// ... and as format 1.2 (the chunks themselves in the manifest).
Manifest rich_manifest_v1();

// One param with one tensor in one file: the smallest manifest that holds everything
// (format 2.0, and 1.2 with its one chunk).
Manifest small_manifest();
Manifest small_manifest_v1();

// A format 4.0 manifest of packed optimizer state in one file: an 8-bit AdamW group
// holding a param of 16 blocks ("w": Q8 codes and their scales for both moments) and one
// too small for blocks ("b", fp32 state), and a bf16 AdamW group ("v", BF16 moments).
Manifest packed_manifest();

// The format 2.0 manifest of the same checkpoint as the 1.x manifest `m`: no chunks;
// units laid out as the library would (params in order, each unit split evenly over the
// files); per file an index of as many records as the file's chunks in `m`.
Manifest as_v2(const Manifest &m);

// The FlatBuffer and trailer of `m`, built without validate() and stating format
// major.minor (the fields of 1.2 and before, from major 2 those of 2.0, from major 3 those
// of 3.0, and a param group's 4.0 state_dtype wherever it is not fp32). With
// `unknown_fields`, every table also carries fields after the last one that format
// defines (a scalar, a string, a table of a type it lacks), as a writer of a later minor
// might.
std::string raw_encode(const Manifest &m, uint16_t major, uint16_t minor, bool unknown_fields = false);

// A manifest stating format major.0 whose other fields a later major retyped:
// Manifest.params holds an integer that format 1.0 reads as an offset far outside
// the buffer, and Manifest.world_size holds a string's offset.
std::string retyped_manifest(uint16_t major);

// A format 1.0 manifest of 2000 params that share data, as FlatBuffers allows:
// one 1000-byte name (copied out, 2 MB from a file of about 60 KB), or, with
// `share_tensors`, distinct names but one tensor of 1000 chunk tables (2 million
// tables to verify in a file of about 100 KB).
std::string sharing_manifest(bool share_tensors);

// `flatbuffer` followed by a trailer that matches it.
std::string with_trailer(const std::string &flatbuffer);

// Field-by-field equality; the format version is compared only with `compare_format`.
// Doubles compare with ==, so -0.0 equals 0.0: the encoder leaves out a field equal to
// its default (0.0), and -0.0 comes back as 0.0 (found by fuzzing). validate() has
// refused NaN. On a difference, *where names the field.
bool manifest_equal(const Manifest &a, const Manifest &b, bool compare_format, std::string *where);

}  // namespace testing
}  // namespace ckpt
}  // namespace sx
