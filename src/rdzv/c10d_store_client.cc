// A client of torch's c10d TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp), the
// store torchrun's agent serves on MASTER_ADDR:MASTER_PORT for its workers. It speaks
// torch's wire protocol, written from torch's sources and checked against both server
// backends of torch 2.15 (libuv, the default, and the classic one) by
// tests/rdzv/test_c10d_store.cc. It needs none of torch's libraries.
//
// The protocol. Integers are little-endian (torch sends them in host order; sx builds
// for little-endian hosts only). A string, key or value, is a u64 length and its bytes.
// A request is a u8 command and its arguments; the commands sx uses:
//   VALIDATE   0   u32 0x3C85F7CE          -> nothing
//   SET        1   key, value              -> nothing
//   GET        3   key                     -> value
//   ADD        4   key, i64 delta          -> i64 the new value (stored as decimal text)
//   CHECK      5   u64 n, n keys           -> u8 0 if all exist, 1 if not
//   WAIT       6   u64 n, n keys           -> u8 0 once all exist (held until then)
//   DELETE_KEY 8   key                     -> i64 how many were removed (0 or 1)
//   PING       13  u32 nonce               -> u32 the same nonce
//   LIST_KEYS  17  nothing                 -> i64 n, n keys
// A connection's first request must be VALIDATE: the libuv server ignores a connection
// that starts otherwise, the classic one closes it. Neither answers VALIDATE, so a PING
// follows it, and its echo proves the peer is a c10d store that accepted us. SET has no
// answer either; a PING sent with it confirms that the server took it. The protocol has
// no error reply: a server closes the connection on a request it rejects (on libuv, a
// key over 8 KiB, a value over 8 MiB or more than 128 Ki keys; ADD to a value that is
// not a number; GET of a missing key on the classic server), so this client refuses
// what libuv would before sending it, and always WAITs before it GETs, as torch's own
// client does. torch's client puts "/" before every key; so does this one, so that a
// key `k` here is `k` to torch's Python API too.
//
// Invariants:
//  - one request at a time per client (mu_), answered before the next is sent;
//  - a timeout or an error in the middle of a request drops the connection (the server
//    forgets a held WAIT when its connection closes); the next request connects afresh,
//    VALIDATE and PING first. A request is never sent twice;
//  - the agent's store lives as long as the job: until the first handshake succeeds,
//    refused connections are retried until the deadline; after it, a refused connection
//    means the store is gone, and fails at once.
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "base/log.h"
#include "rdzv/deadline_socket.h"
#include "rdzv/stores.h"

namespace sx {
namespace rdzv {
namespace {

enum Command : uint8_t {
    kValidate = 0,
    kSet = 1,
    kGet = 3,
    kAdd = 4,
    kCheck = 5,
    kWait = 6,
    kDeleteKey = 8,
    kPing = 13,
    kListKeys = 17,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0;        // CHECK: every key exists
constexpr uint8_t kNotReady = 1;     // CHECK: some key is missing
constexpr uint8_t kStopWaiting = 0;  // WAIT: every key exists

// What torch's libuv server accepts (TCPStoreLibUvBackend.cpp: MAX_STRING_LEN,
// MAX_PAYLOAD_LEN, MAX_KEY_COUNT); the classic server has no limits.
constexpr size_t kMaxKey = 8 * 1024;  // bytes of a key on the wire, its "/" included
constexpr size_t kMaxValue = 8 * 1024 * 1024;
constexpr size_t kMaxKeys = 128 * 1024;
// Larger answers are taken for garbage (a value another client stored on a classic
// server could exceed kMaxValue, but not this).
constexpr uint64_t kMaxAnswer = 1ull << 30;

// A request's bytes.
class Request {
  public:
    explicit Request(Command c) { out_.push_back(static_cast<char>(c)); }
    Request &u32(uint32_t v) { return raw(v, 4); }
    Request &u64(uint64_t v) { return raw(v, 8); }
    Request &i64(int64_t v) { return raw(static_cast<uint64_t>(v), 8); }
    Request &str(const std::string &s) {
        u64(s.size());
        out_.append(s);
        return *this;
    }
    // Another request sent in the same write.
    Request &then(Command c) {
        out_.push_back(static_cast<char>(c));
        return *this;
    }
    const std::string &bytes() const { return out_; }

  private:
    Request &raw(uint64_t v, int n) {
        for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
        return *this;
    }
    std::string out_;
};

uint64_t little_endian(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

class C10dStoreClient final : public Store {
  public:
    C10dStoreClient(std::string host, int port, Millis timeout)
        : host_(std::move(host)),
          port_(port),
          timeout_(timeout),
          sock_("the torch TCPStore at " + where()),
          nonce_(static_cast<uint32_t>(Clock::now().time_since_epoch().count()) ^
                 (static_cast<uint32_t>(::getpid()) << 16)) {}

    Status set(const std::string &key, const std::string &value) override {
        SX_TRY(check_key(key));
        SX_CHECK_ARG(value.size() <= kMaxValue,
                     "rendezvous key '%s': a value of %zu bytes is more than a torch TCPStore takes (%zu)",
                     key.c_str(), value.size(), kMaxValue);
        return call(kSet, "set", key, deadline(timeout_), [&](Request *r) { r->str(wire_key(key)).str(value); },
                    [](Reply &) { return Status::Ok(); });
    }

    Status get(const std::string &key, std::string *value, Millis timeout) override {
        SX_TRY(wait({key}, timeout));
        std::string v;
        SX_TRY(call(kGet, "get", key, deadline(timeout_), [&](Request *r) { r->str(wire_key(key)); },
                    [&](Reply &in) { return in.bytes(&v); }));
        if (value != nullptr) *value = std::move(v);
        return Status::Ok();
    }

    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        if (keys.empty()) return Status::Ok();
        SX_TRY(check_keys(keys));
        Status s = call(kWait, "wait for", keys[0], deadline(timeout), [&](Request *r) { keys_of(r, keys); },
                        [](Reply &in) { return in.byte(kStopWaiting, kStopWaiting); });
        if (s.code() != SX_ERR_TIMEOUT) return s;
        std::string missing = keys[0];
        if (keys.size() > 1) {
            // Name a key that is really missing; a short look, as the server may be stuck.
            for (const std::string &k : keys) {
                bool present = true;
                if (!check_within({k}, Millis(200), &present).ok()) break;
                if (!present) {
                    missing = k;
                    break;
                }
            }
        }
        return SX_ERROR(SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear within %lld ms (%s)", missing.c_str(),
                        static_cast<long long>(timeout.count()), s.message().c_str());
    }

    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        SX_TRY(check_key(key));
        int64_t v = 0;
        Status s = call(kAdd, "add to", key, deadline(timeout_), [&](Request *r) { r->str(wire_key(key)).i64(delta); },
                        [&](Reply &in) { return in.i64(&v); });
        if (s.code() == SX_ERR_COMM) return why_add_failed(key, delta, s);
        SX_TRY(s);
        if (result != nullptr) *result = v;
        return Status::Ok();
    }

    Status check(const std::vector<std::string> &keys, bool *present) override {
        return check_within(keys, timeout_, present);
    }

    Status erase(const std::string &key) override {
        SX_TRY(check_key(key));
        int64_t removed = 0;
        return call(kDeleteKey, "erase", key, deadline(timeout_), [&](Request *r) { r->str(wire_key(key)); },
                    [&](Reply &in) { return in.i64(&removed); });
    }

    // LIST_KEYS, then DELETE_KEY for each key under `prefix`. Not atomic: meant for keys
    // nobody writes any more (a group every rank has left).
    Status erase_prefix(const std::string &prefix) override {
        std::vector<std::string> all;
        SX_TRY(call(kListKeys, "list the keys under", prefix, deadline(timeout_), [](Request *) {},
                    [&](Reply &in) { return in.key_list(&all); }));
        const std::string wire = wire_key(prefix);
        for (const std::string &k : all) {
            if (k.compare(0, wire.size(), wire) == 0) SX_TRY(erase(k.substr(1)));
        }
        return Status::Ok();
    }

    // Connects and shakes hands now, so that a wrong address fails at open.
    Status attach(Clock::time_point dl) {
        std::lock_guard<std::mutex> lock(mu_);
        Failure why = Failure::kNone;
        Status s = ensure_connected(dl, &why);
        if (!s.ok()) sock_.close();
        return s;
    }

    std::string where() const { return host_ + ":" + std::to_string(port_); }

  private:
    // Reads one answer from the socket by a deadline; a failure leaves *why set.
    class Reply {
      public:
        Reply(DeadlineSocket &sock, Clock::time_point dl, Failure *why) : sock_(sock), dl_(dl), why_(why) {}
        Status u32(uint32_t *v) {
            unsigned char b[4];
            SX_TRY(sock_.recv_all(reinterpret_cast<char *>(b), 4, dl_, why_));
            *v = static_cast<uint32_t>(little_endian(b, 4));
            return Status::Ok();
        }
        Status i64(int64_t *v) {
            unsigned char b[8];
            SX_TRY(sock_.recv_all(reinterpret_cast<char *>(b), 8, dl_, why_));
            *v = static_cast<int64_t>(little_endian(b, 8));
            return Status::Ok();
        }
        // One byte, which must be `a` or `b`.
        Status byte(uint8_t a, uint8_t b, uint8_t *v = nullptr) {
            char c = 0;
            SX_TRY(sock_.recv_all(&c, 1, dl_, why_));
            const uint8_t got = static_cast<uint8_t>(c);
            if (got != a && got != b) return malformed("a status byte", got);
            if (v != nullptr) *v = got;
            return Status::Ok();
        }
        Status bytes(std::string *v) {
            int64_t n = 0;
            SX_TRY(i64(&n));
            if (n < 0 || static_cast<uint64_t>(n) > kMaxAnswer) return malformed("a length", static_cast<uint64_t>(n));
            v->resize(static_cast<size_t>(n));
            return n == 0 ? Status::Ok() : sock_.recv_all(&(*v)[0], v->size(), dl_, why_);
        }
        Status key_list(std::vector<std::string> *keys) {
            int64_t n = 0;
            SX_TRY(i64(&n));
            if (n < 0 || static_cast<uint64_t>(n) > kMaxAnswer) return malformed("a key count", static_cast<uint64_t>(n));
            keys->resize(static_cast<size_t>(n));
            for (std::string &k : *keys) SX_TRY(bytes(&k));
            return Status::Ok();
        }

      private:
        Status malformed(const char *what, uint64_t got) {
            *why_ = Failure::kNone;
            return SX_ERROR(SX_ERR_COMM, "%s answered %llu where %s was expected: not a torch TCPStore?",
                            sock_.peer().c_str(), static_cast<unsigned long long>(got), what);
        }
        DeadlineSocket &sock_;
        const Clock::time_point dl_;
        Failure *const why_;
    };

    static Clock::time_point deadline(Millis timeout) { return Clock::now() + std::max(timeout, Millis(0)); }
    static std::string wire_key(const std::string &key) { return "/" + key; }

    static Status check_key(const std::string &key) {
        SX_CHECK_ARG(key.size() + 1 <= kMaxKey,
                     "rendezvous key '%.64s...' of %zu bytes is longer than a torch TCPStore takes (%zu)", key.c_str(),
                     key.size(), kMaxKey - 1);
        return Status::Ok();
    }
    static Status check_keys(const std::vector<std::string> &keys) {
        SX_CHECK_ARG(keys.size() <= kMaxKeys, "%zu rendezvous keys at once are more than a torch TCPStore takes (%zu)",
                     keys.size(), kMaxKeys);
        for (const std::string &k : keys) SX_TRY(check_key(k));
        return Status::Ok();
    }
    static void keys_of(Request *r, const std::vector<std::string> &keys) {
        r->u64(keys.size());
        for (const std::string &k : keys) r->str(wire_key(k));
    }

    Status check_within(const std::vector<std::string> &keys, Millis timeout, bool *present) {
        SX_TRY(check_keys(keys));
        uint8_t v = kNotReady;
        SX_TRY(call(kCheck, "check", keys.empty() ? std::string() : keys[0], deadline(timeout),
                    [&](Request *r) { keys_of(r, keys); }, [&](Reply &in) { return in.byte(kReady, kNotReady, &v); }));
        *present = v == kReady;
        return Status::Ok();
    }

    // The server closed the connection on an ADD: say why when the reason is ours (the
    // value is not a counter), as the other stores do.
    Status why_add_failed(const std::string &key, int64_t delta, const Status &cause) {
        bool present = false;
        std::string old;
        if (check_within({key}, Millis(1000), &present).ok() && present &&
            call(kGet, "get", key, deadline(Millis(1000)), [&](Request *r) { r->str(wire_key(key)); },
                 [&](Reply &in) { return in.bytes(&old); })
                .ok()) {
            int64_t unused = 0;
            SX_TRY(apply_add(key, &old, delta, &unused));
        }
        return cause;
    }

    // Sends one request (the command, what `args` appends, and for SET a PING) and reads
    // its answer with `read`, by `dl`, on a connection made if there is none. Any
    // failure drops the connection; nothing is sent twice.
    template <typename Args, typename Read>
    Status call(Command command, const char *what, const std::string &key, Clock::time_point dl, Args args,
                Read read) {
        std::lock_guard<std::mutex> lock(mu_);
        Failure why = Failure::kNone;
        Status s = ensure_connected(dl, &why);
        if (!s.ok()) {
            sock_.close();
            return s.prefix(format("%s rendezvous key '%s': ", what, key.c_str()));
        }
        Request r(command);
        args(&r);
        const uint32_t nonce = ++nonce_;
        if (command == kSet) r.then(kPing).u32(nonce);  // SET has no answer of its own
        Reply in(sock_, dl, &why);
        s = sock_.send_all(r.bytes().data(), r.bytes().size(), dl, &why);
        if (s.ok()) s = read(in);
        if (s.ok() && command == kSet) s = expect_echo(in, nonce, &why);
        if (s.ok()) return s;
        sock_.close();
        if (why == Failure::kTimeout) {
            return SX_ERROR(SX_ERR_TIMEOUT, "no answer from %s to %s rendezvous key '%s' in time", sock_.peer().c_str(),
                            what, key.c_str());
        }
        if (why == Failure::kConnection) {
            return SX_ERROR(SX_ERR_COMM, "%s rendezvous key '%s': %s (a torch TCPStore closes the connection on a "
                            "request it rejects, and when it stops)",
                            what, key.c_str(), s.message().c_str());
        }
        return s.prefix(format("%s rendezvous key '%s': ", what, key.c_str()));
    }

    Status expect_echo(Reply &in, uint32_t nonce, Failure *why) {
        uint32_t echo = 0;
        SX_TRY(in.u32(&echo));
        if (echo == nonce) return Status::Ok();
        *why = Failure::kNone;
        return SX_ERROR(SX_ERR_COMM, "%s answered PING %u with %u: not a torch TCPStore?", sock_.peer().c_str(), nonce,
                        echo);
    }

    // Connects if not connected, and shakes hands (VALIDATE, PING) on the new connection.
    // A failed handshake is not tried again (it leaves *why kNone); once attached, a
    // refused connection means the store is gone.
    Status ensure_connected(Clock::time_point dl, Failure *why) {
        if (sock_.connected()) return Status::Ok();
        return connect_with_backoff(
            sock_, host_, port_, dl, why, [&] { return handshake(dl, why); },
            [&](const std::string &last_error) {
                return SX_ERROR(SX_ERR_TIMEOUT, "could not reach %s in time (%s); is torchrun's agent (or whatever "
                                "serves the store) running there?",
                                sock_.peer().c_str(), last_error.c_str());
            },
            [&](const Status &failed) {
                if (attached_ && *why == Failure::kRefused) {
                    return SX_ERROR(SX_ERR_COMM, "%s is gone (%s): has torchrun's agent stopped?", sock_.peer().c_str(),
                                    failed.message().c_str());
                }
                return Status::Ok();
            });
    }

    Status handshake(Clock::time_point dl, Failure *why) {
        const uint32_t nonce = ++nonce_;
        Request r(kValidate);
        r.u32(kValidationMagic).then(kPing).u32(nonce);
        Reply in(sock_, dl, why);
        Status s = sock_.send_all(r.bytes().data(), r.bytes().size(), dl, why);
        if (s.ok()) s = expect_echo(in, nonce, why);
        if (!s.ok()) {
            const Failure failed = *why;
            *why = Failure::kNone;  // not a broken request: the peer is not what we expected
            if (failed == Failure::kTimeout) {
                return SX_ERROR(SX_ERR_TIMEOUT, "no answer from %s to the handshake (VALIDATE, PING) in time: is a "
                                "torch TCPStore listening there?",
                                sock_.peer().c_str());
            }
            return SX_ERROR(SX_ERR_COMM, "handshake (VALIDATE, PING) failed: %s; is a torch TCPStore listening there?",
                            s.message().c_str());
        }
        attached_ = true;
        return Status::Ok();
    }

    const std::string host_;
    const int port_;
    const Millis timeout_;

    std::mutex mu_;
    DeadlineSocket sock_;
    uint32_t nonce_;         // the last PING's
    bool attached_ = false;  // a handshake has succeeded once
};

}  // namespace

Status open_c10d_store(const std::string &host, int port, Millis timeout, std::shared_ptr<Store> *out) {
    auto client = std::make_shared<C10dStoreClient>(host, port, timeout);
    SX_TRY(client->attach(Clock::now() + timeout));
    log(SX_LOG_DEBUG, "sx: joined the torch TCPStore at %s", client->where().c_str());
    *out = std::move(client);
    return Status::Ok();
}

}  // namespace rdzv
}  // namespace sx
