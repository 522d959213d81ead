// The mesh part on its own (core/mesh.h), 4 ranks as threads over local:// (Gloo): a
// 2 x 2 mesh places each rank (shard rank = rank % 2, replica rank = rank / 2) and its
// shard and replica communicators connect the right ranks; a flat mesh uses the world's;
// a size that does not divide the world is refused on every rank; ranks that ask for
// different meshes are all told, naming each one's size.
#include <unistd.h>

#include <string>
#include <vector>

#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "core/mesh.h"
#include "run_ranks.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::Status;
using sx::core::Mesh;

namespace {

constexpr int kRanks = 4;

// Rank r's mesh of shard groups of `shard_size` over a rendezvous of its own.
Status open_mesh(const std::string &url, int r, int shard_size, Mesh *m) {
    sx::rdzv::Rendezvous rv;
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, kRanks, &rv));
    SX_TRY(sx::rdzv::open_store(rv, sx::Millis(20000), &store));
    Mesh::Settings s;
    s.timeout_ms = 20000;
    s.bind_address = "127.0.0.1";
    m->place(s, r, kRanks);
    sx::core::CallHeaders h(r, nullptr, [](Status f) { return f; });
    return m->open(store, shard_size, h, std::chrono::steady_clock::now() + std::chrono::seconds(20));
}

void test_a_2x2_mesh(void **) {
    const std::string url = "local://mesh-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) -> std::string {
        Mesh m;
        Status s = open_mesh(url, r, 2, &m);
        if (!s.ok()) return "open: " + s.message();
        if (m.shard_size() != 2 || m.shard_rank() != r % 2 || m.replicas() != 2 || m.replica_rank() != r / 2)
            return "the rank's place in the mesh";
        if (!m.replica() || &m.shard() == &m.world()) return "the mesh's communicators";
        // The shard group gathers its ranks' world ranks; the replica group its own.
        std::vector<uint64_t> shard(2, 0), replica(2, 0);
        shard[m.shard_rank()] = static_cast<uint64_t>(r);
        replica[m.replica_rank()] = static_cast<uint64_t>(r);
        if (!m.shard().all_gather(shard.data(), sizeof(uint64_t)).ok() ||
            !m.replica()->all_gather(replica.data(), sizeof(uint64_t)).ok())
            return "the mesh's collectives";
        const uint64_t first = static_cast<uint64_t>(r - r % 2);
        if (shard != std::vector<uint64_t>({first, first + 1})) return "the shard group's ranks";
        if (replica != std::vector<uint64_t>({static_cast<uint64_t>(r % 2), static_cast<uint64_t>(r % 2 + 2)}))
            return "the replica group's ranks";
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_flat_bad_and_different(void **) {
    const std::string pid = std::to_string(getpid());
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) -> std::string {
        Mesh flat;
        Status s = open_mesh("local://mesh-flat-" + pid, r, kRanks, &flat);
        if (!s.ok() || &flat.shard() != &flat.world() || flat.replica() || flat.replicas() != 1) return "flat";
        Mesh bad;
        s = open_mesh("local://mesh-bad-" + pid, r, 3, &bad);
        if (s.code() != SX_ERR_INVALID_ARGUMENT || s.message().find("shard_size 3 does not divide") == std::string::npos)
            return "a size that does not divide: " + s.message();
        Mesh different;
        s = open_mesh("local://mesh-diff-" + pid, r, r == 3 ? 1 : 2, &different);
        if (s.code() != SX_ERR_MISMATCH ||
            s.message().find("shard_size: 2 on ranks 0, 1, 2, 1 on rank 3") == std::string::npos)
            return "different sizes: " + s.message();
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_2x2_mesh),
        cmocka_unit_test(test_flat_bad_and_different),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
