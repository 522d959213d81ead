// The shared segment (segment.h): memfd_create for the memory, SCM_RIGHTS over an
// abstract Unix socket to hand it on.
#include "comm/shm/segment.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

namespace sx {
namespace comm {
namespace {

constexpr const char *kSocketKey = "shm/socket";

// Milliseconds left until `deadline` (at least 0), for poll.
int remaining_ms(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits until fd is ready for `events`, or `deadline`.
Status wait_fd(int fd, short events, Clock::time_point deadline, const char *what) {
    for (;;) {
        struct pollfd p = {fd, events, 0};
        const int n = ::poll(&p, 1, remaining_ms(deadline));
        if (n > 0) return Status::Ok();
        if (n == 0) return SX_ERROR(SX_ERR_TIMEOUT, "shared memory: %s did not happen before the deadline", what);
        if (errno != EINTR) return SX_ERROR(SX_ERR_COMM, "shared memory: poll while %s: %s", what, std::strerror(errno));
    }
}

// The abstract socket address of `name` (no file: a leading NUL byte).
socklen_t abstract_address(const std::string &name, struct sockaddr_un *addr) {
    std::memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    std::memcpy(addr->sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

// Closes a descriptor when it goes out of scope.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// The message that carries the segment: its size, and its descriptor as SCM_RIGHTS.
struct FdMessage {
    uint64_t size;
    struct iovec iov;
    char control[CMSG_SPACE(sizeof(int))];
    struct msghdr msg;
    explicit FdMessage(uint64_t bytes) : size(bytes), iov{&size, sizeof size} {
        std::memset(control, 0, sizeof control);
        std::memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
    }
    FdMessage(const FdMessage &) = delete;
};

// Rank 0: the segment's descriptor to each of the other world_size - 1 ranks, which
// connect to `listener` and say their rank; peers of another user are refused.
Status hand_out(int listener, int segment, size_t bytes, int world_size, Clock::time_point deadline) {
    std::vector<bool> served(static_cast<size_t>(world_size), false);
    for (int served_count = 1; served_count < world_size;) {
        SX_TRY(wait_fd(listener, POLLIN, deadline, "every rank connecting for the segment"));
        Fd peer;
        peer.fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (peer.fd < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return SX_ERROR(SX_ERR_COMM, "shared memory: accept: %s", std::strerror(errno));
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (::getsockopt(peer.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) continue;
        int32_t rank = -1;
        SX_TRY(wait_fd(peer.fd, POLLIN, deadline, "a rank saying who it is"));
        if (::recv(peer.fd, &rank, sizeof rank, MSG_WAITALL) != sizeof rank || rank <= 0 || rank >= world_size ||
            served[static_cast<size_t>(rank)])
            continue;
        FdMessage m(bytes);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &segment, sizeof(int));
        if (::sendmsg(peer.fd, &m.msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof m.size))
            return SX_ERROR(SX_ERR_COMM, "shared memory: sending the segment to rank %d: %s", rank, std::strerror(errno));
        served[static_cast<size_t>(rank)] = true;
        ++served_count;
    }
    return Status::Ok();
}

// A peer: the segment's descriptor and size from rank 0's socket `name`.
Status take(const std::string &name, int rank, Clock::time_point deadline, int *segment, size_t *bytes) {
    Fd sock;
    sock.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SX_CHECK(sock.fd >= 0, SX_ERR_COMM, "shared memory: socket: %s", std::strerror(errno));
    struct sockaddr_un addr;
    const socklen_t len = abstract_address(name, &addr);
    SX_CHECK(::connect(sock.fd, reinterpret_cast<struct sockaddr *>(&addr), len) == 0, SX_ERR_COMM,
             "shared memory: rank %d cannot reach rank 0's socket (%s): another host or network namespace?", rank,
             std::strerror(errno));
    const int32_t me = rank;
    SX_CHECK(::send(sock.fd, &me, sizeof me, MSG_NOSIGNAL) == sizeof me, SX_ERR_COMM,
             "shared memory: rank %d: send: %s", rank, std::strerror(errno));
    SX_TRY(wait_fd(sock.fd, POLLIN, deadline, "rank 0 handing out the segment"));
    FdMessage m(0);
    const ssize_t n = ::recvmsg(sock.fd, &m.msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    SX_CHECK(n == static_cast<ssize_t>(sizeof m.size) && c && c->cmsg_type == SCM_RIGHTS, SX_ERR_COMM,
             "shared memory: rank %d got no segment from rank 0", rank);
    std::memcpy(segment, CMSG_DATA(c), sizeof(int));
    *bytes = static_cast<size_t>(m.size);
    return Status::Ok();
}

Status map(int fd, size_t bytes, char **data) {
    void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    SX_CHECK(p != MAP_FAILED, SX_ERR_OUT_OF_MEMORY, "shared memory: mapping %zu bytes: %s", bytes, std::strerror(errno));
    *data = static_cast<char *>(p);
    return Status::Ok();
}

std::string random_name() {
    std::random_device rd;
    char name[64];
    std::snprintf(name, sizeof name, "sx-shm-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return name;
}

}  // namespace

SharedSegment::~SharedSegment() { ::munmap(data_, bytes_); }

Status SharedSegment::open(rdzv::Store &store, int rank, int world_size, size_t bytes, Clock::time_point deadline,
                           std::unique_ptr<SharedSegment> *out) {
    Fd segment;
    char *data = nullptr;
    if (rank == 0) {
        // Where the segment or the socket cannot be made, the others are told ("" for a
        // name), and every rank says SX_ERR_UNSUPPORTED.
        Fd listener;
        const std::string name = random_name();
        std::string why;
        segment.fd = ::memfd_create("sx-shared", MFD_CLOEXEC);
        if (segment.fd < 0) why = format("memfd_create: %s", std::strerror(errno));
        if (why.empty() && ::ftruncate(segment.fd, static_cast<off_t>(bytes)) != 0)
            why = format("sizing the segment to %zu bytes: %s", bytes, std::strerror(errno));
        if (why.empty()) {
            listener.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            struct sockaddr_un addr;
            const socklen_t len = abstract_address(name, &addr);
            if (listener.fd < 0 || ::bind(listener.fd, reinterpret_cast<struct sockaddr *>(&addr), len) != 0 ||
                ::listen(listener.fd, world_size) != 0)
                why = format("an abstract Unix socket: %s", std::strerror(errno));
        }
        SX_TRY(store.set(kSocketKey, why.empty() ? name : ""));
        SX_CHECK(why.empty(), SX_ERR_UNSUPPORTED, "shared memory is not available on rank 0: %s", why.c_str());
        SX_TRY(hand_out(listener.fd, segment.fd, bytes, world_size, deadline));
    } else {
        std::string name;
        SX_TRY(store.get(kSocketKey, &name, std::chrono::milliseconds(remaining_ms(deadline))));
        SX_CHECK(!name.empty(), SX_ERR_UNSUPPORTED, "shared memory is not available on rank 0");
        size_t given = 0;
        SX_TRY(take(name, rank, deadline, &segment.fd, &given));
        SX_CHECK(given == bytes, SX_ERR_COMM, "shared memory: rank 0 made a segment of %zu bytes, rank %d expected %zu",
                 given, rank, bytes);
    }
    SX_TRY(map(segment.fd, bytes, &data));
    out->reset(new SharedSegment(data, bytes));
    return Status::Ok();
}

std::string host_identity() {
    if (const char *id = std::getenv("SX_HOST_ID"); id && *id) return std::string("override:") + id;
    std::string boot;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    return boot + "/" + host;
}

}  // namespace comm
}  // namespace sx
