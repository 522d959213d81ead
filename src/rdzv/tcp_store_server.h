// The TCP rendezvous server that rank 0 runs (tcp://, env://): a libuv loop on its own
// thread serving the protocol of tcp_store_protocol.h through a StoreCore
// (tcp_store_core.h), which holds the keys and enforces admission and the limits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "rdzv/tcp_store_core.h"

namespace sx {
namespace rdzv {

struct ServerOptions {
    int port = 0;
    // The host of the rendezvous (tcp://HOST:PORT, MASTER_ADDR): the other ranks' way
    // here. Unless `bind` says otherwise the server listens on an address it resolves to.
    std::string host;
    // "" = an address `host` resolves to; "*" = every interface (the wildcard address of
    // host's family: IPv6 also takes IPv4 where the system allows dual-stack sockets);
    // otherwise an address (or a name) of this host.
    std::string bind;
    std::string token;  // "" = none: HELLO admits
    // Connections beyond 2 * world_size + kSpareConnections are closed on arrival: every
    // rank of every group on the port holds one, and a group replaced by the next may
    // still hold its own for a moment.
    int world_size = 1;
    StoreLimits limits;
};

class TcpStoreServer {
  public:
    static constexpr int kSpareConnections = 128;

    // This process's server on options.port, started if none runs there. A running one
    // is shared if it has the same token and bind address (SX_ERR_INVALID_ARGUMENT if
    // not); its connection limit grows to fit options.world_size. SX_ERR_COMM if the
    // address cannot be bound, SX_ERR_INVALID_ARGUMENT if it does not resolve. The server
    // stops when the last pointer is released. Thread-safe.
    static Status acquire(const ServerOptions &options, std::shared_ptr<TcpStoreServer> *out);

    // Stops the loop, closes every handle and joins the thread. Clients with requests
    // held see their connection close.
    ~TcpStoreServer();

    // Random, non-zero, fixed for the server's life; HELLO answers it, so a client can
    // tell a restarted server from the one it first reached.
    uint64_t id() const;

    // The store's counters (taken on the loop thread; waits for it).
    StoreCore::Stats stats() const;
    // Connections open now (but those being closed), and the most that were open at once.
    size_t connections() const;
    size_t peak_connections() const;
    // The address it listens on ("127.0.0.1", "::", ...).
    std::string bound_address() const;

    struct Impl;

  private:
    explicit TcpStoreServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace rdzv
}  // namespace sx
