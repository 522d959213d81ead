// The NCCL communicator on a GPU: every collective against exact expectations (device
// buffers filled and read back through DeviceBuffer), a rank that never joins (the
// communicator does not form: SX_ERR_TIMEOUT within the timeout, no hang), abort().
// World size 1 runs on one device; 2 ranks (threads) need two devices. Also the one-rank
// communicator of CUDA groups, which needs a device but no NCCL.
//
// Without a CUDA device (or driver, or NCCL) every test reports itself skipped with
// the reason and the program exits 77, which ctest shows as Skipped.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/half.h"
#include "comm/communicator.h"
#include "rdzv/rendezvous.h"
#include "comm_test_util.h"
#include "cuda/runtime.h"

using sx::Status;
using sx::comm::Communicator;
using sx::Millis;
using sx::cuda::DeviceBuffer;

namespace {

std::string g_skip;       // why the NCCL tests cannot run here ("" = they can)
std::string g_no_device;  // why nothing here can run ("" = there is a device)
int g_devices = 0;

#define SKIP_WITHOUT_GPU()                                     \
    do {                                                       \
        if (!g_skip.empty()) {                                 \
            print_message("skipped: %s\n", g_skip.c_str());    \
            skip();                                            \
        }                                                      \
    } while (0)

Status join(const std::string &url, int r, int p, Millis timeout, std::unique_ptr<Communicator> *out) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), &store));
    sx::comm::NcclOptions o;
    o.device = r;
    o.timeout = timeout;
    return sx::comm::create_nccl_communicator(store, r, p, o, out);
}

float rs_input(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

template <typename T>
Status upload(DeviceBuffer *d, const std::vector<T> &h) {
    SX_TRY(d->allocate(h.size() * sizeof(T), "test buffer"));
    return d->upload(h.data(), h.size() * sizeof(T));
}

// Every collective on communicator c, against exact expectations; "" or what was wrong.
std::string check_collectives(Communicator &c) {
    const int p = c.world_size(), r = c.rank();
    for (size_t shard : {size_t(1), size_t(1000), size_t(300001)}) {
        for (bool acc : {false, true}) {
            std::vector<float> in(shard * static_cast<size_t>(p));
            for (size_t i = 0; i < in.size(); ++i) in[i] = rs_input(r, i);
            DeviceBuffer buf, out;
            Status s = upload(&buf, in);
            std::vector<float> init(shard, 5.0f);
            if (s.ok()) s = upload(&out, init);
            if (s.ok()) s = c.reduce_scatter_sum(buf.as<float>(), shard, out.as<float>(), acc);
            std::vector<float> got(shard);
            if (s.ok()) s = out.download(got.data(), shard * sizeof(float));
            if (!s.ok()) return "reduce_scatter_sum: " + s.message();
            for (size_t i = 0; i < shard; ++i) {
                float want = acc ? 5.0f : 0.0f;
                for (int q = 0; q < p; ++q) want += rs_input(q, static_cast<size_t>(r) * shard + i);
                if (got[i] != want) return "reduce_scatter_sum: element " + std::to_string(i) + " is wrong";
            }
            for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16}) {
                std::vector<uint16_t> in16(in.size());
                for (size_t i = 0; i < in.size(); ++i)
                    in16[i] = dtype == SX_DTYPE_F16 ? sx::half::f32_to_f16(in[i]) : sx::half::f32_to_bf16(in[i]);
                DeviceBuffer b16, o32;
                s = upload(&b16, in16);
                if (s.ok()) s = upload(&o32, init);
                if (s.ok()) s = c.reduce_scatter_sum_16(b16.as<uint16_t>(), dtype, shard, o32.as<float>(), 2.0f, acc);
                if (s.ok()) s = o32.download(got.data(), shard * sizeof(float));
                if (!s.ok()) return "reduce_scatter_sum_16: " + s.message();
                for (size_t i = 0; i < shard; ++i) {
                    float sum = 0.0f;
                    for (int q = 0; q < p; ++q) sum += rs_input(q, static_cast<size_t>(r) * shard + i);
                    if (got[i] != (acc ? 5.0f : 0.0f) + 2.0f * sum)
                        return "reduce_scatter_sum_16: element " + std::to_string(i) + " is wrong";
                }
            }
        }
        // In place: out is this rank's chunk of buf.
        std::vector<float> in(shard * static_cast<size_t>(p));
        for (size_t i = 0; i < in.size(); ++i) in[i] = rs_input(r, i);
        DeviceBuffer buf;
        Status s = upload(&buf, in);
        if (s.ok()) s = c.reduce_scatter_sum(buf.as<float>(), shard, buf.as<float>() + static_cast<size_t>(r) * shard, false);
        std::vector<float> back(in.size());
        if (s.ok()) s = buf.download(back.data(), back.size() * sizeof(float));
        if (!s.ok()) return "reduce_scatter_sum in place: " + s.message();
        for (size_t i = 0; i < shard; ++i) {
            float want = 0.0f;
            for (int q = 0; q < p; ++q) want += rs_input(q, static_cast<size_t>(r) * shard + i);
            if (back[static_cast<size_t>(r) * shard + i] != want) return "reduce_scatter_sum in place is wrong";
        }
        // All-gather: every part ends up holding its rank's bytes.
        const size_t bytes = shard * 4 + 1;
        std::vector<uint8_t> g(bytes * static_cast<size_t>(p), 0xEE);
        for (size_t i = 0; i < bytes; ++i) g[static_cast<size_t>(r) * bytes + i] = static_cast<uint8_t>(r * 31 + i * 7);
        DeviceBuffer gb;
        s = upload(&gb, g);
        if (s.ok()) s = c.all_gather(gb.data(), bytes);
        if (s.ok()) s = gb.download(g.data(), g.size());
        if (!s.ok()) return "all_gather: " + s.message();
        for (int q = 0; q < p; ++q)
            for (size_t i = 0; i < bytes; ++i)
                if (g[static_cast<size_t>(q) * bytes + i] != static_cast<uint8_t>(q * 31 + i * 7))
                    return "all_gather: part " + std::to_string(q) + " is wrong";
    }
    double d[3] = {1.5, static_cast<double>(r), -2.0};
    Status s = c.all_reduce_sum(d, 3);
    if (!s.ok()) return "all_reduce_sum: " + s.message();
    if (d[0] != 1.5 * p || d[1] != p * (p - 1) / 2.0 || d[2] != -2.0 * p) return "all_reduce_sum is wrong";
    uint64_t m[2] = {static_cast<uint64_t>(r), ~static_cast<uint64_t>(r)};
    s = c.all_reduce_max(m, 2);
    if (!s.ok()) return "all_reduce_max: " + s.message();
    if (m[0] != static_cast<uint64_t>(p - 1) || m[1] != ~uint64_t(0)) return "all_reduce_max is wrong";
    for (int root = 0; root < p; ++root) {
        std::vector<uint8_t> v(1001, static_cast<uint8_t>(r == root ? 0x5a : 0));
        DeviceBuffer b;
        s = upload(&b, v);
        if (s.ok()) s = c.broadcast(b.data(), v.size(), root);
        if (s.ok()) s = b.download(v.data(), v.size());
        if (!s.ok()) return "broadcast: " + s.message();
        for (uint8_t x : v)
            if (x != 0x5a) return "broadcast from " + std::to_string(root) + " is wrong";
    }
    s = c.barrier();
    return s.ok() ? "" : "barrier: " + s.message();
}

void test_one_rank_collectives(void **) {
    SKIP_WITHOUT_GPU();
    std::unique_ptr<Communicator> c;
    ASSERT_OK(join("local://" + sxtest::unique_name("nccl1"), 0, 1, Millis(60000), &c));
    const std::string e = check_collectives(*c);
    if (!e.empty()) fail_msg("%s", e.c_str());
}

// The one-rank communicator of a CUDA group, without NCCL: the same expectations at
// world size 1, then abort().
void test_one_device_communicator(void **) {
    if (!g_no_device.empty()) {
        print_message("skipped: %s\n", g_no_device.c_str());
        skip();
    }
    std::unique_ptr<Communicator> c;
    ASSERT_OK(sx::comm::create_one_device_communicator(0, &c));
    const std::string e = check_collectives(*c);
    if (!e.empty()) fail_msg("%s", e.c_str());
    c->abort();
    double d = 1;
    ASSERT_CODE(c->all_reduce_sum(&d, 1), SX_ERR_ABORTED);
}

void test_two_ranks_on_two_devices(void **) {
    SKIP_WITHOUT_GPU();
    if (g_devices < 2) {
        print_message("skipped: 2 ranks need 2 CUDA devices; this machine has %d\n", g_devices);
        skip();
    }
    const std::string url = "local://" + sxtest::unique_name("nccl2");
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(60000), &c);
        return s.ok() ? check_collectives(*c) : "join: " + s.message();
    });
}

// Rank 1 never comes: rank 0's communicator does not form, and creating it fails with
// SX_ERR_TIMEOUT after about the timeout instead of hanging.
void test_missing_rank_times_out(void **) {
    SKIP_WITHOUT_GPU();
    std::unique_ptr<Communicator> c;
    const auto t0 = sxtest::Clock::now();
    ASSERT_CODE(join("local://" + sxtest::unique_name("nccl-missing"), 0, 2, Millis(3000), &c), SX_ERR_TIMEOUT);
    const long long ms = sxtest::ms_since(t0);
    assert_true(ms >= 2500 && ms < 20000);
    assert_null(c.get());
}

void test_abort_fails_later_calls(void **) {
    SKIP_WITHOUT_GPU();
    std::unique_ptr<Communicator> c;
    ASSERT_OK(join("local://" + sxtest::unique_name("nccl-abort"), 0, 1, Millis(60000), &c));
    c->abort();
    double d = 1;
    ASSERT_CODE(c->all_reduce_sum(&d, 1), SX_ERR_ABORTED);
    ASSERT_CODE(c->barrier(), SX_ERR_ABORTED);
}

}  // namespace

int main() {
    if (!sx::cuda::device_available(&g_skip)) {
        g_skip = "no CUDA device: " + g_skip;
        g_no_device = g_skip;
    } else {
        // A device exists; NCCL must open too.
        std::unique_ptr<Communicator> probe;
        Status s = join("local://" + sxtest::unique_name("nccl-probe"), 0, 1, Millis(60000), &probe);
        if (s.code() == SX_ERR_UNSUPPORTED) g_skip = s.message();
        g_devices = sx::cuda::device_count();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_collectives),
        cmocka_unit_test(test_one_device_communicator),
        cmocka_unit_test(test_two_ranks_on_two_devices),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_abort_fails_later_calls),
    };
    const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
    if (failed == 0 && !g_skip.empty()) return 77;
    return failed;
}
