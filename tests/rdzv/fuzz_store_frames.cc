// Fuzz target for the TCP rendezvous store's frame parser and state machine (StoreCore,
// tcp_store_core.h), without sockets. The input is a script for four connections:
//   byte 0: bit 0 set = the server has a token;
//   then records [what][n][n bytes]: what & 3 names the connection, (what >> 2) & 3 says
//     0: the n bytes arrive on it,
//     1: n * 40 ms pass and the server sweeps its timeouts,
//     2: it closes (a new one takes its place),
//     3: it says HELLO and, with a token, answers the challenge correctly (so that
//        mutations reach what only an admitted client may do).
// Small limits make the caps bite. After every record the core's invariants must hold
// (StoreCore::audit), and every frame it sends must be a well-formed reply: otherwise
// the target aborts. (rdzv_store_frames_corpus replays tests/rdzv/store_corpus through
// this entry point in every build.)
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "rdzv/tcp_store_core.h"

namespace {

using sx::rdzv::StoreCore;
using sx::rdzv::StorePeer;
namespace wire = sx::rdzv::wire;

const char kToken[] = "fuzz-token";

void check(bool ok, const char *what, const std::string &detail = "") {
    if (ok) return;
    std::fprintf(stderr, "fuzz_store_frames: %s %s\n", what, detail.c_str());
    std::abort();
}

struct Transport final : StoreCore::Transport {
    std::set<StorePeer *> closed;
    std::map<StorePeer *, std::string> last;
    void send(StorePeer *p, std::string frame) override {
        check(closed.count(p) == 0, "a frame sent to a closed connection");
        check(frame.size() >= 5 && wire::frame_length(frame.data()) == frame.size() - 4, "a malformed frame");
        const uint8_t status = static_cast<uint8_t>(frame[4]);
        check(status == wire::kOk || status == wire::kError, "an unknown reply status");
        if (status == wire::kError) {
            wire::Reader r(frame.data() + 5, frame.size() - 5);
            r.str();
            check(r.done(), "an error reply that is not one string");
        }
        last[p] = frame.substr(4);
    }
    void close(StorePeer *p) override { closed.insert(p); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const bool token = (data[0] & 1) != 0;
    sx::rdzv::StoreLimits limits;
    limits.max_keys = 16;
    limits.max_bytes = 4096;
    limits.max_buffered = 8192;
    limits.max_frame = 2048;
    limits.pre_admission_frame = 96;
    limits.handshake_ms = 1000;
    limits.idle_frame_ms = 500;
    Transport t;
    std::unique_ptr<StoreCore> core(new StoreCore(1, token ? kToken : "", limits, &t));
    std::vector<std::unique_ptr<StorePeer>> all;  // every peer ever opened, kept to the end
    StorePeer *peers[4];
    int64_t now = 0;
    auto fresh = [&](int i) {
        all.emplace_back(new StorePeer());
        peers[i] = all.back().get();
        core->open(peers[i], now);
    };
    for (int i = 0; i < 4; ++i) fresh(i);
    size_t pos = 1;
    while (pos + 2 <= size) {
        const uint8_t what = data[pos];
        const size_t n = std::min<size_t>(data[pos + 1], size - pos - 2);
        const char *bytes = reinterpret_cast<const char *>(data + pos + 2);
        pos += 2 + n;
        const int i = what & 3;
        if (t.closed.count(peers[i])) fresh(i);
        StorePeer *p = peers[i];
        switch ((what >> 2) & 3) {
        case 0:
            core->receive(p, bytes, n, now);
            break;
        case 1:
            now += static_cast<int64_t>(n) * 40;
            core->sweep(now);
            break;
        case 2:
            core->forget(p);
            t.closed.insert(p);
            break;
        case 3: {
            const std::string hello = wire::Writer().u8(wire::kHello).frame();
            core->receive(p, hello.data(), hello.size(), now);
            if (token && !t.closed.count(p)) {
                wire::Reader r(t.last[p].data(), t.last[p].size());
                r.u8();
                r.u64();
                r.u8();
                const std::string nonce = r.str();
                const std::string mine(wire::kNonceBytes, 'n');
                const std::string auth =
                    wire::Writer().u8(wire::kAuth).str(mine).str(wire::client_proof(kToken, nonce, mine)).frame();
                core->receive(p, auth.data(), auth.size(), now);
            }
            break;
        }
        }
        const std::string a = core->audit();
        check(a.empty(), "invariant broken:", a);
    }
    for (auto &p : all) core->forget(p.get());
    check(core->stats().peers == 0 && core->stats().buffered_bytes == 0, "peers left after every one closed");
    return 0;
}
