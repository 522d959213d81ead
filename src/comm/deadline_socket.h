// A blocking TCP client socket whose every connect, send and receive is bounded by a
// deadline (poll), shared by the clients of the two TCP rendezvous stores: sx's own
// (tcp_store_client.cc) and torch's c10d TCPStore (c10d_store_client.cc).
#pragma once

#include <string>

#include "comm/stores.h"

namespace sx {
namespace comm {

// Why an operation failed, when it did.
enum class Failure {
    kNone,        // not a socket failure (the caller's own check)
    kTimeout,     // the deadline passed
    kRefused,     // nothing listens at the address (every address refused the connection)
    kConnection,  // the connection broke, or could not be made for another reason
};

class DeadlineSocket {
  public:
    // `peer` names the other end in error messages ("the rendezvous server at
    // tcp://h:p").
    explicit DeadlineSocket(std::string peer) : peer_(std::move(peer)) {}
    ~DeadlineSocket() { close(); }
    DeadlineSocket(const DeadlineSocket &) = delete;
    DeadlineSocket &operator=(const DeadlineSocket &) = delete;

    bool connected() const { return fd_ >= 0; }

    // Connects to host:port, trying each address the name resolves to, by `dl`, with
    // TCP_NODELAY. A name that does not exist is SX_ERR_INVALID_ARGUMENT; everything
    // else SX_ERR_COMM, with *why set.
    Status connect(const std::string &host, int port, Clock::time_point dl, Failure *why);

    // Sends, or receives, exactly `n` bytes by `dl`. SX_ERR_TIMEOUT (*why kTimeout) when
    // the deadline passes, SX_ERR_COMM (*why kConnection) when the connection breaks or
    // the peer closes it. Never raises SIGPIPE.
    Status send_all(const char *data, size_t n, Clock::time_point dl, Failure *why);
    Status recv_all(char *data, size_t n, Clock::time_point dl, Failure *why);

    // Closes the connection (a request in flight is abandoned; the peer sees EOF).
    void close();

    const std::string &peer() const { return peer_; }

  private:
    Status io(char *data, size_t n, bool write, Clock::time_point dl, Failure *why);

    const std::string peer_;
    int fd_ = -1;
};

}  // namespace comm
}  // namespace sx
