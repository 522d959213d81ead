// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous token's
// challenge-response (tcp_store_core.h). Written here rather than linked: one hash for
// one handshake does not justify a TLS library (and its headers, package and licence) in
// every build of libsx, its bindings and its wheel. Checked against FIPS 180-4's and
// RFC 4231's test vectors (tests/rdzv/test_store_guard.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sx {
namespace rdzv {

constexpr size_t kSha256Bytes = 32;

// The SHA-256 digest of `data` (32 raw bytes).
std::string sha256(const std::string &data);

// HMAC-SHA256 of `message` under `key` (any length; longer than 64 bytes is hashed
// first, as RFC 2104 says): 32 raw bytes.
std::string hmac_sha256(const std::string &key, const std::string &message);

// Whether a and b are equal, in a time that depends on their lengths only (never on
// where they first differ), so that a peer timing the answers learns nothing of a
// secret compared this way.
bool equal_in_constant_time(const std::string &a, const std::string &b);

}  // namespace rdzv
}  // namespace sx
