// The deadline-bounded client socket (deadline_socket.h): non-blocking underneath, each
// wait a poll() for the time left.
#include "rdzv/deadline_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace sx {
namespace rdzv {

Status DeadlineSocket::connect(const std::string &host, int port, Clock::time_point dl, Failure *why) {
    close();
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo *res = nullptr;
    const std::string service = std::to_string(port);
    int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) {
        *why = Failure::kConnection;
        // A name that does not exist will not start to; a failing resolver may recover.
        return SX_ERROR(rc == EAI_NONAME ? SX_ERR_INVALID_ARGUMENT : SX_ERR_COMM, "cannot resolve the rendezvous host '%s': %s",
                        host.c_str(), ::gai_strerror(rc));
    }
    std::string error = "no address";
    bool all_refused = res != nullptr;
    for (struct addrinfo *ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            error = std::strerror(errno);
            all_refused = false;
            continue;
        }
        int err = 0;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                struct pollfd p = {fd, POLLOUT, 0};
                int n = ::poll(&p, 1, static_cast<int>(time_left(dl).count()));
                socklen_t len = sizeof err;
                if (n <= 0) {
                    err = ETIMEDOUT;
                } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
                    err = errno;
                }
            }
        }
        if (err == 0) {
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fd_ = fd;
            ::freeaddrinfo(res);
            return Status::Ok();
        }
        error = std::strerror(err);
        all_refused = all_refused && err == ECONNREFUSED;
        ::close(fd);
    }
    ::freeaddrinfo(res);
    *why = all_refused ? Failure::kRefused : Failure::kConnection;
    return SX_ERROR(SX_ERR_COMM, "connect: %s", error.c_str());
}

Status DeadlineSocket::send_all(const char *data, size_t n, Clock::time_point dl, Failure *why) {
    return io(const_cast<char *>(data), n, true, dl, why);
}

Status DeadlineSocket::recv_all(char *data, size_t n, Clock::time_point dl, Failure *why) {
    return io(data, n, false, dl, why);
}

Status DeadlineSocket::io(char *data, size_t n, bool write, Clock::time_point dl, Failure *why) {
    if (fd_ < 0) {
        *why = Failure::kConnection;
        return SX_ERROR(SX_ERR_COMM, "not connected to %s", peer_.c_str());
    }
    size_t done = 0;
    while (done < n) {
        ssize_t k = write ? ::send(fd_, data + done, n - done, MSG_NOSIGNAL) : ::recv(fd_, data + done, n - done, 0);
        if (k > 0) {
            done += static_cast<size_t>(k);
            continue;
        }
        if (k == 0 && !write) {
            *why = Failure::kConnection;
            return SX_ERROR(SX_ERR_COMM, "%s closed the connection", peer_.c_str());
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            *why = Failure::kConnection;
            return SX_ERROR(SX_ERR_COMM, "%s %s: %s", write ? "send to" : "receive from", peer_.c_str(),
                            std::strerror(errno));
        }
        struct pollfd p = {fd_, static_cast<short>(write ? POLLOUT : POLLIN), 0};
        int r = ::poll(&p, 1, static_cast<int>(time_left(dl).count()));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            *why = Failure::kTimeout;
            return SX_ERROR(SX_ERR_TIMEOUT, "timed out talking to %s", peer_.c_str());
        }
    }
    return Status::Ok();
}

void DeadlineSocket::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

Status connect_with_backoff(DeadlineSocket &sock, const std::string &host, int port, Clock::time_point dl,
                            Failure *why, const std::function<Status()> &greet,
                            const std::function<Status(const std::string &last_error)> &out_of_time,
                            const std::function<Status(const Status &failed)> &stop) {
    Millis backoff(10);
    for (;;) {
        Status s = sock.connect(host, port, dl, why);
        if (s.ok()) {
            s = greet();
            if (s.ok()) return Status::Ok();
            sock.close();
            if (s.code() != SX_ERR_COMM || *why == Failure::kNone) return s;  // not a broken connection
        }
        if (s.code() == SX_ERR_INVALID_ARGUMENT) return s;
        if (stop) SX_TRY(stop(s));
        const Millis left = time_left(dl);
        if (left.count() == 0) {
            *why = Failure::kNone;
            return out_of_time(s.message());
        }
        std::this_thread::sleep_for(std::min(backoff, left));
        backoff = std::min(backoff * 2, Millis(250));
    }
}

}  // namespace rdzv
}  // namespace sx
