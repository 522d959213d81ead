// The TCP rendezvous client: a blocking socket with a poll()-bounded wait on every
// read and write (deadline_socket.h), so that every request returns by its deadline.
//
// Invariants:
//  - one request at a time per client (mu_), at most one outstanding on the socket;
//  - after a timeout or an error in the middle of a request the connection is dropped
//    (the server may still answer it later), and the next request connects afresh;
//  - once pinned, the client talks only to the server instance it attached to: a new
//    connection that reaches a different instance (rank 0 restarted its server, so the
//    keys written so far are gone) fails with SX_ERR_COMM.
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "rdzv/deadline_socket.h"
#include "rdzv/hmac_sha256.h"
#include "rdzv/stores.h"
#include "rdzv/tcp_store_protocol.h"
#include "rdzv/tcp_store_server.h"

namespace sx {
namespace rdzv {
namespace {

class TcpStoreClient final : public Store {
  public:
    TcpStoreClient(std::string host, int port, std::string token, Millis timeout,
                   std::shared_ptr<TcpStoreServer> server)
        : host_(std::move(host)),
          port_(port),
          token_(std::move(token)),
          timeout_(timeout),
          server_(std::move(server)),
          sock_("the rendezvous server at " + where()) {}

    Status set(const std::string &key, const std::string &value) override {
        // 9 bytes: the op and the two lengths.
        SX_CHECK_ARG(key.size() + value.size() + 9 <= wire::kMaxFrame,
                     "rendezvous key '%s': a value of %zu bytes is more than the store takes (%u bytes a request)",
                     key.c_str(), value.size(), wire::kMaxFrame);
        std::string reply;
        return call(wire::Writer().u8(wire::kSet).str(key).str(value).frame(), deadline(timeout_), true,
                    &reply, "set", key);
    }

    Status get(const std::string &key, std::string *value, Millis timeout) override {
        std::string reply;
        Status s = call(wire::Writer().u8(wire::kGet).str(key).frame(), deadline(timeout), true, &reply, "get", key);
        if (s.code() == SX_ERR_TIMEOUT) return not_in_time(key, timeout, s);
        SX_TRY(s);
        wire::Reader r(reply.data(), reply.size());
        std::string v = r.str();
        SX_CHECK(r.done(), SX_ERR_COMM, "malformed answer from the rendezvous server at %s", where().c_str());
        if (value != nullptr) *value = std::move(v);
        return Status::Ok();
    }

    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        if (keys.empty()) return Status::Ok();
        wire::Writer w;
        w.u8(wire::kWait).u32(static_cast<uint32_t>(keys.size()));
        for (const std::string &k : keys) w.str(k);
        std::string reply;
        Status s = call(w.frame(), deadline(timeout), true, &reply, "wait for", keys[0]);
        if (s.code() != SX_ERR_TIMEOUT) return s;
        if (keys.size() > 1) {
            // Name a key that is really missing; a short look, as the server may be stuck.
            for (const std::string &k : keys) {
                bool present = true;
                if (!check_within({k}, Millis(200), &present).ok()) break;
                if (!present) return not_in_time(k, timeout, s);
            }
        }
        return not_in_time(keys[0], timeout, s);
    }

    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        std::string reply;
        // Not retried on a new connection once sent: the server may have applied it.
        SX_TRY(call(wire::Writer().u8(wire::kAdd).str(key).i64(delta).frame(), deadline(timeout_), false, &reply,
                    "add to", key));
        wire::Reader r(reply.data(), reply.size());
        int64_t v = r.i64();
        SX_CHECK(r.done(), SX_ERR_COMM, "malformed answer from the rendezvous server at %s", where().c_str());
        if (result != nullptr) *result = v;
        return Status::Ok();
    }

    Status check(const std::vector<std::string> &keys, bool *present) override {
        return check_within(keys, timeout_, present);
    }

    Status erase(const std::string &key) override {
        std::string reply;
        return call(wire::Writer().u8(wire::kErase).str(key).frame(), deadline(timeout_), true, &reply, "erase",
                    key);
    }

    Status erase_prefix(const std::string &prefix) override {
        std::string reply;
        return call(wire::Writer().u8(wire::kErasePrefix).str(prefix).frame(), deadline(timeout_), true, &reply,
                    "erase the keys under", prefix);
    }

    // From now on only server instance `id` is acceptable.
    void pin(uint64_t id) {
        std::lock_guard<std::mutex> lock(mu_);
        pinned_id_ = id;
    }

    // The instance that answered the last request.
    uint64_t server_id() {
        std::lock_guard<std::mutex> lock(mu_);
        return conn_id_;
    }

    std::string where() const { return "tcp://" + host_ + ":" + std::to_string(port_); }

  private:
    Status not_in_time(const std::string &key, Millis timeout, const Status &cause) const {
        return SX_ERROR(SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear within %lld ms (%s)", key.c_str(),
                        static_cast<long long>(timeout.count()), cause.message().c_str());
    }

    static Clock::time_point deadline(Millis timeout) { return Clock::now() + std::max(timeout, Millis(0)); }

    Status check_within(const std::vector<std::string> &keys, Millis timeout, bool *present) {
        wire::Writer w;
        w.u8(wire::kCheck).u32(static_cast<uint32_t>(keys.size()));
        for (const std::string &k : keys) w.str(k);
        std::string reply;
        SX_TRY(call(w.frame(), deadline(timeout), true, &reply, "check", keys.empty() ? "" : keys[0]));
        wire::Reader r(reply.data(), reply.size());
        uint8_t v = r.u8();
        SX_CHECK(r.done(), SX_ERR_COMM, "malformed answer from the rendezvous server at %s", where().c_str());
        *present = v != 0;
        return Status::Ok();
    }

    // Sends one request and reads its answer (the reply payload after the status
    // byte), reconnecting as needed until `dl`. A request that may be repeated
    // (`idempotent`) is sent again on a new connection if the old one broke.
    Status call(const std::string &request, Clock::time_point dl, bool idempotent, std::string *payload,
                const char *what, const std::string &key) {
        std::lock_guard<std::mutex> lock(mu_);
        Millis backoff(10);
        for (;;) {
            Failure why = Failure::kNone;
            Status s = ensure_connected(dl, &why);
            if (!s.ok()) return s.prefix(format("%s '%s': ", what, key.c_str()));
            bool sent = false;
            std::string body;
            s = exchange(request, dl, &sent, &body, &why);
            if (s.ok()) {
                wire::Reader r(body.data(), body.size());
                uint8_t status = r.u8();
                if (status == wire::kOk && r.ok()) {
                    *payload = body.substr(1);
                    return Status::Ok();
                }
                std::string message = r.str();
                return SX_ERROR(r.ok() ? SX_ERR_INVALID_STATE : SX_ERR_COMM, "rendezvous server at %s: %s",
                                where().c_str(), r.ok() ? message.c_str() : "malformed answer");
            }
            drop();
            if (why == Failure::kTimeout || time_left(dl).count() == 0) {
                return SX_ERROR(SX_ERR_TIMEOUT, "no answer from the rendezvous server at %s to %s '%s' in time",
                                where().c_str(), what, key.c_str());
            }
            if (sent && !idempotent) {
                return SX_ERROR(SX_ERR_COMM,
                                "lost the connection to the rendezvous server at %s during a request to %s '%s': %s",
                                where().c_str(), what, key.c_str(), s.message().c_str());
            }
            log(SX_LOG_DEBUG, "sx: rendezvous %s: %s; reconnecting", where().c_str(), s.message().c_str());
            std::this_thread::sleep_for(std::min(backoff, time_left(dl)));
            backoff = std::min(backoff * 2, Millis(250));
        }
    }

    // Connects if not connected: retries refused/unreachable connects until `dl`.
    Status ensure_connected(Clock::time_point dl, Failure *why) {
        if (sock_.connected()) return Status::Ok();
        const std::string refused_before = refusal_;
        // Out of time after the server turned connections away: that is the reason, not
        // a missing rank 0.
        auto turned_away = [&]() -> Status {
            return SX_ERROR(SX_ERR_TIMEOUT,
                            "could not get a connection to the rendezvous server at %s in time: it turned this "
                            "rank's connections away (%s)",
                            where().c_str(), refusal_.c_str());
        };
        return connect_with_backoff(
            sock_, host_, port_, dl, why,
            [&] {
                Status s = hello(dl, why);
                if (s.code() == SX_ERR_TIMEOUT && refusal_ != refused_before) return turned_away();
                return s;
            },
            [&](const std::string &last_error) {
                if (refusal_ != refused_before) return turned_away();
                return SX_ERROR(SX_ERR_TIMEOUT,
                                "could not reach the rendezvous server at %s in time (%s); is rank 0 running?",
                                where().c_str(), last_error.c_str());
            });
    }

    // HELLO on a fresh connection: learns the server instance and checks the pin; with a
    // token, answers the server's challenge and checks the server's proof in turn
    // (tcp_store_protocol.h). A token refused or missing is SX_ERR_INVALID_ARGUMENT, with
    // *why kNone: connecting again cannot help.
    Status hello(Clock::time_point dl, Failure *why) {
        bool sent = false;
        std::string body;
        SX_TRY(exchange(wire::Writer().u8(wire::kHello).frame(), dl, &sent, &body, why));
        wire::Reader r(body.data(), body.size());
        uint8_t status = r.u8();
        if (status == wire::kError) {
            // The server turned this connection away (it is saturated): said in words, and
            // kept, so that a rank that never gets in is told why rather than that rank 0
            // did not come. Connecting again may succeed once it has room.
            std::string text = r.str();
            if (r.done()) {
                *why = Failure::kConnection;
                refusal_ = text;
                return SX_ERROR(SX_ERR_COMM, "the rendezvous server at %s turned this connection away: %s",
                                where().c_str(), text.c_str());
            }
        }
        uint64_t id = r.u64();
        uint8_t wants_token = r.u8();
        std::string nonce = r.str();
        if (status != wire::kOk || !r.done()) {
            *why = Failure::kNone;
            return SX_ERROR(SX_ERR_COMM, "%s answered HELLO with something else: not an sx %d.%d rendezvous server?",
                            where().c_str(), SX_VERSION_MAJOR, SX_VERSION_MINOR);
        }
        if (wants_token != 0 && token_.empty()) {
            *why = Failure::kNone;
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                            "the rendezvous server at %s requires a token, and this rank has none: set "
                            "sx_group_config_t.rendezvous_token or SX_RENDEZVOUS_TOKEN to rank 0's token",
                            where().c_str());
        }
        if (wants_token == 0 && !token_.empty()) {
            *why = Failure::kNone;
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                            "the rendezvous server at %s asks for no token, but this rank has one: give rank 0 the "
                            "same sx_group_config_t.rendezvous_token or SX_RENDEZVOUS_TOKEN",
                            where().c_str());
        }
        if (wants_token != 0) SX_TRY(authenticate(nonce, dl, why));
        if (pinned_id_ != 0 && id != pinned_id_) {
            *why = Failure::kNone;
            return SX_ERROR(SX_ERR_COMM,
                            "the rendezvous server at %s was restarted (rank 0 left the group?); the keys of "
                            "this group are gone",
                            where().c_str());
        }
        conn_id_ = id;
        return Status::Ok();
    }

    Status authenticate(const std::string &server_nonce, Clock::time_point dl, Failure *why) {
        const std::string client_nonce = wire::random_nonce();
        SX_CHECK(!client_nonce.empty(), SX_ERR_COMM, "cannot draw a random nonce for the rendezvous handshake");
        bool sent = false;
        std::string body;
        SX_TRY(exchange(wire::Writer()
                            .u8(wire::kAuth)
                            .str(client_nonce)
                            .str(wire::client_proof(token_, server_nonce, client_nonce))
                            .frame(),
                        dl, &sent, &body, why));
        wire::Reader r(body.data(), body.size());
        uint8_t status = r.u8();
        std::string text = r.str();
        *why = Failure::kNone;
        if (status == wire::kError && r.done()) {
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "the rendezvous server at %s refused this rank: %s",
                            where().c_str(), text.c_str());
        }
        SX_CHECK(status == wire::kOk && r.done(), SX_ERR_COMM, "malformed answer to AUTH from the rendezvous server at %s",
                 where().c_str());
        SX_CHECK(equal_in_constant_time(text, wire::server_proof(token_, server_nonce, client_nonce)),
                 SX_ERR_INVALID_ARGUMENT,
                 "the rendezvous server at %s could not prove that it holds this rank's token: rank 0 has another "
                 "token, or something else answers at that address",
                 where().c_str());
        return Status::Ok();
    }

    // Writes one frame and reads one frame back, within `dl`. On failure *why says
    // whether the deadline passed or the connection broke; *sent whether the request
    // was handed to the kernel completely.
    Status exchange(const std::string &request, Clock::time_point dl, bool *sent, std::string *body,
                    Failure *why) {
        *sent = false;
        SX_TRY(sock_.send_all(request.data(), request.size(), dl, why));
        *sent = true;
        char header[4];
        SX_TRY(sock_.recv_all(header, 4, dl, why));
        uint32_t n = wire::frame_length(header);
        if (n == 0 || n > wire::kMaxFrame) {
            *why = Failure::kConnection;
            return SX_ERROR(SX_ERR_COMM, "bad frame of %u bytes from %s", n, where().c_str());
        }
        body->resize(n);
        return sock_.recv_all(&(*body)[0], n, dl, why);
    }

    void drop() { sock_.close(); }

    const std::string host_;
    const int port_;
    const std::string token_;  // "" = none; never logged nor put in an error
    const Millis timeout_;
    // Rank 0 only: keeps this process's server up while the client lives.
    const std::shared_ptr<TcpStoreServer> server_;

    std::mutex mu_;
    DeadlineSocket sock_;
    uint64_t conn_id_ = 0;    // server instance of the current connection
    uint64_t pinned_id_ = 0;  // 0 = not pinned yet
    std::string refusal_;     // why the server last turned a connection away ("": never)

  public:
    std::string refusal() {
        std::lock_guard<std::mutex> lock(mu_);
        return refusal_;
    }
};

}  // namespace

Status open_tcp_store(const ServerOptions &options, bool serve, bool announces, int64_t group, Millis timeout,
                      std::shared_ptr<Store> *out) {
    const Clock::time_point dl = Clock::now() + timeout;
    std::shared_ptr<TcpStoreServer> server;
    if (serve) SX_TRY(TcpStoreServer::acquire(options, &server));
    uint64_t served = server ? server->id() : 0;
    auto client = std::make_shared<TcpStoreClient>(options.host, options.port, options.token, timeout, std::move(server));

    // Attach: rank 0 announces group `group` on its server; every rank waits for that
    // announcement on the server it reached, so that nobody writes this group's keys
    // into a server that is about to go away with an earlier group of rank 0.
    const std::string announce = "__sx/server/g" + std::to_string(group);
    if (announces && !serve) {
        // The server of its own (sx-rendezvous): its instance is the one this rank reached.
        bool present = false;
        SX_TRY(client->check({announce}, &present));
        served = client->server_id();
    }
    if (announces) SX_TRY(client->set(announce, std::to_string(served)));
    std::string id;
    Status s = client->get(announce, &id, time_left(dl));
    const std::string refusal = client->refusal();
    if (s.code() == SX_ERR_TIMEOUT && !refusal.empty()) {
        return SX_ERROR(SX_ERR_TIMEOUT, "this rank could not join the rendezvous server %s within %lld ms: it turned "
                        "this rank's connections away (%s)",
                        client->where().c_str(), static_cast<long long>(timeout.count()), refusal.c_str());
    }
    if (s.code() == SX_ERR_TIMEOUT) {
        return SX_ERROR(SX_ERR_TIMEOUT, "rank 0 did not open its group %lld on the rendezvous server %s within %lld ms (%s)",
                        static_cast<long long>(group), client->where().c_str(),
                        static_cast<long long>(timeout.count()), s.message().c_str());
    }
    SX_TRY(s);
    // Another instance announced this group number: the server of some earlier run.
    SX_CHECK(id == std::to_string(client->server_id()), SX_ERR_COMM,
             "the rendezvous server at %s belongs to another run (group %lld was announced by a different "
             "server); is an earlier job still using this port?",
             client->where().c_str(), static_cast<long long>(group));
    client->pin(client->server_id());
    *out = std::move(client);
    return Status::Ok();
}

}  // namespace rdzv
}  // namespace sx
