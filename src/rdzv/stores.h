// The store implementations behind open_store (rendezvous.h). Each is thread-safe:
// any number of threads may call any method at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rdzv/store.h"

namespace sx {
namespace rdzv {

// add(key, delta) on a stored value (`old` null when the key is absent): *value is the
// new counter, to be stored as std::to_string(*value). SX_ERR_INVALID_STATE when the
// stored value is not a counter, SX_ERR_INVALID_ARGUMENT on int64 overflow.
Status apply_add(const std::string &key, const std::string *old, int64_t delta, int64_t *value);

// local://NAME: the in-process store shared by every group of this process that names
// NAME. It lives while any returned pointer does; the next open after that starts empty.
std::shared_ptr<Store> open_local_store(const std::string &name);

// file:///DIR: one file per key in `dir` (created with its parents if missing).
// `lock_timeout` bounds how long add() waits for another process holding the key's lock.
Status open_file_store(const std::string &dir, Millis lock_timeout, std::shared_ptr<Store> *out);

struct ServerOptions;  // tcp_store_server.h

// tcp://HOST:PORT (options.host, options.port). With `serve` (rank 0, unless the
// sx-rendezvous command serves) this process also runs the libuv server on PORT, bound
// and guarded as `options` says (shared by every group of this process on that port,
// stopped when the last one is gone). Every client answers the server's challenge with
// options.token, if the server has one. Every rank, rank 0 included, talks to the server
// as a client. `group` is the caller's group number on this rendezvous (key_space.cc):
// the rank that `announces` (rank 0) names that group on the server it reached, and every
// client waits for that, so a rank that reaches a server about to shut down (rank 0
// leaving an earlier group) never writes into it. `timeout` bounds connecting and every
// request without a timeout of its own.
Status open_tcp_store(const ServerOptions &options, bool serve, bool announces, int64_t group, Millis timeout,
                      std::shared_ptr<Store> *out);

// A client of torch's c10d TCPStore at host:port (c10d_store_client.cc): env:// under
// torchrun joins the store torchrun's agent serves there. Connects, retrying until
// `timeout` while nothing listens, and checks that the server answers as a c10d store
// does (SX_ERR_COMM or SX_ERR_TIMEOUT naming the address if not). `timeout` bounds every
// request without a timeout of its own. Keys are at most 8191 bytes, values at most
// 8 MiB (SX_ERR_INVALID_ARGUMENT beyond: torch's libuv server refuses them).
// erase_prefix lists every key of the server and removes those under the prefix.
Status open_c10d_store(const std::string &host, int port, Millis timeout, std::shared_ptr<Store> *out);

}  // namespace rdzv
}  // namespace sx
