// A network of hosts on one machine, for tests and benchmarks of what crosses hosts.
//
// Each host is a network namespace of its own, held by a process that dies with the one
// that made the lab (so nothing is left behind, however that one ends), with one TUN
// interface 10.77.0.<h + 1>/24. The other end of every TUN is this process: a thread (the
// wire) moves each IPv4 packet from its sender's interface to its destination's, through
// the two hosts' links to a switch. A link has a one-way delay, a rate (its packets are
// sent one after another at that many bytes a second, each link queueing at most 200 ms
// of them), a loss probability, and can be taken down (every packet to or from the host
// is dropped: a partition). Packets to any other address are dropped: traffic stays in
// the lab.
//
// This is the kernel's netem and tbf done in user space, so that it works where the
// kernel lacks them (containers often do); it needs root, network namespaces and
// /dev/net/tun (Lab::create says why not where one is missing). Processes run in a host
// with spawn(): they see only its interface and loopback, and the abstract Unix sockets
// of its namespace (so shared memory is per host, as on real hosts).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace netlab {

struct Link {
    double delay_ms = 0.0;   // one way, host to switch (and back)
    double rate = 0.0;       // bytes per second; 0: unlimited
    double loss = 0.0;       // probability a packet is dropped on this link, each way
    bool up = true;
};

struct WireStats {
    uint64_t packets = 0, bytes = 0, dropped = 0;
};

class Lab {
  public:
    // `hosts` hosts; "" and *out set, or why they cannot be made here (no root, no network
    // namespaces, no TUN, no `ip` command).
    static std::string create(int hosts, std::unique_ptr<Lab> *out);
    ~Lab();  // every process spawned is killed, the hosts and their interfaces go

    int hosts() const { return static_cast<int>(holders_.size()); }
    std::string address(int host) const { return "10.77.0." + std::to_string(host + 1); }

    // Host h's link from now on (packets already on their way keep their timing).
    void set_link(int host, const Link &link);
    void set_links(const Link &link);  // every host's
    WireStats stats() const;

    // Starts argv (argv[0] a path) in host h (-1: this process's own network), with
    // `env` added to this process's environment; its pid. It is killed (SIGKILL) if this
    // process dies.
    pid_t spawn(int host, const std::vector<std::string> &argv,
                const std::vector<std::pair<std::string, std::string>> &env = {});

  private:
    Lab() = default;
    void run_wire();

    std::vector<pid_t> holders_;  // per host: the process holding its namespace
    std::vector<int> tuns_;       // per host: this end of its TUN
    std::vector<int> ns_;         // per host: its namespace (an fd of /proc/<holder>/ns/net)
    int release_ = -1;            // the holders wait on its other end
    int wake_[2] = {-1, -1};      // tells the wire to look at its links again, or to stop
    mutable std::mutex mu_;
    std::vector<Link> links_;
    WireStats stats_;
    std::atomic<bool> stop_{false};
    std::thread wire_;
};

}  // namespace netlab
