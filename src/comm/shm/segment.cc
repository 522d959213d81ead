// The shared segment (segment.h): memfd_create for the memory, SCM_RIGHTS over an
// abstract Unix socket to hand it on.
#include "comm/shm/segment.h"

#include "base/shared_arena.h"

#include <poll.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
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
constexpr size_t kPage = 4096;
// A channel's region begins with a page of its own: the count of ranks that let it go.
constexpr size_t kChannelHeader = kPage;
// The address space of a context's segment (SharedChannels): sparse, so it costs nothing
// but what the channels touch, and enough for a million channels of 64 MiB.
constexpr uint64_t kContextBytes = 1ull << 46;

// Milliseconds left until `deadline` (at least 0), for poll.
int remaining_ms(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd, or `deadline`; every 50 ms asks `store` whether the ranks are still there
// (a watched store knows: rdzv::Store::alive), so that a rank lost before it connects
// fails the others at once, not at the deadline.
Status wait_fd(int fd, short events, Clock::time_point deadline, const char *what, rdzv::Store &store) {
    for (;;) {
        struct pollfd p = {fd, events, 0};
        const int n = ::poll(&p, 1, std::min(remaining_ms(deadline), 50));
        if (n > 0) return Status::Ok();
        if (n == 0 && remaining_ms(deadline) <= 0)
            return SX_ERROR(SX_ERR_TIMEOUT, "shared memory: %s did not happen before the deadline", what);
        if (n < 0 && errno != EINTR)
            return SX_ERROR(SX_ERR_COMM, "shared memory: poll while %s: %s", what, std::strerror(errno));
        SX_TRY(store.alive());
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
    Fd() = default;
    Fd(Fd &&o) noexcept : fd(o.fd) { o.fd = -1; }
    Fd &operator=(Fd &&o) noexcept {
        std::swap(fd, o.fd);
        return *this;
    }
    Fd(const Fd &) = delete;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// A message with descriptors (SCM_RIGHTS) beside its bytes.
struct FdMessage {
    struct iovec iov;
    std::vector<char> control;
    struct msghdr msg;
    // Room for `bytes` of payload at `data` and up to max_fds descriptors.
    FdMessage(void *data, size_t bytes, size_t max_fds)
        : iov{data, bytes}, control(max_fds ? CMSG_SPACE(sizeof(int) * max_fds) : 0, 0) {
        std::memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.empty() ? nullptr : control.data();
        msg.msg_controllen = control.size();
    }
    FdMessage(const FdMessage &) = delete;
    // Sending: these descriptors go with the bytes.
    void attach(const std::vector<int> &fds) {
        if (fds.empty()) {
            msg.msg_control = nullptr;
            msg.msg_controllen = 0;
            return;
        }
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    // Received: the descriptors that came, each owned by the caller from now on.
    std::vector<int> received() const {
        std::vector<int> fds;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(const_cast<struct msghdr *>(&msg), c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                const size_t at = fds.size();
                fds.resize(at + n);
                std::memcpy(fds.data() + at, CMSG_DATA(c), n * sizeof(int));
            }
        return fds;
    }
};

// What a rank tells rank 0 when it connects (its arena's descriptor, if any, beside it).
struct Hello {
    int32_t rank;
    int32_t pid;
    uint64_t arena_bytes;  // 0: no arena offered
};

// What rank 0 answers every rank: the segment's size, then every rank's pid and arena size
// (W of each); the segment's descriptor, then the arenas' of every other rank that offered
// one, in rank order, beside it.
std::vector<char> answer_bytes(uint64_t segment_bytes, const std::vector<SharedSegment::Peer> &peers) {
    std::vector<char> b(sizeof(uint64_t) + peers.size() * (sizeof(int32_t) + sizeof(uint64_t)));
    char *at = b.data();
    std::memcpy(at, &segment_bytes, sizeof segment_bytes);
    at += sizeof segment_bytes;
    for (const SharedSegment::Peer &p : peers) {
        std::memcpy(at, &p.pid, sizeof p.pid);
        std::memcpy(at + sizeof p.pid, &p.arena_bytes, sizeof p.arena_bytes);
        at += sizeof p.pid + sizeof p.arena_bytes;
    }
    return b;
}

// Descriptors sent with one message: SCM_RIGHTS takes at most 253 (SCM_MAX_FD), and a
// host's communicator has up to 512 ranks, each with an arena to hand out.
constexpr size_t kFdsPerMessage = 200;

// How many of the other ranks' arenas (rank `rank` aside) rank 0's answer `payload`
// says come with it: those of a non-zero size.
size_t arenas_offered(const std::vector<char> &payload, int rank, int world_size) {
    size_t n = 0;
    const char *at = payload.data() + sizeof(uint64_t);
    for (int q = 0; q < world_size; ++q, at += sizeof(int32_t) + sizeof(uint64_t)) {
        uint64_t arena_bytes = 0;
        std::memcpy(&arena_bytes, at + sizeof(int32_t), sizeof arena_bytes);
        if (q != rank && arena_bytes != 0) ++n;
    }
    return n;
}

// Where this rank may offer its arena: its descriptor and size, else -1 and 0.
void own_arena(bool offer, int *fd, uint64_t *bytes) {
    size_t n = 0;
    *bytes = 0;
    if (offer && arena::describe(fd, &n))
        *bytes = n;
    else
        *fd = -1;
}

// Rank 0: every other rank connects to `listener` and says who it is (peers of another
// user are refused); once all have, each gets the segment and the others' arenas.
Status hand_out(int listener, int segment, size_t bytes, int world_size, bool offer, Clock::time_point deadline,
                rdzv::Store &store, std::vector<SharedSegment::Peer> *peers, std::vector<Fd> *arena_fds) {
    std::vector<Fd> conns(static_cast<size_t>(world_size));
    peers->assign(static_cast<size_t>(world_size), SharedSegment::Peer());
    arena_fds->clear();
    arena_fds->resize(static_cast<size_t>(world_size));
    int fd0 = -1;
    own_arena(offer, &fd0, &(*peers)[0].arena_bytes);
    (*peers)[0].pid = ::getpid();
    for (int joined = 1; joined < world_size;) {
        SX_TRY(wait_fd(listener, POLLIN, deadline, "every rank connecting for the segment", store));
        Fd peer;
        peer.fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (peer.fd < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return SX_ERROR(SX_ERR_COMM, "shared memory: accept: %s", std::strerror(errno));
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (::getsockopt(peer.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) continue;
        SX_TRY(wait_fd(peer.fd, POLLIN, deadline, "a rank saying who it is", store));
        Hello h{};
        FdMessage m(&h, sizeof h, 1);
        const ssize_t n = ::recvmsg(peer.fd, &m.msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
        std::vector<int> fds = m.received();
        Fd offered;
        if (!fds.empty()) offered.fd = fds[0];
        for (size_t i = 1; i < fds.size(); ++i) ::close(fds[i]);
        if (n != static_cast<ssize_t>(sizeof h) || h.rank <= 0 || h.rank >= world_size ||
            conns[static_cast<size_t>(h.rank)].fd >= 0)
            continue;
        const size_t r = static_cast<size_t>(h.rank);
        (*peers)[r].pid = h.pid;
        (*peers)[r].arena_bytes = offered.fd >= 0 ? h.arena_bytes : 0;
        std::swap((*arena_fds)[r].fd, offered.fd);
        std::swap(conns[r].fd, peer.fd);
        ++joined;
    }
    const std::vector<char> payload = answer_bytes(bytes, *peers);
    for (int r = 1; r < world_size; ++r) {
        std::vector<int> fds{segment};
        for (int q = 0; q < world_size; ++q) {
            if (q == r || (*peers)[static_cast<size_t>(q)].arena_bytes == 0) continue;
            fds.push_back(q == 0 ? fd0 : (*arena_fds)[static_cast<size_t>(q)].fd);
        }
        // The payload with the first kFdsPerMessage descriptors, then a byte with each
        // further run of them.
        char more = '+';
        for (size_t at = 0; at < fds.size(); at += kFdsPerMessage) {
            const std::vector<int> part(fds.begin() + static_cast<std::ptrdiff_t>(at),
                                        fds.begin() + static_cast<std::ptrdiff_t>(std::min(fds.size(), at + kFdsPerMessage)));
            void *data = at == 0 ? const_cast<char *>(payload.data()) : &more;
            const size_t n = at == 0 ? payload.size() : 1;
            FdMessage m(data, n, part.size());
            m.attach(part);
            if (::sendmsg(conns[static_cast<size_t>(r)].fd, &m.msg, MSG_NOSIGNAL) != static_cast<ssize_t>(n))
                return SX_ERROR(SX_ERR_COMM, "shared memory: sending the segment to rank %d: %s", r,
                                std::strerror(errno));
        }
    }
    return Status::Ok();
}

// A peer: says who it is to rank 0's socket `name` (offering its arena), and takes the
// segment's descriptor and size, and the others' arenas.
Status take(const std::string &name, int rank, int world_size, bool offer, Clock::time_point deadline,
            rdzv::Store &store, int *segment, size_t *bytes, std::vector<SharedSegment::Peer> *peers,
            std::vector<Fd> *arena_fds) {
    Fd sock;
    sock.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SX_CHECK(sock.fd >= 0, SX_ERR_COMM, "shared memory: socket: %s", std::strerror(errno));
    struct sockaddr_un addr;
    const socklen_t len = abstract_address(name, &addr);
    SX_CHECK(::connect(sock.fd, reinterpret_cast<struct sockaddr *>(&addr), len) == 0, SX_ERR_COMM,
             "shared memory: rank %d cannot reach rank 0's socket (%s): another host or network namespace?", rank,
             std::strerror(errno));
    int mine = -1;
    Hello h{rank, static_cast<int32_t>(::getpid()), 0};
    own_arena(offer, &mine, &h.arena_bytes);
    {
        FdMessage m(&h, sizeof h, 1);
        m.attach(mine >= 0 ? std::vector<int>{mine} : std::vector<int>{});
        SX_CHECK(::sendmsg(sock.fd, &m.msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h), SX_ERR_COMM,
                 "shared memory: rank %d: send: %s", rank, std::strerror(errno));
    }
    SX_TRY(wait_fd(sock.fd, POLLIN, deadline, "rank 0 handing out the segment", store));
    peers->assign(static_cast<size_t>(world_size), SharedSegment::Peer());
    std::vector<char> payload = answer_bytes(0, *peers);
    FdMessage m(payload.data(), payload.size(), kFdsPerMessage);
    const ssize_t n = ::recvmsg(sock.fd, &m.msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    std::vector<Fd> fds(0);
    auto keep = [&fds](const std::vector<int> &got) {
        for (int fd : got) {
            fds.emplace_back();
            fds.back().fd = fd;
        }
    };
    keep(m.received());
    SX_CHECK(n == static_cast<ssize_t>(payload.size()) && !fds.empty() && !(m.msg.msg_flags & MSG_CTRUNC),
             SX_ERR_COMM, "shared memory: rank %d got no segment from rank 0", rank);
    // The rest of the descriptors (more than one message holds), a byte with each run.
    const size_t want = 1 + arenas_offered(payload, rank, world_size);
    while (fds.size() < want) {
        SX_TRY(wait_fd(sock.fd, POLLIN, deadline, "rank 0 handing out the ranks' arenas", store));
        char more = 0;
        FdMessage next(&more, 1, kFdsPerMessage);
        const ssize_t got = ::recvmsg(sock.fd, &next.msg, MSG_CMSG_CLOEXEC);
        const size_t before = fds.size();
        keep(next.received());
        SX_CHECK(got == 1 && fds.size() > before && !(next.msg.msg_flags & MSG_CTRUNC), SX_ERR_COMM,
                 "shared memory: rank %d got %zu of the %zu descriptors from rank 0", rank, fds.size(), want);
    }
    const char *at = payload.data();
    uint64_t seg_bytes = 0;
    std::memcpy(&seg_bytes, at, sizeof seg_bytes);
    at += sizeof seg_bytes;
    size_t next_fd = 1;
    arena_fds->clear();
    arena_fds->resize(static_cast<size_t>(world_size));
    for (int q = 0; q < world_size; ++q) {
        SharedSegment::Peer &p = (*peers)[static_cast<size_t>(q)];
        std::memcpy(&p.pid, at, sizeof p.pid);
        std::memcpy(&p.arena_bytes, at + sizeof p.pid, sizeof p.arena_bytes);
        at += sizeof p.pid + sizeof p.arena_bytes;
        if (q == rank) {
            p.arena_bytes = h.arena_bytes;
            continue;
        }
        if (p.arena_bytes == 0) continue;
        SX_CHECK(next_fd < fds.size(), SX_ERR_COMM, "shared memory: rank %d got too few arenas from rank 0", rank);
        std::swap((*arena_fds)[static_cast<size_t>(q)].fd, fds[next_fd++].fd);
    }
    *segment = fds[0].fd;
    fds[0].fd = -1;
    *bytes = static_cast<size_t>(seg_bytes);
    return Status::Ok();
}

Status map(int fd, size_t bytes, uint64_t offset, char **data) {
    void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
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

SharedSegment::~SharedSegment() {
    if (channels_) {
        channels_->close_channel(data_ - kChannelHeader, channel_offset_, bytes_ + kChannelHeader, bytes_ + kChannelHeader,
                                  channel_ranks_);
        return;
    }
    ::munmap(data_, map_bytes_);
    for (const Peer &m : mappings_) ::munmap(const_cast<char *>(m.arena), m.arena_bytes);
}

// Maps every other process's arena, read-only; the ranks of this process (this one
// included) read this process's own. Where one cannot be mapped, none is kept: all or none.
void SharedSegment::map_arenas(const std::vector<int> &fds) {
    arenas_mapped_ = true;
    int own_fd = -1;
    size_t own_bytes = 0;
    char *own = nullptr;
    const bool have_own = arena::describe(&own_fd, &own_bytes, &own);
    for (size_t q = 0; q < peers_.size() && arenas_mapped_; ++q) {
        Peer &p = peers_[q];
        if (p.arena_bytes == 0) continue;
        if (p.pid == ::getpid()) {
            if (have_own && own_bytes == p.arena_bytes) p.arena = own;
            continue;
        }
        void *m = fds[q] < 0 ? MAP_FAILED : ::mmap(nullptr, p.arena_bytes, PROT_READ, MAP_SHARED | MAP_NORESERVE, fds[q], 0);
        if (m == MAP_FAILED) {
            arenas_mapped_ = false;
            break;
        }
        p.arena = static_cast<const char *>(m);
        mappings_.push_back(p);
    }
    if (arenas_mapped_) return;
    for (const Peer &m : mappings_) ::munmap(const_cast<char *>(m.arena), m.arena_bytes);
    mappings_.clear();
    for (Peer &p : peers_) p.arena = nullptr;
}

Status SharedSegment::open(rdzv::Store &store, int rank, int world_size, size_t bytes, Clock::time_point deadline,
                           std::unique_ptr<SharedSegment> *out, bool exchange_arenas, size_t map_bytes, int *fd) {
    if (map_bytes == 0) map_bytes = bytes;
    Fd segment;
    char *data = nullptr;
    std::vector<Peer> peers;
    std::vector<Fd> arena_fds;
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
        SX_TRY(hand_out(listener.fd, segment.fd, bytes, world_size, exchange_arenas, deadline, store, &peers, &arena_fds));
    } else {
        std::string name;
        SX_TRY(store.get(kSocketKey, &name, std::chrono::milliseconds(remaining_ms(deadline))));
        SX_CHECK(!name.empty(), SX_ERR_UNSUPPORTED, "shared memory is not available on rank 0");
        size_t given = 0;
        SX_TRY(take(name, rank, world_size, exchange_arenas, deadline, store, &segment.fd, &given, &peers, &arena_fds));
        SX_CHECK(given == bytes, SX_ERR_COMM, "shared memory: rank 0 made a segment of %zu bytes, rank %d expected %zu",
                 given, rank, bytes);
    }
    SX_TRY(map(segment.fd, map_bytes, 0, &data));
    std::unique_ptr<SharedSegment> seg(new SharedSegment(data, bytes));
    seg->map_bytes_ = map_bytes;
    seg->peers_ = std::move(peers);
    if (exchange_arenas) {
        std::vector<int> fds;
        for (const Fd &f : arena_fds) fds.push_back(f.fd);
        fds.resize(static_cast<size_t>(world_size), -1);
        seg->map_arenas(fds);
    }
    if (fd) std::swap(*fd, segment.fd);
    *out = std::move(seg);
    return Status::Ok();
}

Status SharedChannels::open(rdzv::Store &store, int rank, int world_size, Clock::time_point deadline,
                            std::shared_ptr<SharedChannels> *out) {
    std::shared_ptr<SharedChannels> c(new SharedChannels());
    SX_TRY(SharedSegment::open(store, rank, world_size, kContextBytes, deadline, &c->context_, true, kPage, &c->fd_));
    c->rank_ = rank;
    *out = std::move(c);
    return Status::Ok();
}

SharedChannels::~SharedChannels() {
    context_.reset();
    if (fd_ >= 0) ::close(fd_);
}

int64_t SharedChannels::channels_open() const { return open_.load(); }

Status SharedChannels::open_channel(rdzv::Store &store, int rank, int world_size, size_t bytes, Clock::time_point deadline,
                                    std::unique_ptr<SharedSegment> *out) {
    const uint64_t region = kChannelHeader + (bytes + kPage - 1) / kPage * kPage;
    const int context_ranks = static_cast<int>(context_->peers_.size());
    // Who the channel's ranks are in the context (their processes and arenas).
    SX_TRY(store.set("channel/member/" + std::to_string(rank), std::to_string(rank_)));
    std::vector<int> members(static_cast<size_t>(world_size));
    for (int q = 0; q < world_size; ++q) {
        std::string v;
        SX_TRY(store.get("channel/member/" + std::to_string(q), &v, std::chrono::milliseconds(remaining_ms(deadline))));
        char *end = nullptr;
        const long m = std::strtol(v.c_str(), &end, 10);
        SX_CHECK(!v.empty() && *end == '\0' && m >= 0 && m < context_ranks, SX_ERR_COMM,
                 "shared memory: channel rank %d says it is context rank '%s' (of %d)", q, v.c_str(), context_ranks);
        members[static_cast<size_t>(q)] = static_cast<int>(m);
    }
    uint64_t offset = 0;
    if (rank == 0) {
        auto *next = reinterpret_cast<std::atomic<uint64_t> *>(context_->data_);
        offset = kPage + next->fetch_add(region);
        const bool room = offset + region <= kContextBytes;
        SX_TRY(store.set("channel/region", room ? std::to_string(offset) + ":" + std::to_string(region) : ""));
        SX_CHECK(room, SX_ERR_OUT_OF_MEMORY, "shared memory: the context's segment has no room left for a channel of "
                 "%llu bytes", static_cast<unsigned long long>(region));
    } else {
        std::string v;
        SX_TRY(store.get("channel/region", &v, std::chrono::milliseconds(remaining_ms(deadline))));
        unsigned long long at = 0, size = 0;
        SX_CHECK(std::sscanf(v.c_str(), "%llu:%llu", &at, &size) == 2, SX_ERR_OUT_OF_MEMORY,
                 "shared memory: the channel's rank 0 found no room for it in the context's segment");
        SX_CHECK(size == region && at % kPage == 0, SX_ERR_COMM,
                 "shared memory: the channel's rank 0 made a region of %llu bytes, rank %d expected %llu", size, rank,
                 static_cast<unsigned long long>(region));
        offset = at;
    }
    char *base = nullptr;
    if (Status mapped = map(fd_, region, offset, &base); !mapped.ok()) {
        // This rank will never close the channel, so it counts itself out now: through
        // the header page alone, for the last rank to give the region back.
        char *header = nullptr;
        if (map(fd_, kPage, offset, &header).ok()) {
            open_.fetch_add(1);
            close_channel(header, offset, region, kPage, world_size);
        }
        return mapped;
    }
    std::unique_ptr<SharedSegment> seg(new SharedSegment(base + kChannelHeader, region - kChannelHeader));
    for (int m : members) seg->peers_.push_back(context_->peers_[static_cast<size_t>(m)]);
    seg->arenas_mapped_ = context_->arenas_mapped_;
    seg->channels_ = shared_from_this();
    seg->channel_offset_ = offset;
    seg->channel_ranks_ = world_size;
    open_.fetch_add(1);
    *out = std::move(seg);
    return Status::Ok();
}

// The last of the channel's ranks to let it go gives its pages back (its range of the
// segment is never handed out again, so nobody reads them after).
void SharedChannels::close_channel(char *base, uint64_t offset, size_t region, size_t mapped, int world_size) {
    auto *released = reinterpret_cast<std::atomic<uint32_t> *>(base);
    const bool last = released->fetch_add(1) + 1 == static_cast<uint32_t>(world_size);
    ::munmap(base, mapped);
    if (last) ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                          static_cast<off_t>(region));
    open_.fetch_sub(1);
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
