// The TCP rendezvous server (tcp_store_server.h): one libuv loop on its own thread,
// feeding each connection's bytes to a StoreCore and writing back its frames.
//
// Invariants (the state below is touched by the loop thread only, except during
// construction before the thread starts, and `mu` guards the core for stats()):
//  - a connection is in conns from accept until close_conn, and freed in its close
//    callback, after libuv has finished every write and read on it;
//  - the core forgets a connection before its handle is closed, so it never sends to a
//    closing one.
#include "rdzv/tcp_store_server.h"

#include <netdb.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/log.h"
#include "rdzv/hmac_sha256.h"
#include "base/sigpipe.h"
#include "rdzv/stores.h"

namespace sx {
namespace rdzv {

namespace {

struct Conn {
    uv_tcp_t handle;  // handle.data == this
    TcpStoreServer::Impl *server = nullptr;
    StorePeer peer;
    bool closing = false;
    bool leaving = false;  // being closed or shut down: counted in closing_connections
    int64_t accepted_ms = 0;
};

struct WriteReq {
    uv_write_t req;  // req.data == this
    std::string data;
    Conn *conn;
};

uint64_t random_id() {
    std::random_device rd;
    uint64_t id = 0;
    while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(uv_hrtime());
    return id;
}

int64_t now_ms() { return static_cast<int64_t>(uv_hrtime() / 1000000); }

std::string peer_name(uv_tcp_t *handle) {
    struct sockaddr_storage a;
    int len = sizeof a;
    char text[INET6_ADDRSTRLEN] = "?";
    if (uv_tcp_getpeername(handle, reinterpret_cast<struct sockaddr *>(&a), &len) != 0) return "an unknown peer";
    int port = 0;
    if (a.ss_family == AF_INET6) {
        auto *in6 = reinterpret_cast<struct sockaddr_in6 *>(&a);
        uv_ip6_name(in6, text, sizeof text);
        port = ntohs(in6->sin6_port);
        return "[" + std::string(text) + "]:" + std::to_string(port);
    }
    auto *in4 = reinterpret_cast<struct sockaddr_in *>(&a);
    uv_ip4_name(in4, text, sizeof text);
    port = ntohs(in4->sin_port);
    return std::string(text) + ":" + std::to_string(port);
}

// How often the loop looks for handshakes and incomplete requests past their time.
constexpr uint64_t kSweepMs = 250;
// A connection not admitted this long may give its place to a newcomer at the limit.
constexpr int64_t kMinPendingMs = 100;

}  // namespace

struct TcpStoreServer::Impl final : StoreCore::Transport {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_timer_t sweeper;
    std::thread thread;
    ServerOptions options;
    std::string address;  // what the listener is bound to
    uint64_t id = random_id();
    char read_buf[64 * 1024];
    mutable std::recursive_mutex mu;  // guards core
    std::unique_ptr<StoreCore> core;
    std::unordered_set<Conn *> conns;
    std::atomic<size_t> max_connections{0};
    std::atomic<size_t> open_connections{0};
    std::atomic<size_t> closing_connections{0};  // of the open ones: being closed (their handles not yet gone)
    std::atomic<size_t> peak_connections{0};

    // --- StoreCore::Transport ---

    void send(StorePeer *peer, std::string frame) override {
        Conn *c = conn_of(peer);
        if (c->closing) return;
        WriteReq *w = new WriteReq();
        w->req.data = w;
        w->data = std::move(frame);
        w->conn = c;
        uv_buf_t b = uv_buf_init(&w->data[0], static_cast<unsigned>(w->data.size()));
        int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t *>(&c->handle), &b, 1, on_write);
        if (rc != 0) {
            delete w;
            close_conn(c);
        }
    }

    // Closing after the frames queued so far: uv_close would cancel writes still pending,
    // and the client would not see why it was refused; a shutdown request waits for them.
    void close(StorePeer *peer) override {
        Conn *c = conn_of(peer);
        if (c->closing) return;
        leave(c);
        uv_shutdown_t *req = new uv_shutdown_t();
        req->data = c;
        uv_read_stop(reinterpret_cast<uv_stream_t *>(&c->handle));
        if (uv_shutdown(req, reinterpret_cast<uv_stream_t *>(&c->handle), on_shutdown) != 0) {
            delete req;
            close_conn(c);
        }
    }

    static void on_shutdown(uv_shutdown_t *req, int) {
        Conn *c = static_cast<Conn *>(req->data);
        delete req;
        c->server->close_conn(c);
    }

    static Conn *conn_of(StorePeer *peer) { return static_cast<Conn *>(peer->owner); }

    // --- connections ---

    static void on_connection(uv_stream_t *listener, int status) {
        Impl *self = static_cast<Impl *>(listener->data);
        if (status < 0) {
            log(SX_LOG_WARN, "sx: rendezvous server on port %d: accept failed: %s", self->options.port,
                uv_strerror(status));
            return;
        }
        Conn *c = new Conn();
        c->server = self;
        c->handle.data = c;
        c->peer.owner = c;
        uv_tcp_init(&self->loop, &c->handle);
        self->conns.insert(c);
        // The live ones: those being closed have given up their place already.
        const size_t open = self->open_connections.fetch_add(1) + 1 - self->closing_connections.load();
        if (open > self->peak_connections.load()) self->peak_connections.store(open);
        if (uv_accept(listener, reinterpret_cast<uv_stream_t *>(&c->handle)) != 0) {
            self->close_conn(c);
            return;
        }
        c->peer.name = peer_name(&c->handle);
        c->accepted_ms = now_ms();
        uv_tcp_nodelay(&c->handle, 1);
        {
            std::lock_guard<std::recursive_mutex> lock(self->mu);
            self->core->open(&c->peer, c->accepted_ms);
        }
        // At the limit, the newcomer takes the place of the oldest connection still not
        // admitted (a rank is admitted within milliseconds of connecting: one that has
        // been waiting longer is not a rank at work), so that connections held open by
        // strangers cannot keep the ranks out. Where every connection is admitted, the
        // newcomer is told that the server is full.
        if (open > self->max_connections.load() && !self->evict_oldest_unadmitted(c)) {
            log(SX_LOG_WARN, "sx: rendezvous server on port %d: refusing %s: %zu connections open, all admitted",
                self->options.port, c->peer.name.c_str(), open - 1);
            std::lock_guard<std::recursive_mutex> lock(self->mu);
            self->core->turn_away(&c->peer,
                                  format("the rendezvous server on port %d is saturated: %zu connections of admitted "
                                         "clients are open, the most it keeps for a group of %d ranks",
                                         self->options.port, open - 1, self->options.world_size));
            return;
        }
        uv_read_start(reinterpret_cast<uv_stream_t *>(&c->handle), on_alloc, on_read);
    }

    // Closes the connection not admitted yet that came first (but `newcomer`), if it has
    // waited at least kMinPendingMs: one that has not said HELLO first (a client says it
    // as soon as it connects; one that did is busy with its handshake); false if there is
    // none.
    bool evict_oldest_unadmitted(Conn *newcomer) {
        Conn *oldest = nullptr;
        {
            std::lock_guard<std::recursive_mutex> lock(mu);
            for (Conn *c : conns) {
                if (c == newcomer || c->leaving || c->peer.admitted) continue;
                const bool before = !oldest || (c->peer.said_hello != oldest->peer.said_hello
                                                    ? !c->peer.said_hello
                                                    : c->accepted_ms < oldest->accepted_ms);
                if (before) oldest = c;
            }
        }
        if (!oldest || now_ms() - oldest->accepted_ms < kMinPendingMs) return false;
        log(SX_LOG_WARN, "sx: rendezvous server on port %d: closing %s, not admitted after %lld ms, to make room",
            options.port, oldest->peer.name.c_str(), static_cast<long long>(now_ms() - oldest->accepted_ms));
        close_conn(oldest);
        return true;
    }

    static void on_alloc(uv_handle_t *handle, size_t, uv_buf_t *buf) {
        Impl *self = static_cast<Conn *>(handle->data)->server;
        *buf = uv_buf_init(self->read_buf, sizeof self->read_buf);
    }

    static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
        Conn *c = static_cast<Conn *>(stream->data);
        Impl *self = c->server;
        if (nread < 0) {  // UV_EOF included: the client left or gave up waiting
            self->close_conn(c);
            return;
        }
        std::lock_guard<std::recursive_mutex> lock(self->mu);
        self->core->receive(&c->peer, buf->base, static_cast<size_t>(nread), now_ms());
    }

    static void on_close(uv_handle_t *handle) {
        Conn *c = static_cast<Conn *>(handle->data);
        c->server->open_connections.fetch_sub(1);
        c->server->closing_connections.fetch_sub(1);
        delete c;
    }

    // The connection gives up its place (once): it is being shut down or closed.
    void leave(Conn *c) {
        if (c->leaving) return;
        c->leaving = true;
        closing_connections.fetch_add(1);
    }

    void close_conn(Conn *c) {
        if (c->closing) return;
        c->closing = true;
        leave(c);
        {
            // Also reached from inside the core (a send that fails), hence the recursive mutex.
            std::lock_guard<std::recursive_mutex> lock(mu);
            core->forget(&c->peer);
        }
        conns.erase(c);
        uv_close(reinterpret_cast<uv_handle_t *>(&c->handle), on_close);
    }

    static void on_write(uv_write_t *req, int status) {
        WriteReq *w = static_cast<WriteReq *>(req->data);
        if (status < 0) w->conn->server->close_conn(w->conn);
        delete w;
    }

    static void on_sweep(uv_timer_t *timer) {
        Impl *self = static_cast<Impl *>(timer->data);
        std::lock_guard<std::recursive_mutex> lock(self->mu);
        self->core->sweep(now_ms());
    }

    // --- lifetime ---

    static void on_stop(uv_async_t *async) {
        Impl *self = static_cast<Impl *>(async->data);
        uv_close(reinterpret_cast<uv_handle_t *>(&self->listener), nullptr);
        uv_close(reinterpret_cast<uv_handle_t *>(&self->sweeper), nullptr);
        std::vector<Conn *> all(self->conns.begin(), self->conns.end());
        for (Conn *c : all) self->close_conn(c);
        uv_close(reinterpret_cast<uv_handle_t *>(&self->stop), nullptr);
    }

    void run() {
        SigpipeBlock no_sigpipe;  // a client gone mid-reply must not end the process
        uv_run(&loop, UV_RUN_DEFAULT);
    }

    // Closes the listener of a server that never started its thread.
    void close_unstarted() {
        uv_close(reinterpret_cast<uv_handle_t *>(&listener), nullptr);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
};

namespace {

struct ServerRegistry {
    std::mutex mu;
    std::map<int, std::weak_ptr<TcpStoreServer>> servers;
};

ServerRegistry &server_registry() {
    static ServerRegistry *r = new ServerRegistry();  // never destroyed (see local_store.cc)
    return *r;
}

size_t connection_limit(int world_size) {
    return 2 * static_cast<size_t>(std::max(world_size, 1)) + TcpStoreServer::kSpareConnections;
}

// The address family of `host`'s first address (AF_INET if it does not resolve).
int family_of(const std::string &host) {
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo *res = nullptr;
    int family = AF_INET;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) family = res->ai_family;
    if (res != nullptr) ::freeaddrinfo(res);
    return family;
}

std::string address_text(const struct sockaddr *a) {
    char text[INET6_ADDRSTRLEN] = "?";
    if (a->sa_family == AF_INET6) {
        uv_ip6_name(reinterpret_cast<const struct sockaddr_in6 *>(a), text, sizeof text);
    } else {
        uv_ip4_name(reinterpret_cast<const struct sockaddr_in *>(a), text, sizeof text);
    }
    return text;
}

bool is_loopback(const struct sockaddr *a) {
    if (a->sa_family == AF_INET)
        return (ntohl(reinterpret_cast<const struct sockaddr_in *>(a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr &in6 = reinterpret_cast<const struct sockaddr_in6 *>(a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(&in6);
    }
    return false;
}

// Binds the listener as options.bind says; returns the error text, or "".
std::string bind_listener(TcpStoreServer::Impl *impl, const ServerOptions &o) {
    struct sockaddr_storage addr;
    if (o.bind == "*") {
        if (family_of(o.host) == AF_INET6) {
            uv_ip6_addr("::", o.port, reinterpret_cast<struct sockaddr_in6 *>(&addr));
        } else {
            uv_ip4_addr("0.0.0.0", o.port, reinterpret_cast<struct sockaddr_in *>(&addr));
        }
        // libuv sets SO_REUSEADDR on bind, so a port left in TIME_WAIT by an earlier run
        // can be served again at once.
        int rc = uv_tcp_bind(&impl->listener, reinterpret_cast<const struct sockaddr *>(&addr), 0);
        if (rc != 0) return uv_strerror(rc);
        impl->address = address_text(reinterpret_cast<const struct sockaddr *>(&addr));
        return "";
    }
    const std::string &name = o.bind.empty() ? o.host : o.bind;
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *res = nullptr;
    const std::string service = std::to_string(o.port);
    int rc = ::getaddrinfo(name.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) return std::string("cannot resolve '") + name + "': " + ::gai_strerror(rc);
    std::string error = "no address";
    for (struct addrinfo *ai = res; ai != nullptr; ai = ai->ai_next) {
        rc = uv_tcp_bind(&impl->listener, ai->ai_addr, 0);
        if (rc == 0) {
            impl->address = address_text(ai->ai_addr);
            if (o.bind.empty() && is_loopback(ai->ai_addr) && name != "localhost" && name.compare(0, 4, "127.") != 0 &&
                name != "::1")
                log(SX_LOG_WARN,
                    "sx: the rendezvous host '%s' is %s on this host, a loopback address: ranks on other hosts cannot "
                    "reach the server there (set sx_group_config_t.rendezvous_bind or SX_RENDEZVOUS_BIND to an "
                    "address of this host, or to \"*\" for every interface)",
                    name.c_str(), impl->address.c_str());
            break;
        }
        error = uv_strerror(rc);
    }
    ::freeaddrinfo(res);
    return impl->address.empty() ? error : "";
}

}  // namespace

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() {
    uv_async_send(&impl_->stop);
    impl_->thread.join();
    int rc = uv_loop_close(&impl_->loop);
    if (rc != 0)
        log(SX_LOG_WARN, "sx: rendezvous server on port %d: loop close: %s", impl_->options.port, uv_strerror(rc));
}

uint64_t TcpStoreServer::id() const { return impl_->id; }

StoreCore::Stats TcpStoreServer::stats() const {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    return impl_->core->stats();
}

size_t TcpStoreServer::connections() const {
    return impl_->open_connections.load() - impl_->closing_connections.load();
}
size_t TcpStoreServer::peak_connections() const { return impl_->peak_connections.load(); }
std::string TcpStoreServer::bound_address() const { return impl_->address; }

Status TcpStoreServer::acquire(const ServerOptions &options, std::shared_ptr<TcpStoreServer> *out) {
    const int port = options.port;
    ServerRegistry &reg = server_registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto found = reg.servers.find(port);
    if (found != reg.servers.end()) {
        if (std::shared_ptr<TcpStoreServer> live = found->second.lock()) {
            const ServerOptions &o = live->impl_->options;
            SX_CHECK_ARG(equal_in_constant_time(o.token, options.token) && o.bind == options.bind && o.host == options.host,
                         "this process already serves a rendezvous on port %d with another token, host or bind "
                         "address; groups sharing a port must agree on them",
                         port);
            size_t want = connection_limit(options.world_size);
            if (want > live->impl_->max_connections.load()) live->impl_->max_connections.store(want);
            *out = std::move(live);
            return Status::Ok();
        }
    }

    std::unique_ptr<Impl> impl(new Impl());
    impl->options = options;
    impl->max_connections = connection_limit(options.world_size);
    impl->core.reset(new StoreCore(impl->id, options.token, options.limits, impl.get()));
    int rc = uv_loop_init(&impl->loop);
    SX_CHECK(rc == 0, SX_ERR_COMM, "cannot start the rendezvous server: uv_loop_init: %s", uv_strerror(rc));
    uv_tcp_init(&impl->loop, &impl->listener);
    impl->listener.data = impl.get();
    std::string error = bind_listener(impl.get(), options);
    if (error.empty()) {
        // A backlog for every rank at once (the kernel caps it at net.core.somaxconn):
        // ranks start together, and a connection past the backlog waits a second or more
        // for its SYN to be sent again.
        const int backlog = static_cast<int>(std::min<size_t>(std::max<size_t>(128, impl->max_connections), 65535));
        rc = uv_listen(reinterpret_cast<uv_stream_t *>(&impl->listener), backlog, Impl::on_connection);
        if (rc != 0) error = uv_strerror(rc);
    }
    if (!error.empty()) {
        impl->close_unstarted();
        const std::string where = options.bind.empty() ? options.host : options.bind;
        return SX_ERROR(SX_ERR_COMM,
                        "cannot serve the rendezvous on %s port %d: %s (is another job or an earlier run using "
                        "this port? is '%s' an address of this host?)",
                        where.c_str(), port, error.c_str(), where.c_str());
    }
    uv_async_init(&impl->loop, &impl->stop, Impl::on_stop);
    impl->stop.data = impl.get();
    uv_timer_init(&impl->loop, &impl->sweeper);
    impl->sweeper.data = impl.get();
    uv_timer_start(&impl->sweeper, Impl::on_sweep, kSweepMs, kSweepMs);
    Impl *raw = impl.get();
    impl->thread = std::thread([raw] { raw->run(); });

    // The deleter stops the server under the registry lock, so that a new server for
    // the same port binds only once the old one has let go of it.
    std::shared_ptr<TcpStoreServer> server(new TcpStoreServer(std::move(impl)), [port](TcpStoreServer *s) {
        ServerRegistry &r = server_registry();
        std::lock_guard<std::mutex> l(r.mu);
        delete s;
        auto e = r.servers.find(port);
        if (e != r.servers.end() && e->second.expired()) r.servers.erase(e);
    });
    reg.servers[port] = server;
    log(SX_LOG_DEBUG, "sx: rendezvous server listening on %s port %d%s", server->bound_address().c_str(), port,
        options.token.empty() ? "" : " (token required)");
    *out = std::move(server);
    return Status::Ok();
}

}  // namespace rdzv
}  // namespace sx
