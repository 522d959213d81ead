// The wire format of the TCP rendezvous store, shared by tcp_store_server.cc and
// tcp_store_client.cc.
//
// Every message is a frame: u32 body length, then the body. Integers are
// little-endian; a string is u32 length + bytes.
//   request body: u8 op, then per op
//     HELLO                      -> u64 server instance id, u8 token required, string nonce
//     AUTH   string client nonce, string client proof
//                                -> string server proof   (then the server closes on error)
//     SET    key value           -> (nothing)
//     GET    key                 -> value        (held until the key exists)
//     WAIT   u32 n, n keys       -> (nothing)    (held until all keys exist)
//     ADD    key i64 delta       -> i64 new value
//     CHECK  u32 n, n keys       -> u8 all present
//     ERASE  key                 -> (nothing)
//     ERASE_PREFIX prefix        -> (nothing)    (every key that begins with prefix)
//   reply body: u8 status (0 ok, 1 error), then the op's result, or a string message.
// A client has at most one request outstanding per connection; the server holds GET and
// WAIT without a deadline: the client enforces timeouts by closing the connection.
//
// Admission. A connection starts unadmitted: it may send HELLO and AUTH only, in frames
// of at most kPreAdmissionFrame bytes, and must be admitted within kHandshakeMs. HELLO
// admits it when the server has no token; otherwise HELLO's nonce (kNonceBytes random
// bytes, empty without a token) is the challenge, and AUTH admits it when its client
// proof is client_proof(token, server nonce, client nonce). The server's answer proves in
// turn that it holds the token (server_proof), so a client with a token never writes to a
// server without it. The token itself never crosses the wire.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace sx {
namespace rdzv {
namespace wire {

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kWait = 4, kAdd = 5, kCheck = 6, kErase = 7, kAuth = 8, kErasePrefix = 9 };
enum Reply : uint8_t { kOk = 0, kError = 1 };

// Frames larger than this are refused. The largest value sx writes is Gloo's list of a
// rank's addresses for its full mesh, 136 bytes per peer: 8.5 MiB at SX_MAX_WORLD_SIZE.
constexpr uint32_t kMaxFrame = 16u << 20;
// Until a connection is admitted its frames are HELLO and AUTH: a few dozen bytes.
constexpr uint32_t kPreAdmissionFrame = 256;
constexpr size_t kNonceBytes = 32;

class Writer {
  public:
    Writer() { out_.resize(4); }  // room for the frame length
    Writer &u8(uint8_t v) {
        out_.push_back(static_cast<char>(v));
        return *this;
    }
    Writer &u32(uint32_t v) { return raw(v, 4); }
    Writer &u64(uint64_t v) { return raw(v, 8); }
    Writer &i64(int64_t v) { return raw(static_cast<uint64_t>(v), 8); }
    Writer &str(const std::string &s) {
        u32(static_cast<uint32_t>(s.size()));
        out_.append(s);
        return *this;
    }
    // The complete frame (length filled in).
    std::string frame() {
        uint32_t n = static_cast<uint32_t>(out_.size() - 4);
        for (int i = 0; i < 4; ++i) out_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
        return std::move(out_);
    }

  private:
    Writer &raw(uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
        return *this;
    }
    std::string out_;
};

// Reads a frame body; every read checks bounds and a failed one leaves ok() false.
class Reader {
  public:
    Reader(const char *data, size_t size) : p_(data), end_(data + size) {}
    bool ok() const { return ok_; }
    bool done() const { return ok_ && p_ == end_; }
    uint8_t u8() { return static_cast<uint8_t>(raw(1)); }
    uint32_t u32() { return static_cast<uint32_t>(raw(4)); }
    uint64_t u64() { return raw(8); }
    int64_t i64() { return static_cast<int64_t>(raw(8)); }
    std::string str() {
        uint32_t n = u32();
        if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
            ok_ = false;
            return std::string();
        }
        std::string s(p_, n);
        p_ += n;
        return s;
    }

  private:
    uint64_t raw(int bytes) {
        if (!ok_ || end_ - p_ < bytes) {
            ok_ = false;
            return 0;
        }
        uint64_t v = 0;
        for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p_[i])) << (8 * i);
        p_ += bytes;
        return v;
    }
    const char *p_;
    const char *end_;
    bool ok_ = true;
};

// Length of the frame body announced by 4 header bytes.
inline uint32_t frame_length(const char *header) {
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(header[i])) << (8 * i);
    return n;
}

// The proofs of the challenge-response: HMAC-SHA256 under the token of the two nonces,
// with a label per direction so that one can never be replayed as the other.
std::string client_proof(const std::string &token, const std::string &server_nonce, const std::string &client_nonce);
std::string server_proof(const std::string &token, const std::string &server_nonce, const std::string &client_nonce);
// kNonceBytes from the kernel's random source, or "" if it fails.
std::string random_nonce();

}  // namespace wire
}  // namespace rdzv
}  // namespace sx
