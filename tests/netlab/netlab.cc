// The lab of hosts (netlab.h).
#include "netlab.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>

extern char **environ;

namespace netlab {
namespace {

constexpr int kMtu = 16000;                // bytes a packet may have (fewer packets for the wire to move)
constexpr double kMostQueued = 0.2;        // seconds of packets a link holds before it drops
constexpr const char *kNet = "10.77.0.";   // the hosts' addresses: kNet + (h + 1)

double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs argv (a command found on PATH) and waits: "" or what went wrong.
std::string run(const std::vector<std::string> &argv) {
    std::vector<char *> args;
    for (const std::string &a : argv) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return "cannot run '" + argv[0] + "': " + std::strerror(rc);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::string cmd;
        for (const std::string &a : argv) cmd += (cmd.empty() ? "" : " ") + a;
        return "'" + cmd + "' failed";
    }
    return "";
}

// A TUN interface named `name` (in this process's network); its fd, or -1.
int make_tun(const std::string &name, std::string *why) {
    const int fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        *why = std::string("cannot open /dev/net/tun: ") + std::strerror(errno);
        return -1;
    }
    struct ifreq ifr;
    std::memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name.c_str());
    if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
        *why = std::string("cannot make a TUN interface: ") + std::strerror(errno);
        ::close(fd);
        return -1;
    }
    return fd;
}

struct Packet {
    double due;
    uint64_t seq;  // order among packets due at once
    int dst;
    std::vector<uint8_t> data;
    bool operator>(const Packet &o) const { return due != o.due ? due > o.due : seq > o.seq; }
};

}  // namespace

std::string Lab::create(int hosts, std::unique_ptr<Lab> *out) {
    if (::geteuid() != 0) return "the lab needs root (network namespaces and TUN interfaces)";
    if (!run({"ip", "-V"}).empty()) return "the lab needs the 'ip' command (iproute2)";
    if (!run({"nsenter", "--version"}).empty()) return "the lab needs the 'nsenter' command (util-linux)";
    std::unique_ptr<Lab> lab(new Lab());
    int release[2], ready[2];
    if (::pipe2(release, O_CLOEXEC) != 0 || ::pipe2(ready, O_CLOEXEC) != 0) return "cannot make a pipe";
    lab->release_ = release[1];
    for (int h = 0; h < hosts; ++h) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            // The host: a network of its own, held until the lab lets go (or dies). It keeps
            // no end of the pipes but its own: the lab's closing must reach every holder.
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            ::close(release[1]);
            ::close(ready[0]);
            const char ok = ::unshare(CLONE_NEWNET) == 0 ? 1 : 0;
            if (::write(ready[1], &ok, 1) != 1) _exit(3);
            char c;
            while (::read(release[0], &c, 1) > 0) {
            }
            _exit(0);
        }
        char ok = 0;
        if (pid < 0 || ::read(ready[0], &ok, 1) != 1 || !ok) {
            if (pid > 0) lab->holders_.push_back(pid);
            ::close(release[0]);
            ::close(ready[0]);
            ::close(ready[1]);
            return "cannot make a network namespace (unshare(CLONE_NEWNET) is not allowed here)";
        }
        lab->holders_.push_back(pid);
        const int ns = ::open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0) return "cannot open the namespace of host " + std::to_string(h);
        lab->ns_.push_back(ns);
    }
    ::close(release[0]);
    ::close(ready[0]);
    ::close(ready[1]);
    for (int h = 0; h < hosts; ++h) {
        const std::string name = "sxl" + std::to_string(::getpid() % 10000000) + "." + std::to_string(h);
        std::string why;
        const int fd = make_tun(name, &why);
        if (fd < 0) return why;
        lab->tuns_.push_back(fd);
        const std::string pid = std::to_string(lab->holders_[h]);
        const std::vector<std::vector<std::string>> setup = {
            {"ip", "link", "set", name, "netns", pid},
            {"nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up"},
            {"nsenter", "-t", pid, "-n", "ip", "addr", "add", lab->address(h) + "/24", "dev", name},
            {"nsenter", "-t", pid, "-n", "ip", "link", "set", name, "mtu", std::to_string(kMtu), "up"},
        };
        for (const auto &cmd : setup)
            if (std::string e = run(cmd); !e.empty()) return "setting up host " + std::to_string(h) + ": " + e;
    }
    lab->links_.assign(static_cast<size_t>(hosts), Link());
    if (::pipe2(lab->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return "cannot make a pipe";
    Lab *raw = lab.get();
    lab->wire_ = std::thread([raw] { raw->run_wire(); });
    *out = std::move(lab);
    return "";
}

Lab::~Lab() {
    if (wire_.joinable()) {
        stop_.store(true);
        const char c = 1;
        if (::write(wake_[1], &c, 1) < 0) {
        }
        wire_.join();
    }
    for (int fd : tuns_) ::close(fd);  // the interfaces go with their last descriptor
    for (int fd : ns_) ::close(fd);
    for (int fd : wake_)
        if (fd >= 0) ::close(fd);
    if (release_ >= 0) ::close(release_);  // the holders end, and their namespaces with them
    for (pid_t pid : holders_) ::waitpid(pid, nullptr, 0);
}

void Lab::set_link(int host, const Link &link) {
    std::lock_guard<std::mutex> lock(mu_);
    links_[static_cast<size_t>(host)] = link;
}

void Lab::set_links(const Link &link) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Link &l : links_) l = link;
}

WireStats Lab::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

pid_t Lab::spawn(int host, const std::vector<std::string> &argv,
                 const std::vector<std::pair<std::string, std::string>> &env) {
    // Everything the child needs is made before the fork: the wire's thread may hold
    // malloc's lock at that moment, so the child allocates nothing.
    std::vector<std::string> vars;
    for (char **e = environ; *e; ++e) {
        const std::string v = *e;
        bool replaced = false;
        for (const auto &kv : env) replaced = replaced || v.compare(0, kv.first.size() + 1, kv.first + "=") == 0;
        if (!replaced) vars.push_back(v);
    }
    for (const auto &kv : env) vars.push_back(kv.first + "=" + kv.second);
    std::vector<char *> envp, args;
    for (std::string &v : vars) envp.push_back(&v[0]);
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (std::string &a : argv_copy) args.push_back(&a[0]);
    args.push_back(nullptr);
    const int ns = host >= 0 ? ns_[static_cast<size_t>(host)] : -1;
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (ns >= 0 && ::setns(ns, CLONE_NEWNET) != 0) _exit(126);
        ::execve(args[0], args.data(), envp.data());
        _exit(127);
    }
    return pid;
}

void Lab::run_wire() {
    const int H = hosts();
    std::vector<uint8_t> buf(65536);
    std::priority_queue<Packet, std::vector<Packet>, std::greater<Packet>> queue;
    std::vector<double> busy_out(static_cast<size_t>(H), 0.0), busy_in(static_cast<size_t>(H), 0.0);
    std::mt19937_64 rng(12345);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    uint64_t seq = 0;
    std::vector<struct pollfd> fds(static_cast<size_t>(H) + 1);
    for (int h = 0; h < H; ++h) fds[static_cast<size_t>(h)] = {tuns_[static_cast<size_t>(h)], POLLIN, 0};
    fds[static_cast<size_t>(H)] = {wake_[0], POLLIN, 0};
    auto drop = [&] {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.dropped;
    };
    while (!stop_.load()) {
        double wait = 0.1;
        if (!queue.empty()) wait = std::max(0.0, std::min(wait, queue.top().due - now_s()));
        struct timespec ts = {static_cast<time_t>(wait), static_cast<long>((wait - static_cast<double>(static_cast<time_t>(wait))) * 1e9)};
        ::ppoll(fds.data(), fds.size(), &ts, nullptr);
        for (int src = 0; src < H; ++src) {
            if (!(fds[static_cast<size_t>(src)].revents & POLLIN)) continue;
            for (int k = 0; k < 256; ++k) {
                const ssize_t n = ::read(tuns_[static_cast<size_t>(src)], buf.data(), buf.size());
                if (n <= 0) break;
                // IPv4 to a host of the lab, else dropped.
                const uint8_t *p = buf.data();
                const int dst = n >= 20 && (p[0] >> 4) == 4 && p[16] == 10 && p[17] == 77 && p[18] == 0 ? p[19] - 1 : -1;
                if (dst < 0 || dst >= H || dst == src) {
                    drop();
                    continue;
                }
                Link a, b;
                {
                    std::lock_guard<std::mutex> lock(mu_);
                    a = links_[static_cast<size_t>(src)];
                    b = links_[static_cast<size_t>(dst)];
                }
                if (!a.up || !b.up || uniform(rng) < a.loss || uniform(rng) < b.loss) {
                    drop();
                    continue;
                }
                // Out of the sender's link, then into the receiver's, each sending one packet
                // after another at its rate, after its delay.
                const double now = now_s(), size = static_cast<double>(n);
                double t = std::max(now, busy_out[static_cast<size_t>(src)]);
                if (a.rate > 0) {
                    if (t - now > kMostQueued) {
                        drop();
                        continue;
                    }
                    t += size / a.rate;
                    busy_out[static_cast<size_t>(src)] = t;
                }
                t += a.delay_ms / 1000.0;
                double u = std::max(t, busy_in[static_cast<size_t>(dst)]);
                if (b.rate > 0) {
                    if (u - t > kMostQueued) {
                        drop();
                        continue;
                    }
                    u += size / b.rate;
                    busy_in[static_cast<size_t>(dst)] = u;
                }
                queue.push({u + b.delay_ms / 1000.0, seq++, dst, std::vector<uint8_t>(p, p + n)});
            }
        }
        if (fds[static_cast<size_t>(H)].revents & POLLIN) {
            char c[64];
            while (::read(wake_[0], c, sizeof c) > 0) {
            }
        }
        const double now = now_s();
        while (!queue.empty() && queue.top().due <= now) {
            const Packet &pk = queue.top();
            const bool sent = ::write(tuns_[static_cast<size_t>(pk.dst)], pk.data.data(), pk.data.size()) ==
                              static_cast<ssize_t>(pk.data.size());
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (sent) {
                    ++stats_.packets;
                    stats_.bytes += pk.data.size();
                } else {
                    ++stats_.dropped;
                }
            }
            queue.pop();
        }
    }
}

}  // namespace netlab
