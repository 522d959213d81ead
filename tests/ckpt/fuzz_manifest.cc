// Fuzz target for decode_manifest (libFuzzer's entry point; the ckpt_manifest_corpus
// test replays the committed corpus through it in every build).
//
// Each input is decoded twice: as it is, which exercises the trailer's checks, and
// as the FlatBuffer of a file whose trailer is made to match it, so that mutations get
// past the CRC to the verifier, the reader and validate(). Whatever decodes must
// validate, encode, and decode again to the same manifest, and encoding that gives
// the same bytes again (an older major's manifest, which is never written: the test encoder's copy
// of it decodes to the same manifest).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt/manifest.h"
#include "manifest_testing.h"

namespace {

void check(bool ok, const char *what, const std::string &detail = "") {
    if (ok) return;
    std::fprintf(stderr, "fuzz_manifest: %s %s\n", what, detail.c_str());
    std::abort();
}

void decode_and_round_trip(const uint8_t *data, size_t size) {
    using namespace sx::ckpt;
    Manifest m;
    sx::Status s = decode_manifest(data, size, &m);
    if (!s.ok()) {
        check(s.code() == SX_ERR_CORRUPT || s.code() == SX_ERR_VERSION, "unexpected status", s.message());
        check(!s.message().empty(), "an error without a message");
        return;
    }
    check(validate(m).ok(), "decoded a manifest that validate() refuses");
    std::string bytes;
    if (m.format_major < kFp32FormatMajor) {
        // An older major (1.x, 2.x) is read, never written: the encoder refuses it, and the
        // test encoder's copy decodes to the same manifest. (3.x and 4.x are written: 4.0
        // where the state is packed, else 3.0.)
        check(encode_manifest(m, &bytes).code() == SX_ERR_INVALID_ARGUMENT, "encoded an older major's manifest");
        bytes = testing::raw_encode(m, m.format_major, m.format_minor);
        Manifest again;
        s = decode_manifest(bytes.data(), bytes.size(), &again);
        check(s.ok(), "cannot decode the raw encoding of an older major's manifest:", s.message());
        std::string where;
        check(testing::manifest_equal(m, again, true, &where), "older major's round trip changed", where);
        return;
    }
    s = encode_manifest(m, &bytes);
    check(s.ok(), "cannot encode what was decoded:", s.message());
    Manifest again;
    s = decode_manifest(bytes.data(), bytes.size(), &again);
    check(s.ok(), "cannot decode what was encoded:", s.message());
    std::string where;
    check(testing::manifest_equal(m, again, false, &where), "round trip changed", where);
    std::string bytes_again;
    check(encode_manifest(again, &bytes_again).ok() && bytes_again == bytes, "encoding is not deterministic");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    decode_and_round_trip(data, size);
    if (size <= (1u << 20)) {
        const std::string file =
            sx::ckpt::testing::with_trailer(std::string(reinterpret_cast<const char *>(data), size));
        decode_and_round_trip(reinterpret_cast<const uint8_t *>(file.data()), file.size());
    }
    return 0;
}
