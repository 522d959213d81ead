// bench_sx section mesh: HSDP's traffic. 4 ranks as processes over tcp://127.0.0.1, a
// model of 8 units of 1 Mi fp32 (32 MiB of gradients, 32 MiB of params), SGD; a training
// step is a forward (each unit gathered and released: stage 3 gathers it), a backward
// (each unit in reverse gathered, its gradients written, released and signalled ready)
// and sx_step: flat ZeRO (one shard group of 4, over Gloo alone: SX_TRANSPORT_TCP)
// against a 2 x 2 mesh (shard groups {0, 1} and {2, 3}, replicas {0, 2} and {1, 3}), at
// stage 2 (ZeRO-2 against hpZ-style HSDP) and stage 3 (FSDP's FULL_SHARD against
// HYBRID_SHARD); and beside them flat ZeRO as it runs by default on two hosts of two
// ranks (SX_HOST_ID: ranks {0, 1} and {2, 3}), which combines through shared memory on
// each host and through TCP between host peers ("flat hier").
//
// Bytes are those the kernel's TCP stack counts for every socket of a rank
// (TCP_INFO's tcpi_bytes_acked, before and after the timed steps, nothing else running),
// and each socket's peer rank is found by matching the two ends' ports across the ranks.
// A link is a "shard link" when both ranks are in the same 2 x 2 shard group (the fast
// links of a node, where the mesh keeps its reduce-scatter and all-gather) and a
// "replica link" otherwise (the slow links between nodes); flat ZeRO's traffic is split
// the same way, so that the two rows say what each sends over the links a node boundary
// would cut. Goal: the mesh's replica-link bytes = 1/shard_size (1/2) of flat's.
// Step time: the median over repetitions of a plain step, every rank starting together.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sx/sx.h"

namespace sxbench {

namespace {

constexpr int kWorld = 4;
constexpr int kShard = 2;
constexpr int kUnits = 8;
constexpr int64_t kUnitNumel = int64_t(1) << 20;
constexpr int kByteSteps = 4;  // steps whose bytes are counted

void check(sx_status_t st, const char *what) {
    if (st != SX_OK) {
        std::fprintf(stderr, "bench_sx mesh: %s: %s\n", what, sx_last_error_message());
        std::exit(1);
    }
}

sx_shard_group_t *make_group(const std::string &url, int rank, int shard_size, int stage, int units, int64_t numel,
                             int32_t transport = SX_TRANSPORT_AUTO) {
    return make_sgd_group("mesh", url, rank, kWorld, stage, 0, shard_size, units, numel, transport);
}

// Forward, backward (units signalled ready), sx_step (its gathers deferred at stage 2:
// the next forward waits for them).
void step(sx_shard_group_t *g) {
    for (int32_t u = 0; u < kUnits; ++u) {
        check(sx_unit_gather(g, u), "sx_unit_gather");
        check(sx_unit_release(g, u), "sx_unit_release");
    }
    for (int32_t u = kUnits - 1; u >= 0; --u) {
        check(sx_unit_gather(g, u), "sx_unit_gather");
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        check(sx_grad_view(g, u, &v), "sx_grad_view");
        float *d = static_cast<float *>(v.data);
        for (uint64_t i = 0; i < v.numel; ++i) d[i] = 1e-3f;
        check(sx_unit_release(g, u), "sx_unit_release");
        check(sx_unit_grads_ready(g, u, nullptr), "sx_unit_grads_ready");
    }
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.defer_gather = 1;
    check(sx_step(g, &o, nullptr), "sx_step");
}

// Every TCP socket of this process: its local and peer port and the bytes it sent that
// the peer acknowledged.
struct SocketBytes {
    int local_port = 0, peer_port = 0;
    uint64_t bytes = 0;
};

std::vector<SocketBytes> socket_table() {
    std::vector<SocketBytes> out;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return out;
    std::vector<int> fds;
    while (dirent *e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        fds.push_back(std::atoi(e->d_name));
    }
    closedir(dir);
    for (int fd : fds) {
        sockaddr_in local, peer;
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &ll) != 0 || local.sin_family != AF_INET) continue;
        if (getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &pl) != 0) continue;
        tcp_info info;
        socklen_t il = sizeof info;
        std::memset(&info, 0, sizeof info);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &il) != 0) continue;
        SocketBytes s;
        s.local_port = ntohs(local.sin_port);
        s.peer_port = ntohs(peer.sin_port);
        s.bytes = info.tcpi_bytes_acked;
        out.push_back(s);
    }
    return out;
}

// A barrier: a step of a flat group of one small param.
void barrier(sx_shard_group_t *c) { check(sx_step(c, nullptr, nullptr), "barrier"); }

// The bytes each socket sent during kByteSteps steps of g, written to `file` as lines
// "local_port peer_port bytes".
void count_bytes(sx_shard_group_t *c, sx_shard_group_t *g, const std::string &file) {
    barrier(c);
    const std::vector<SocketBytes> before = socket_table();
    for (int s = 0; s < kByteSteps; ++s) step(g);
    // Every rank's steps have ended (so every byte of them was sent) before the count.
    usleep(200000);
    const std::vector<SocketBytes> after = socket_table();
    barrier(c);
    std::map<std::pair<int, int>, uint64_t> start;
    for (const SocketBytes &s : before) start[{s.local_port, s.peer_port}] = s.bytes;
    std::ofstream out(file);
    for (const SocketBytes &s : after) {
        auto it = start.find({s.local_port, s.peer_port});
        const uint64_t delta = s.bytes - (it == start.end() ? 0 : it->second);
        out << s.local_port << " " << s.peer_port << " " << delta << "\n";
    }
}

double median_step(sx_shard_group_t *c, sx_shard_group_t *g, int reps) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        barrier(c);
        const double t0 = now_seconds();
        step(g);
        t.push_back(now_seconds() - t0);
    }
    return median(t);
}

}  // namespace

// One rank: bench_sx --mesh-rank R PORT0 REPS OUTDIR
int mesh_rank_main(int argc, char **argv) {
    if (argc != 6) return 2;
    const int rank = std::atoi(argv[2]), port0 = std::atoi(argv[3]), reps = std::atoi(argv[4]);
    const std::string dir = argv[5];
    // Two hosts, as the 2 x 2 mesh's shard groups: each pair of ranks shares memory (its
    // shard group's exchanges go through it), the rest goes over TCP.
    ::setenv("SX_HOST_ID", ("mesh-host-" + std::to_string(rank / kShard)).c_str(), 1);
    auto url = [&](int k) { return "tcp://127.0.0.1:" + std::to_string(port0 + k); };
    sx_shard_group_t *c = make_group(url(0), rank, 0, 2, 1, 1);
    for (int stage : {2, 3}) {
        sx_shard_group_t *tcp = make_group(url(stage + 3), rank, 0, stage, kUnits, kUnitNumel, SX_TRANSPORT_TCP);
        sx_shard_group_t *flat = make_group(url(stage * 2 - 3), rank, 0, stage, kUnits, kUnitNumel);
        sx_shard_group_t *mesh = make_group(url(stage * 2 - 2), rank, kShard, stage, kUnits, kUnitNumel);
        for (int w = 0; w < 2; ++w) step(tcp), step(flat), step(mesh);  // buffers touched, connections made
        const std::string s = std::to_string(stage);
        count_bytes(c, tcp, dir + "/tcp" + s + "-" + std::to_string(rank));
        count_bytes(c, flat, dir + "/flat" + s + "-" + std::to_string(rank));
        count_bytes(c, mesh, dir + "/mesh" + s + "-" + std::to_string(rank));
        // Step times, the three taking turns.
        std::vector<double> tt, tf, tm;
        for (int r = 0; r < reps; ++r) {
            tt.push_back(median_step(c, tcp, 1));
            tf.push_back(median_step(c, flat, 1));
            tm.push_back(median_step(c, mesh, 1));
        }
        if (rank == 0) {
            std::ofstream out(dir + "/times" + s);
            out << median(tt) << " " << median(tf) << " " << median(tm) << "\n";
        }
        barrier(c);
        for (sx_shard_group_t *g : {mesh, flat, tcp}) sx_destroy_shard_group(g);
    }
    sx_destroy_shard_group(c);
    return 0;
}

namespace {

// Bytes per rank per step on shard links and replica links, from the ranks' socket
// tables of one configuration.
struct LinkBytes {
    double shard = 0, replica = 0;
};

bool link_bytes(const std::string &dir, const std::string &what, LinkBytes *out) {
    struct Row {
        int rank, local, peer;
        uint64_t bytes;
    };
    std::vector<Row> rows;
    std::map<int, int> owner;  // local port -> rank
    for (int r = 0; r < kWorld; ++r) {
        std::ifstream in(dir + "/" + what + "-" + std::to_string(r));
        if (!in) return false;
        Row row;
        row.rank = r;
        while (in >> row.local >> row.peer >> row.bytes) {
            rows.push_back(row);
            owner[row.local] = r;
        }
    }
    double shard = 0, replica = 0;
    for (const Row &row : rows) {
        auto it = owner.find(row.peer);
        if (it == owner.end() || it->second == row.rank) continue;  // not a link between two ranks
        (row.rank / kShard == it->second / kShard ? shard : replica) += static_cast<double>(row.bytes);
    }
    out->shard = shard / kWorld / kByteSteps;
    out->replica = replica / kWorld / kByteSteps;
    return true;
}

}  // namespace

int section_mesh(const Options &opt) {
    char tmpl[] = "/tmp/sx-bench-mesh-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    const std::string dir = tmpl;
    const int port0 = free_ports(7);
    bool ok = port0 != 0 && run_self(kWorld, [&](int r) {
                  return std::vector<std::string>{"--mesh-rank", std::to_string(r), std::to_string(port0),
                                                  std::to_string(opt.reps), dir};
              });
    const double mib = 1024.0 * 1024.0;
    const double grads = static_cast<double>(kUnits) * kUnitNumel * sizeof(float);
    std::printf("mesh: %d ranks as processes over tcp://127.0.0.1, %d units of %lld fp32 (%.0f MiB of gradients), "
                "SGD, forward + backward (units signalled ready) + step; MiB sent per rank per step (TCP_INFO), links "
                "split by the 2 x 2 mesh's shard groups {0,1} {2,3}; step time median of %d\n",
                kWorld, kUnits, static_cast<long long>(kUnitNumel), grads / mib, opt.reps);
    std::printf("%5s %-10s %12s %14s %12s %10s\n", "stage", "group", "shard MiB", "replica MiB", "total MiB", "step ms");
    for (int stage : {2, 3}) {
        const std::string s = std::to_string(stage);
        LinkBytes flat, mesh, hier;
        double t_flat = 0, t_hier = 0, t_mesh = 0;
        std::ifstream times(dir + "/times" + s);
        if (!ok || !link_bytes(dir, "tcp" + s, &flat) || !link_bytes(dir, "flat" + s, &hier) ||
            !link_bytes(dir, "mesh" + s, &mesh) || !(times >> t_flat >> t_hier >> t_mesh)) {
            ok = false;
            break;
        }
        std::printf("%5d %-10s %12.2f %14.2f %12.2f %10.1f\n", stage, "flat", flat.shard / mib, flat.replica / mib,
                    (flat.shard + flat.replica) / mib, t_flat * 1e3);
        std::printf("%5d %-10s %12.2f %14.2f %12.2f %10.1f\n", stage, "flat hier", hier.shard / mib,
                    hier.replica / mib, (hier.shard + hier.replica) / mib, t_hier * 1e3);
        std::printf("%5d %-10s %12.2f %14.2f %12.2f %10.1f\n", stage, "2x2 hsdp", mesh.shard / mib, mesh.replica / mib,
                    (mesh.shard + mesh.replica) / mib, t_mesh * 1e3);
        std::printf("%5d replica-link bytes, 2x2 over flat: %.3f (goal 1/%d = %.3f); step time 2x2 over flat: %.3f\n",
                    stage, mesh.replica / flat.replica, kShard, 1.0 / kShard, t_mesh / t_flat);
        std::printf("%5d replica-link bytes, flat hierarchical over flat: %.3f; step time: %.3f\n", stage,
                    hier.replica / flat.replica, t_hier / t_flat);
        std::printf("{\"bench\":\"mesh\",\"ranks\":%d,\"shard_size\":%d,\"stage\":%d,\"gradient_bytes\":%.0f,"
                    "\"flat_shard_link_bytes\":%.0f,\"flat_replica_link_bytes\":%.0f,\"mesh_shard_link_bytes\":%.0f,"
                    "\"mesh_replica_link_bytes\":%.0f,\"ratio_replica_bytes_mesh_over_flat\":%.4f,"
                    "\"flat_step_ms\":%.3f,\"mesh_step_ms\":%.3f,\"ratio_step_mesh_over_flat\":%.4f,"
                    "\"hier_shard_link_bytes\":%.0f,\"hier_replica_link_bytes\":%.0f,\"hier_step_ms\":%.3f}\n",
                    kWorld, kShard, stage, grads, flat.shard, flat.replica, mesh.shard, mesh.replica,
                    mesh.replica / flat.replica, t_flat * 1e3, t_mesh * 1e3, t_mesh / t_flat, hier.shard, hier.replica,
                    t_hier * 1e3);
    }
    std::system(("rm -rf " + dir).c_str());
    if (!ok) {
        std::fprintf(stderr, "bench_sx mesh: a rank failed\n");
        return 1;
    }
    return 0;
}

}  // namespace sxbench
