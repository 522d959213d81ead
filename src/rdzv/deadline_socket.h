// A blocking TCP client socket whose every connect, send and receive is bounded by a
// deadline (poll), and the loop that connects it with backoff, shared by the clients of
// the two TCP rendezvous stores: sx's own (tcp_store_client.cc) and torch's c10d
// TCPStore (c10d_store_client.cc).
#pragma once

#include <functional>
#include <string>

#include "rdzv/stores.h"

namespace sx {
namespace rdzv {

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

// Connects `sock` to host:port and greets the new connection, trying again until `dl`:
// the way both clients (re)connect. The pause after a failed try is 10 ms at first and
// doubles after each, up to 250 ms, never reaching past `dl`. Each try:
//  - sock.connect(): SX_ERR_INVALID_ARGUMENT (a name that does not resolve) is returned
//    as it is; any other error is a failed try;
//  - once connected, greet() (the client's handshake on the new connection): SX_OK ends
//    the loop and is returned, the socket connected. On an error the socket is closed;
//    SX_ERR_COMM with *why other than kNone (the connection broke) is a failed try, and
//    any other error is returned as it is (a greeting that sets *why to kNone is never
//    tried again).
// After each failed try, stop(that try's error), where given: an error it returns is
// returned at once. Then if `dl` has passed, *why becomes kNone and out_of_time(the
// failed try's message) is returned. *why is otherwise left as the last try set it.
Status connect_with_backoff(DeadlineSocket &sock, const std::string &host, int port, Clock::time_point dl,
                            Failure *why, const std::function<Status()> &greet,
                            const std::function<Status(const std::string &last_error)> &out_of_time,
                            const std::function<Status(const Status &failed)> &stop = nullptr);

}  // namespace rdzv
}  // namespace sx
