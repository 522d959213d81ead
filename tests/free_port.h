// A TCP port on 127.0.0.1 for a test's rendezvous store, which a rank binds a moment later.
//
// Binding port 0 and releasing it is not enough where tests run side by side: the port
// comes from the kernel's ephemeral range, which every outgoing connection draws from
// too (Gloo's, the stores'), so another test's connect() can take it before the rank
// binds it, and the test fails at once. The port here is chosen below the ephemeral
// range (where connect() never draws), and claimed through a lock on a file named after
// it in /tmp/sx-test-ports, held by this process until it exits, so that two tests never
// choose the same one. Where no such port is left, the old way is the fallback.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

namespace sxtest {

// Whether 127.0.0.1:port can be bound now (as the store's server binds it).
inline bool port_bindable(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a;
    std::memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

// A port from the kernel's ephemeral range that was free a moment ago.
inline int ephemeral_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a;
    std::memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
}

inline int free_port() {
    int low = 32768, high = 60999;
    if (std::FILE *range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
        if (std::fscanf(range, "%d %d", &low, &high) != 2) low = 32768;
        std::fclose(range);
    }
    const int first = 20000, last = low - 1;  // below the ephemeral range
    if (last - first < 1000) return ephemeral_port();
    const std::string dir = "/tmp/sx-test-ports";
    ::mkdir(dir.c_str(), 01777);
    std::random_device rd;
    std::mt19937 rng(rd() ^ static_cast<unsigned>(::getpid()));
    for (int attempt = 0; attempt < 200; ++attempt) {
        const int port = std::uniform_int_distribution<int>(first, last)(rng);
        const std::string path = dir + "/" + std::to_string(port);
        const int lock = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
        if (lock < 0) break;  // the directory is not usable: the fallback
        if (::flock(lock, LOCK_EX | LOCK_NB) != 0 || !port_bindable(port)) {
            ::close(lock);
            continue;
        }
        return port;  // the lock is held until this process exits (lock stays open)
    }
    return ephemeral_port();
}

}  // namespace sxtest
