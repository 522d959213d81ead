// The TCP rendezvous store without its sockets: the keys, the held requests, admission
// (the token's challenge-response) and the limits on what a connection may cost, driven
// by bytes in and frames out. tcp_store_server.cc runs it on a libuv loop; the fuzz
// target (tests/rdzv/fuzz_store_frames.cc) and the tests drive it directly.
//
// Invariants (checked by audit()):
//  - stored_bytes is the sum of the sizes of every key and value held, and at most
//    limits.max_bytes; the keys number at most limits.max_keys;
//  - buffered_bytes is the sum of the unparsed input of every open peer, and at most
//    limits.max_buffered;
//  - a peer is admitted only after HELLO (no token) or a correct AUTH; before that it is
//    answered nothing but HELLO and AUTH, and its frames are at most
//    limits.pre_admission_frame bytes;
//  - a held peer (GET or WAIT whose keys are missing) is a watcher of each missing key,
//    and a peer that is closed is nobody's watcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rdzv/tcp_store_protocol.h"

namespace sx {
namespace rdzv {

// What one server lets its connections cost it (docs/rendezvous.md lists them).
struct StoreLimits {
    size_t max_bytes = size_t(1) << 30;            // keys and values held, in bytes
    size_t max_keys = size_t(1) << 20;             // keys held
    size_t max_buffered = size_t(64) << 20;        // bytes of incomplete requests, all peers together
    uint32_t max_frame = wire::kMaxFrame;          // an admitted peer's frame, in bytes
    uint32_t pre_admission_frame = wire::kPreAdmissionFrame;
    int64_t handshake_ms = 10000;   // from connecting to admission
    int64_t first_frame_ms = 2000;  // from connecting to the first complete frame (a client's HELLO)
    int64_t idle_frame_ms = 10000;  // an incomplete request with no new byte for this long is dropped
};

// One connection as the core sees it. The transport owns it; the core keeps a pointer
// from open() until forget().
struct StorePeer {
    void *owner = nullptr;  // the transport's connection
    std::string name;       // the peer's address, for the log
    std::string in;    // received bytes not yet parsed
    bool open = false;
    bool said_hello = false;  // a first complete frame came
    bool admitted = false;
    std::string nonce;  // the challenge sent with HELLO (token only)
    bool held = false;
    uint8_t held_op = 0;
    std::vector<std::string> held_keys;
    int64_t opened_ms = 0;
    int64_t last_byte_ms = 0;
};

class StoreCore {
  public:
    // What the core asks of its transport. send() queues a frame to the peer; close()
    // ends the connection after the frames queued so far (the core has forgotten the
    // peer already). A send that fails may forget() the peer at once.
    class Transport {
      public:
        virtual ~Transport() = default;
        virtual void send(StorePeer *peer, std::string frame) = 0;
        virtual void close(StorePeer *peer) = 0;
    };

    struct Stats {
        size_t peers = 0, admitted = 0, keys = 0, stored_bytes = 0, buffered_bytes = 0;
        size_t peak_buffered_bytes = 0;  // the most buffered_bytes ever was
        uint64_t refused = 0;            // peers dropped for what they sent or failed to send
    };

    // `token` empty: HELLO admits. `id`: what HELLO answers (tcp_store_server.h).
    StoreCore(uint64_t id, std::string token, StoreLimits limits, Transport *transport);

    void open(StorePeer *peer, int64_t now_ms);
    // Bytes from the peer: buffered, parsed and answered as far as they go.
    void receive(StorePeer *peer, const char *data, size_t n, int64_t now_ms);
    // The connection has gone; the core lets go of the peer. Idempotent.
    void forget(StorePeer *peer);
    // Drops the peers whose first frame, handshake or incomplete request is past its time.
    void sweep(int64_t now_ms);
    // Sends the peer an error it will show (`message`) and closes it.
    void turn_away(StorePeer *peer, const std::string &message) { refuse(peer, message); }

    Stats stats() const;
    // "" if every invariant above holds, else the first that does not.
    std::string audit() const;

  private:
    void drop(StorePeer *p, const std::string &why);
    void refuse(StorePeer *p, const std::string &message);
    void process(StorePeer *p);
    bool handle(StorePeer *p, const std::string &body);
    bool handle_hello(StorePeer *p, wire::Reader &r);
    bool handle_auth(StorePeer *p, wire::Reader &r);
    bool handle_erase(StorePeer *p, wire::Reader &r, bool prefix);
    bool store(StorePeer *p, const std::string &key, std::string value);
    bool all_present(const std::vector<std::string> &keys) const;
    bool examine(StorePeer *p);
    void notify(const std::string &key);
    void unwatch(StorePeer *p);

    const uint64_t id_;
    const std::string token_;
    const StoreLimits limits_;
    Transport *const transport_;
    std::map<std::string, std::string> data_;
    std::unordered_map<std::string, std::unordered_set<StorePeer *>> watchers_;
    std::unordered_set<StorePeer *> peers_;
    size_t stored_bytes_ = 0;
    size_t buffered_bytes_ = 0;
    size_t peak_buffered_ = 0;
    uint64_t refused_ = 0;
};

}  // namespace rdzv
}  // namespace sx
