// Contexts (sx_context.h): many tenants' groups on one rendezvous, one transport and one
// pool.
//  - Tenants stepped at once from threads of their own, in different orders on each rank,
//    train to the bits of the same tenants made without a context.
//  - A tenant's failure (ranks in different calls: SX_ERR_MISMATCH; a load of a checkpoint
//    that is not there) fails that tenant alone; the others go on to the same bits.
//  - A budget refuses a group's sx_finalize on every rank before anything is allocated,
//    naming the budget, the request and the use; the stats count what the groups hold.
//  - Names: unique among live groups, reusable after one goes; a destroyed handle lets its
//    groups live and refuses new ones; groups made in a context open channels, no socket.
//  - Ranks as processes over tcp://: the same tenants; a peer's death fails them all, and
//    each regroups on its own from its memory copies. On one host, on hosts of one rank
//    each, and on two hosts of two ranks each (shared memory within each host and Gloo
//    between: the tenants end on the bits of the same tenant made without a context,
//    which is hierarchical too). A process outside the context joins a tenant by name.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"
#include "process_ranks.h"
#include "rdzv/stores.h"
#include "run_ranks.h"
#include "sx_cmocka.h"
#include "view_values.h"

namespace {

using sxtest::view_get;
using sxtest::view_put;

constexpr int kElems = 1000;

std::string failed(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + " (" + sx_last_error_message() + ")";
}

// One tenant: a group with params "w" (kElems fp32 values, AdamW) and "b" (7 values, SGD
// with momentum), in `ctx` (or on `rendezvous` of its own where ctx is null).
struct Tenant {
    sx_shard_group_t *g = nullptr;
    int id = 0, rank = 0, world = 0, stage = 2, memory_copies = 0, shard_size = 0;
    bool tcp = false;  // alone: Gloo's TCP (the transport of a context across hosts)
    ~Tenant() { sx_destroy_shard_group(g); }

    sx_status_t create(sx_context_t *ctx, const std::string &rendezvous, const std::string &name) {
        sx_group_config_t c;
        sx_group_config_init(&c, sizeof c);
        c.stage = stage;
        c.memory_copy_interval = memory_copies;
        c.shard_size = shard_size;
        c.timeout_ms = ctx ? 0 : 20000;
        if (ctx) {
            c.context = ctx;
            c.name = name.c_str();
        } else {
            c.rendezvous = rendezvous.c_str();
            c.rank = rank;
            c.world_size = world;
            c.num_threads = 1;
            if (tcp) c.transport = SX_TRANSPORT_TCP;
        }
        sx_status_t st = sx_create_shard_group(&c, &g);
        if (st != SX_OK) return st;
        return add_params(this->stage);
    }

    sx_status_t add_params(int) {
        sx_param_group_desc_t d;
        sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
        d.lr = 1e-2 * (1 + id);
        d.weight_decay = 0.01;
        sx_status_t st = sx_add_param_group(g, &d, nullptr);
        sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD);
        d.lr = 0.1;
        d.momentum = 0.9;
        if (st == SX_OK) st = sx_add_param_group(g, &d, nullptr);
        const int64_t shapes[2] = {kElems, 7};
        const char *names[2] = {"w", "b"};
        for (int p = 0; p < 2 && st == SX_OK; ++p) {
            sx_param_desc_t pd;
            sx_param_desc_init(&pd, sizeof pd);
            pd.name = names[p];
            pd.ndim = 1;
            pd.shape = &shapes[p];
            pd.param_group = p;
            pd.unit = p;
            st = sx_add_param(g, &pd, nullptr);
        }
        return st;
    }

    sx_status_t init() {
        for (int p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t st = sx_param_view(g, p, &v);
            if (st != SX_OK) return st;
            for (uint64_t i = 0; i < v.numel; ++i) view_put(v, i, std::cos(0.01f * i + p + id));
        }
        return SX_OK;
    }

    sx_status_t step(int s) {
        for (int p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t st = sx_grad_view(g, p, &v);
            if (st != SX_OK) return st;
            for (uint64_t i = 0; i < v.numel; ++i)
                view_put(v, i, std::sin(0.1f * (i + 1) * (s + 1) + id + 0.3f * rank + p));
        }
        return sx_step(g, nullptr, nullptr);
    }

    sx_status_t params(std::vector<float> *out) {
        out->clear();
        for (int p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t st = sx_param_view(g, p, &v);
            if (st != SX_OK) return st;
            for (uint64_t i = 0; i < v.numel; ++i) out->push_back(view_get(v, i));
        }
        return SX_OK;
    }

    // finalize, init and `steps` steps: "" or what failed.
    std::string train(int steps) {
        sx_status_t st = sx_finalize(g);
        if (st != SX_OK) return failed("finalize", st);
        if ((st = init()) != SX_OK) return failed("init", st);
        for (int s = 0; s < steps; ++s)
            if ((st = step(s)) != SX_OK) return failed("step", st);
        return "";
    }
};

// tcp: the context's transport may not share memory (SX_TRANSPORT_TCP): its groups take
// channels on its one Gloo mesh, as where its ranks span hosts.
sx_context_t *make_context(const std::string &rendezvous, int rank, int world, uint64_t budget, sx_status_t *st,
                           bool tcp = false, int timeout_ms = 20000) {
    sx_context_config_t c;
    sx_context_config_init(&c, sizeof c);
    if (tcp) c.transport = SX_TRANSPORT_TCP;
    c.rendezvous = rendezvous.c_str();
    c.rank = rank;
    c.world_size = world;
    c.backend = SX_BACKEND_CPU;
    c.num_threads = 1;
    c.timeout_ms = timeout_ms;
    c.memory_budget_bytes = budget;
    sx_context_t *ctx = nullptr;
    *st = sx_create_context(&c, &ctx);
    return ctx;
}

// The final params of `tenants` tenants trained `steps` steps each without a context.
std::vector<std::vector<float>> reference(int world, int tenants, int steps, const std::string &tag, bool tcp = false,
                                          int shard_size = 0) {
    std::vector<std::vector<float>> out(static_cast<size_t>(tenants));
    for (int t = 0; t < tenants; ++t) {
        const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
            Tenant x;
            x.id = t;
            x.rank = rank;
            x.world = world;
            x.tcp = tcp;
            x.shard_size = shard_size;
            sx_status_t st = x.create(nullptr, "local://ctx-ref-" + tag + std::to_string(t), "");
            if (st != SX_OK) return failed("create", st);
            std::string e = x.train(steps);
            if (!e.empty()) return e;
            if (rank == 0 && (st = x.params(&out[static_cast<size_t>(t)])) != SX_OK) return failed("params", st);
            return "";
        });
        if (!err.empty()) fail_msg("reference tenant %d: %s", t, err.c_str());
    }
    return out;
}

// 3 tenants in one context of `world` ranks, each stepped on a thread of its own (started
// in a different order on each rank), train to the bits of the same tenants alone.
// tcp: on the context's Gloo channels, against tenants alone on Gloo's TCP; shard_size: an
// HSDP mesh (its shard and replica groups are channels too).
void tenants_at_once(int world, bool tcp = false, int shard_size = 0) {
    const int tenants = 3, steps = 4;
    const std::string tag = (tcp ? "tcp" : "a") + std::to_string(world) + "-" + std::to_string(shard_size);
    const std::vector<std::vector<float>> want = reference(world, tenants, steps, tag, tcp, shard_size);
    std::vector<std::vector<float>> got(static_cast<size_t>(tenants));
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        sx_context_t *ctx = make_context("local://ctx-at-once-" + tag, rank, world, 0, &st, tcp);
        if (!ctx) return failed("context", st);
        std::vector<std::string> errs(static_cast<size_t>(tenants));
        std::vector<std::thread> threads;
        for (int k = 0; k < tenants; ++k) {
            const int t = (k + rank) % tenants;  // each rank starts them in another order
            threads.emplace_back([&, t] {
                Tenant x;
                x.id = t;
                x.rank = rank;
                x.shard_size = shard_size;
                sx_status_t s = x.create(ctx, "", "tenant-" + std::to_string(t));
                std::string e = s == SX_OK ? x.train(steps) : failed("create", s);
                sx_context_stats_t cs;
                sx_context_stats_init(&cs, sizeof cs);
                sx_get_context_stats(ctx, &cs);
                // On Gloo, each tenant's communicators (3 for a mesh) are channels of the context,
                // which keep the blocks of their calls (transport_bytes; none in shared memory).
                if (e.empty() && tcp && (cs.shared_memory != 0 || cs.channels < (shard_size ? 3 : 1)))
                    e = "the context's channels: " + std::to_string(cs.channels) + ", shared memory " +
                        std::to_string(cs.shared_memory);
                if (e.empty() && (tcp ? cs.transport_bytes == 0 : cs.transport_bytes != 0))
                    e = "the context's transport keeps " + std::to_string(cs.transport_bytes) + " bytes";
                if (e.empty() && rank == 0 && (s = x.params(&got[static_cast<size_t>(t)])) != SX_OK)
                    e = failed("params", s);
                errs[static_cast<size_t>(t)] = e;
            });
        }
        for (auto &t : threads) t.join();
        sx_destroy_context(ctx);
        for (int t = 0; t < tenants; ++t)
            if (!errs[static_cast<size_t>(t)].empty()) return "tenant " + std::to_string(t) + ": " + errs[static_cast<size_t>(t)];
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    for (int t = 0; t < tenants; ++t) {
        assert_int_equal(got[static_cast<size_t>(t)].size(), want[static_cast<size_t>(t)].size());
        assert_memory_equal(got[static_cast<size_t>(t)].data(), want[static_cast<size_t>(t)].data(),
                            want[static_cast<size_t>(t)].size() * sizeof(float));
    }
}

// Rank 0 keeps off shared memory (SX_TRANSPORT_TCP) and rank 1 does not: the context, and a
// group of the same two ranks without one, form at once on Gloo (none shares memory)
// rather than at rank 1's timeout, and train.
void test_a_rank_off_shared_memory(void **) {
    const std::string tag = "ctx-off-shm-" + std::to_string(::getpid());
    const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        const auto start = std::chrono::steady_clock::now();
        sx_status_t st;
        sx_context_t *ctx = make_context("local://" + tag, rank, 2, 0, &st, rank == 0, 20000);
        if (!ctx) return failed("context", st);
        sx_context_stats_t cs;
        sx_context_stats_init(&cs, sizeof cs);
        sx_get_context_stats(ctx, &cs);
        std::string e;
        if (cs.shared_memory != 0) e = "the context shares memory: " + std::to_string(cs.shared_memory);
        Tenant x;
        x.rank = rank;
        x.world = 2;
        if (e.empty() && (st = x.create(ctx, "", "tenant")) != SX_OK) e = failed("create in the context", st);
        if (e.empty()) e = x.train(2);
        sx_destroy_context(ctx);
        Tenant y;
        y.rank = rank;
        y.world = 2;
        y.tcp = rank == 0;
        if (e.empty() && (st = y.create(nullptr, "local://" + tag + "-group", "")) != SX_OK) e = failed("create", st);
        if (e.empty()) e = y.train(2);
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        if (e.empty() && took.count() > 10000) e = "took " + std::to_string(took.count()) + " ms";
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_tenants_at_once_2(void **) { tenants_at_once(2); }
void test_tenants_at_once_3(void **) { tenants_at_once(3); }
void test_tenants_at_once_on_gloo_channels_2(void **) { tenants_at_once(2, true); }
void test_tenants_at_once_on_gloo_channels_3(void **) { tenants_at_once(3, true); }
// 4 ranks, shard groups of 2 and 2 replicas: each tenant's 3 communicators are channels.
void test_mesh_tenants_on_gloo_channels(void **) { tenants_at_once(4, true, 2); }
// 6 ranks on a sparse mesh, each tenant a mesh of 2 shards of 3: every replica channel
// ({0, 3}, {1, 4}, {2, 5}) needs a pair the mesh lacks (3 apart), which the 3 tenants'
// threads ask for at once.
void test_mesh_tenants_on_a_sparse_mesh(void **) {
    ::setenv("SX_GLOO_MESH", "sparse", 1);
    tenants_at_once(6, true, 3);
}
int unset_gloo_mesh(void **) { return ::unsetenv("SX_GLOO_MESH"); }

// Tenant 1 fails three times (ranks in different calls; a load of no checkpoint; NaN
// gradients under SX_NONFINITE_ERROR); tenants 0 and 2 step on around it and end on the
// bits of tenants alone.
void a_tenants_failure_stays_in_it(bool tcp) {
    const int world = 2, steps = 3;
    const std::vector<std::vector<float>> want = reference(world, 3, steps, tcp ? "ftcp" : "f", tcp);
    std::vector<std::vector<float>> got(3);
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        sx_context_t *ctx = make_context(tcp ? "local://ctx-failure-tcp" : "local://ctx-failure", rank, world, 0, &st, tcp);
        if (!ctx) return failed("context", st);
        std::string out;
        {
            Tenant t[3];
            for (int k = 0; k < 3 && out.empty(); ++k) {
                t[k].id = k;
                t[k].rank = rank;
                if ((st = t[k].create(ctx, "", "t" + std::to_string(k))) != SX_OK) out = failed("create", st);
                if (out.empty() && (st = sx_finalize(t[k].g)) != SX_OK) out = failed("finalize", st);
                if (out.empty() && (st = t[k].init()) != SX_OK) out = failed("init", st);
            }
            for (int s = 0; s < steps && out.empty(); ++s) {
                if ((st = t[0].step(s)) != SX_OK) out = failed("tenant 0 step", st);
                if (s == 1) {
                    // Rank 0 steps tenant 1, rank 1 broadcasts its params: both told at once.
                    st = rank == 0 ? t[1].step(s) : sx_broadcast_params(t[1].g, 0);
                    if (st != SX_ERR_MISMATCH) out = "tenant 1's mixed calls gave " + failed("", st);
                    sx_load_options_t lo;
                    sx_load_optim_state_options_init(&lo, sizeof lo);
                    lo.path = "/nonexistent/sx-context-test/step-1";
                    st = sx_load_optim_state(t[1].g, &lo);
                    if (out.empty() && st == SX_OK) out = "tenant 1 loaded a checkpoint that is not there";
                }
                if (s == 2 && out.empty()) {
                    // Tenant 1's gradients are NaN, and its policy makes that an error.
                    sx_view_t v;
                    sx_view_init(&v, sizeof v);
                    sx_grad_view(t[1].g, 0, &v);
                    sxtest::view_put(v, 3, std::nanf(""));
                    sx_step_options_t so;
                    sx_step_options_init(&so, sizeof so);
                    so.nonfinite = SX_NONFINITE_ERROR;
                    if ((st = sx_step(t[1].g, &so, nullptr)) != SX_ERR_NONFINITE)
                        out = "tenant 1's NaN gradients under SX_NONFINITE_ERROR gave " + failed("", st);
                }
                if (out.empty() && (st = t[2].step(s)) != SX_OK) out = failed("tenant 2 step", st);
            }
            if (out.empty() && rank == 0) {
                t[0].params(&got[0]);
                t[2].params(&got[2]);
            }
        }
        sx_destroy_context(ctx);
        return out;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    for (int t : {0, 2}) {
        assert_int_equal(got[t].size(), want[t].size());
        assert_memory_equal(got[t].data(), want[t].data(), want[t].size() * sizeof(float));
    }
}

void test_a_tenants_failure_stays_in_it(void **) { a_tenants_failure_stays_in_it(false); }
void test_a_tenants_failure_stays_in_it_on_gloo_channels(void **) { a_tenants_failure_stays_in_it(true); }

// One rank fails tenant a's call, and the others' calls on it fail at once, not at their
// own timeouts; tenant b steps on. 3 ranks: rank 1 stalls (it is not in the call), rank 0
// and rank 2 are. `timeout`: the context's timeout is 4 s; rank 2 comes 2.5 s after rank 0,
// whose call times out, and fails about 1.5 s into its own (not 4 s); rank 1 calls later
// and fails at once. Else (sx_abort): a timeout of 60 s; rank 0's call is aborted 0.5 s
// into it, rank 2 fails at once, and rank 1, calling late_ms later, too. Each peer's error
// names the group, rank 0 and why. returned (threads; null for processes): rank 1 calls
// once ranks 0 and 2 have returned, rather than at a time. A rank 3 (two hosts of two)
// does as rank 1. "" or what went wrong.
std::string peers_fail_at_once(sx_context_t *ctx, int rank, bool timeout, std::vector<float> *b_params,
                               std::atomic<int> *returned = nullptr, int late_ms = 2000) {
    using Ms = std::chrono::milliseconds;
    Tenant a, b;
    a.rank = b.rank = rank;
    b.id = 1;
    sx_status_t st;
    if ((st = a.create(ctx, "", "a")) != SX_OK || (st = b.create(ctx, "", "b")) != SX_OK) return failed("create", st);
    std::string e = a.train(1);
    if (e.empty() && (st = sx_finalize(b.g)) != SX_OK) e = failed("finalize b", st);
    if (e.empty() && (st = b.init()) != SX_OK) e = failed("init b", st);
    if (!e.empty()) return e;
    const auto start = std::chrono::steady_clock::now();
    const int come_at = rank == 0 ? 0 : rank == 2 ? (timeout ? 2500 : 0) : (timeout ? 7000 : late_ms);
    if (rank == 1 && returned) {
        while (returned->load() < 2 && std::chrono::steady_clock::now() < start + Ms(30000))
            std::this_thread::sleep_for(Ms(10));
    } else {
        std::this_thread::sleep_until(start + Ms(come_at));
    }
    std::thread aborter;
    if (rank == 0 && !timeout)
        aborter = std::thread([&] {
            std::this_thread::sleep_for(Ms(500));
            sx_abort(a.g);
        });
    double v[2] = {1.0, 2.0};
    const auto called = std::chrono::steady_clock::now();
    st = sx_all_reduce(a.g, v, 2, SX_REDUCE_SUM);
    const long long took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - called).count();
    const std::string msg = sx_last_error_message();
    if (returned && rank != 1) returned->fetch_add(1);
    if (aborter.joinable()) aborter.join();
    const sx_status_t want = rank == 0 ? (timeout ? SX_ERR_TIMEOUT : SX_ERR_ABORTED) : timeout ? SX_ERR_TIMEOUT : SX_ERR_COMM;
    // Rank 2 fails when rank 0 does (1.5 s into its call, or 0.5 s); rank 1 at once.
    const long long most = rank == 0 ? 60000 : rank == 2 ? (timeout ? 3000 : 5000) : 1500;
    if (st != want || took > most)
        return "tenant a's call gave " + failed("", st) + " after " + std::to_string(took) + " ms, not " +
               sx_status_string(want) + " within " + std::to_string(most) + " ms";
    if (rank != 0 && (msg.find("group 'a'") == std::string::npos || msg.find("its rank 0") == std::string::npos ||
                      msg.find(timeout ? "timeout" : "sx_abort") == std::string::npos))
        return "the error does not name the group, rank 0 and why: " + msg;
    if (rank == 2) std::printf("rank 2's error after %lld ms: %s\n", took, msg.c_str());
    for (int s = 0; s < 3; ++s)
        if ((st = b.step(s)) != SX_OK) return failed("tenant b steps on", st);
    if (rank == 0 && (st = b.params(b_params)) != SX_OK) return failed("params", st);
    return "";
}

// Ranks as threads, over shared memory or (tcp) the Gloo channels; tenant b ends on the
// bits of the same tenant trained alone.
void peers_fail_at_once_threads(bool tcp, bool timeout) {
    const int world = 3;
    const std::string tag = std::string(tcp ? "tcp" : "shm") + (timeout ? "-timeout" : "-abort");
    const std::vector<std::vector<float>> want = reference(world, 2, 3, "notice-" + tag, tcp);
    std::vector<float> got;
    std::atomic<int> returned{0};
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        sx_context_t *ctx =
            make_context("local://ctx-notice-" + tag, rank, world, 0, &st, tcp, timeout ? 4000 : 60000);
        if (!ctx) return failed("context", st);
        std::string e = peers_fail_at_once(ctx, rank, timeout, &got, &returned);
        sx_destroy_context(ctx);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    assert_int_equal(got.size(), want[1].size());
    assert_memory_equal(got.data(), want[1].data(), want[1].size() * sizeof(float));
}

void test_peers_fail_at_once_abort(void **) { peers_fail_at_once_threads(false, false); }
void test_peers_fail_at_once_timeout(void **) { peers_fail_at_once_threads(false, true); }
void test_peers_fail_at_once_abort_on_gloo_channels(void **) { peers_fail_at_once_threads(true, false); }
void test_peers_fail_at_once_timeout_on_gloo_channels(void **) { peers_fail_at_once_threads(true, true); }

// A budget that holds tenant 0 but not tenant 0 and 1: tenant 1's finalize is refused on
// both ranks (rank 1's budget is the small one), naming the budget, and nothing is held for
// it; destroying tenant 0 gives its bytes back.
void test_budget(void **) {
    const int world = 2;
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        // A tenant holds about 12 KB (its params and grads, 4 KiB each, AdamW's two slots
        // and SGD's one of its shard): room for one.
        sx_context_t *ctx = make_context("local://ctx-budget", rank, world, rank == 1 ? 20000 : 0, &st);
        if (!ctx) return failed("context", st);
        std::string out;
        sx_context_stats_t s0, s1, s2, s3;
        for (sx_context_stats_t *s : {&s0, &s1, &s2, &s3}) sx_context_stats_init(s, sizeof *s);
        {
            Tenant a, b;
            a.rank = b.rank = rank;
            b.id = 1;
            if ((st = a.create(ctx, "", "a")) != SX_OK || (st = sx_finalize(a.g)) != SX_OK) out = failed("tenant a", st);
            sx_get_context_stats(ctx, &s0);
            if (out.empty() && (st = b.create(ctx, "", "b")) != SX_OK) out = failed("create b", st);
            if (out.empty()) {
                st = sx_finalize(b.g);
                const std::string msg = sx_last_error_message();
                if (st != SX_ERR_OUT_OF_MEMORY) out = "tenant b's finalize over the budget gave " + failed("", st);
                else if (rank == 1 && (msg.find("budget of") == std::string::npos || msg.find("requested") == std::string::npos ||
                                       msg.find("held by its groups") == std::string::npos))
                    out = "the refusal does not name the budget, the request and the use: " + msg;
                else if (rank == 1)
                    std::printf("rank 1's refusal: %s\n", msg.c_str());
                else if (rank == 0 && msg.find("rank 1") == std::string::npos)
                    out = "rank 0 is not told which rank refused: " + msg;
            }
            sx_get_context_stats(ctx, &s1);
            if (out.empty() && (st = a.step(0)) != SX_OK) out = failed("tenant a steps on", st);
        }
        sx_get_context_stats(ctx, &s2);
        if (out.empty() && rank == 1) {
            if (s0.memory_bytes < 10000 || s0.memory_bytes > 20000 || s0.memory_budget_bytes != 20000)
                out = "tenant a holds " + std::to_string(s0.memory_bytes) + " bytes of a budget of " +
                      std::to_string(s0.memory_budget_bytes);
            else if (s1.memory_bytes != s0.memory_bytes)
                out = "the refused finalize holds " + std::to_string(s1.memory_bytes - s0.memory_bytes) + " bytes";
            else if (s2.memory_bytes != 0 || s2.groups != 0 || s1.groups != 2 || s2.groups_created != 2)
                out = "after both went: " + std::to_string(s2.memory_bytes) + " bytes, " + std::to_string(s2.groups) +
                      " groups";
            else if (s0.shared_memory != 1 || s0.channels < 1)
                out = "the context's groups are not on its shared memory";
        }
        sx_destroy_context(ctx);
        return out;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Names: a live group's name is refused, a gone one's reused (its keys are not read
// again); a group with no name, or the context's fields set otherwise, is refused; 100
// groups in turn open channels of the context only; a destroyed handle refuses new groups
// while the live ones go on.
void test_names_and_lifetime(void **) {
    const int world = 2;
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        sx_context_t *ctx = make_context("local://ctx-names", rank, world, 0, &st);
        if (!ctx) return failed("context", st);
        Tenant keep;
        keep.rank = rank;
        if ((st = keep.create(ctx, "", "keep")) != SX_OK) return failed("create keep", st);
        sx_group_config_t c;
        sx_group_config_init(&c, sizeof c);
        c.context = ctx;
        c.name = "keep";
        sx_shard_group_t *g = nullptr;
        if ((st = sx_create_shard_group(&c, &g)) != SX_ERR_INVALID_STATE || g)
            return "a second live 'keep' gave " + failed("", st);
        c.name = nullptr;
        if ((st = sx_create_shard_group(&c, &g)) != SX_ERR_INVALID_ARGUMENT) return "no name gave " + failed("", st);
        c.name = "x";
        c.rendezvous = "local://elsewhere";
        if ((st = sx_create_shard_group(&c, &g)) != SX_ERR_INVALID_ARGUMENT) return "a rendezvous gave " + failed("", st);
        c.rendezvous = nullptr;
        c.name = "bad name!";
        if ((st = sx_create_shard_group(&c, &g)) != SX_ERR_INVALID_ARGUMENT) return "a bad name gave " + failed("", st);
        for (int i = 0; i < 100; ++i) {
            Tenant t;
            t.rank = rank;
            t.id = i % 3;
            if ((st = t.create(ctx, "", "again")) != SX_OK) return "group " + std::to_string(i) + ": " + failed("", st);
            std::string e = t.train(1);
            if (!e.empty()) return "group " + std::to_string(i) + ": " + e;
        }
        sx_context_stats_t s;
        sx_context_stats_init(&s, sizeof s);
        sx_get_context_stats(ctx, &s);
        if (s.groups != 1 || s.groups_created != 101) return "stats: " + std::to_string(s.groups) + " groups";
        sx_destroy_context(ctx);
        std::string e = keep.train(2);
        if (!e.empty()) return "after the context's handle went: " + e;
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A gone group's keys leave the context's store: once both ranks' group "a" went, the
// next group made in the context erases them (each rank counts itself out, the last
// erases), and the live group's stay.
void test_gone_groups_keys_are_erased(void **) {
    const int world = 2;
    const std::string name = "ctx-keys-" + std::to_string(::getpid());
    std::shared_ptr<sx::rdzv::Store> raw = sx::rdzv::open_local_store(name);  // the context's, in this process
    auto present = [&](const std::string &key) {
        bool p = false;
        return raw->check({"g1/" + key}, &p).ok() && p;
    };
    std::atomic<int> stage{0};
    const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
        sx_status_t st;
        sx_context_t *ctx = make_context("local://" + name, rank, world, 0, &st);
        if (!ctx) return failed("context", st);
        {
            Tenant a;
            a.rank = rank;
            if ((st = a.create(ctx, "", "a")) != SX_OK) return failed("create a", st);
            std::string e = a.train(1);
            if (!e.empty()) return e;
            if (!present("groups/a/0/__sx/said/" + std::to_string(rank))) return "group a's keys are not where expected";
        }
        Tenant b;
        b.rank = rank;
        if ((st = b.create(ctx, "", "b")) != SX_OK) return failed("create b", st);
        std::string e = b.train(1);
        if (!e.empty()) return e;
        // Both ranks made b: both counted themselves out of a first.
        stage.fetch_add(1);
        while (stage.load() < world) std::this_thread::yield();
        for (int r = 0; r < world; ++r)
            if (present("groups/a/0/__sx/said/" + std::to_string(r))) return "a gone group's keys stayed";
        if (present("groups/a/0/__sx/left")) return "a gone group's count of leavers stayed";
        if (!present("groups/b/0/__sx/said/" + std::to_string(rank))) return "the live group's keys went";
        sx_destroy_context(ctx);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// ----------------------------------------------------------------------------------
// Processes over tcp://

// The sockets this process holds open (its /proc/self/fd entries that are sockets).
int sockets_open() {
    int n = 0;
    for (int fd = 0; fd < 4096; ++fd) {
        char link[64], target[128];
        std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        const ssize_t len = ::readlink(link, target, sizeof target - 1);
        if (len > 0) n += std::strncmp(target, "socket:", 7) == 0;
    }
    return n;
}

// Ranks on hosts of their own: the context has no shared memory; 20 more groups, trained a
// step each and kept alive, are 22 channels at least (a group has 1 or more) and open no
// socket (sockets_before: with the context alone).
int many_groups_no_socket(sx_context_t *ctx, int rank, const sx_context_stats_t &before, int sockets_before) {
    if (before.shared_memory != 0) return std::fprintf(stderr, "ranks on hosts of their own: shared memory\n"), 3;
    std::vector<Tenant> more(20);
    for (size_t k = 0; k < more.size(); ++k) {
        more[k].id = static_cast<int>(k % 3);
        more[k].rank = rank;
        sx_status_t st = more[k].create(ctx, "", "more-" + std::to_string(k));
        std::string e = st == SX_OK ? more[k].train(1) : failed("create", st);
        if (!e.empty()) return std::fprintf(stderr, "rank %d group %zu: %s\n", rank, k, e.c_str()), 3;
    }
    sx_context_stats_t s;
    sx_context_stats_init(&s, sizeof s);
    sx_get_context_stats(ctx, &s);
    const int sockets = sockets_open();
    if (sockets != sockets_before || s.channels < 22 || s.shared_memory != 0 || s.groups != 22)
        return std::fprintf(stderr, "rank %d: %d sockets before the groups, %d with 22 of them; %lld channels\n", rank,
                            sockets_before, sockets, static_cast<long long>(s.channels)), 3;
    return 0;
}

// Tenant `id` made without a context on these processes' ranks (`rendezvous`: its own),
// trained `steps` steps: "" or what failed; *params: its final params.
std::string alone_in_processes(const sxtest::ChildArgs &a, const std::string &rendezvous, int id, int steps,
                               std::vector<float> *params) {
    Tenant x;
    x.id = id;
    x.rank = a.rank;
    x.world = a.world;
    sx_status_t st = x.create(nullptr, rendezvous, "");
    std::string e = st == SX_OK ? x.train(steps) : failed("create alone", st);
    if (e.empty() && (st = x.params(params)) != SX_OK) e = failed("params alone", st);
    return e;
}

// Two hosts of two ranks each: the context shares memory within each host (stats 2), a
// group's communicator is three channels (this host's shared memory, the Gloo mesh
// between the host peers, and among every rank), and tenant 1 ends on the bits of the same
// tenant made without a context (hierarchical too) on `ref` (a rendezvous of its own).
int hosts_of_two(const sxtest::ChildArgs &a, const sx_context_stats_t &s, int sockets_before, Tenant *t) {
    if (s.shared_memory != 2 || s.channels < 6 || sockets_open() != sockets_before)
        return std::fprintf(stderr, "rank %d: shared memory %d, %lld channels, %d sockets before the groups, %d after\n",
                            a.rank, s.shared_memory, static_cast<long long>(s.channels), sockets_before,
                            sockets_open()), 3;
    std::vector<float> got, want;
    sx_status_t st = t->params(&got);
    std::string e = st == SX_OK ? alone_in_processes(a, a.get("--ref", ""), t->id, 2, &want) : failed("params", st);
    if (e.empty() && got != want) e = "tenant 1's params differ from the same tenant made without a context";
    if (!e.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str()), 3;
    return 0;
}

// Whether every rank of g holds the same params (min and max of their weighted sum agree).
std::string params_agree(Tenant &t) {
    std::vector<float> v;
    sx_status_t st = t.params(&v);
    if (st != SX_OK) return failed("params", st);
    double h = 0;
    for (size_t i = 0; i < v.size(); ++i) h += static_cast<double>(v[i]) * static_cast<double>(i + 1);
    double lo = h, hi = h;
    if ((st = sx_all_reduce(t.g, &lo, 1, SX_REDUCE_MIN)) != SX_OK || (st = sx_all_reduce(t.g, &hi, 1, SX_REDUCE_MAX)) != SX_OK)
        return failed("all_reduce", st);
    return lo == h && hi == h ? "" : "the ranks' params differ after the join";
}

// Ranks 0 and 1 make a context of 2 with tenants p0 (memory copies) and p1; rank 2, not one
// of the context's ranks, joins p0 by its name on the context's rendezvous. The members
// admit it (sx_poll_joiners, sx_regroup), p0 steps on 3 ranks with the same params on each
// (the joiner's shard came from the members' copies), and p1 steps on in the context.
int join_main(const sxtest::ChildArgs &a) {
    sx_status_t st;
    Tenant t[2];
    std::string e;
    if (a.rank == 2) {
        sx_group_config_t c;
        sx_group_config_init(&c, sizeof c);
        c.rendezvous = a.rendezvous.c_str();
        c.flags = SX_GROUP_JOIN;
        c.name = "p0";
        c.timeout_ms = 30000;
        c.num_threads = 1;
        c.stage = t[0].stage;
        if ((st = sx_create_shard_group(&c, &t[0].g)) != SX_OK || (st = t[0].add_params(0)) != SX_OK ||
            (st = sx_finalize(t[0].g)) != SX_OK)
            return std::fprintf(stderr, "joiner: %s\n", failed("create", st).c_str()), 3;
        sx_regroup_options_t ro;
        sx_regroup_options_init(&ro, sizeof ro);
        sx_regroup_result_t rr;
        sx_regroup_result_init(&rr, sizeof rr);
        if ((st = sx_regroup(t[0].g, &ro, &rr)) != SX_OK || rr.rank != 2 || rr.world_size != 3 || rr.previous_rank != -1)
            return std::fprintf(stderr, "joiner: %s (rank %d of %d)\n", failed("regroup", st).c_str(), rr.rank,
                                rr.world_size), 3;
        t[0].rank = 2;
        e = (st = t[0].step(2)) == SX_OK ? params_agree(t[0]) : failed("step after the join", st);
        if (!e.empty()) return std::fprintf(stderr, "joiner: %s\n", e.c_str()), 3;
        return 0;
    }
    sx_context_t *ctx = make_context(a.rendezvous, a.rank, 2, 0, &st);
    if (!ctx) return std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("context", st).c_str()), 3;
    for (int k = 0; k < 2; ++k) {
        t[k].id = k;
        t[k].rank = a.rank;
        t[k].memory_copies = 1;
        e = (st = t[k].create(ctx, "", "p" + std::to_string(k))) == SX_OK ? t[k].train(2) : failed("create", st);
        if (!e.empty()) return std::fprintf(stderr, "rank %d tenant %d: %s\n", a.rank, k, e.c_str()), 3;
    }
    int32_t waiting = 0;
    for (int tries = 0; tries < 600 && waiting == 0; ++tries) {
        if ((st = sx_poll_joiners(t[0].g, &waiting)) != SX_OK)
            return std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("poll_joiners", st).c_str()), 3;
        if (waiting == 0) ::usleep(50000);
    }
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    ro.admit = waiting;
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    if (waiting != 1 || (st = sx_regroup(t[0].g, &ro, &rr)) != SX_OK || rr.world_size != 3 || rr.rank != a.rank)
        return std::fprintf(stderr, "rank %d: %d waiting; %s (rank %d of %d)\n", a.rank, waiting,
                            failed("regroup", st).c_str(), rr.rank, rr.world_size), 3;
    e = (st = t[0].step(2)) == SX_OK ? params_agree(t[0]) : failed("p0's step after the join", st);
    if (e.empty() && (st = t[1].step(2)) != SX_OK) e = failed("p1's step in the context", st);
    if (!e.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str()), 3;
    sx_destroy_context(ctx);
    return 0;
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string mode = a.get("--mode", "train");
    if (mode == "join") return join_main(a);
    // "apart": each rank says it runs on a host of its own (SX_HOST_ID), as ranks on several
    // hosts do: the context's groups take channels on its one Gloo mesh. "pairs": ranks 2h
    // and 2h + 1 say they run on host h: shared memory within each host, Gloo between.
    // "sparse": as "apart", on a sparse Gloo mesh (SX_GLOO_MESH), whose channels make the
    // pairs they need beyond the mesh's and relay failure notices.
    const std::string hosts = a.get("--hosts", "one");
    const bool apart = hosts == "apart" || hosts == "sparse";
    if (hosts == "sparse") ::setenv("SX_GLOO_MESH", "sparse", 1);
    if (apart) ::setenv("SX_HOST_ID", ("ctx-test-host-" + std::to_string(a.rank)).c_str(), 1);
    if (hosts == "pairs") ::setenv("SX_HOST_ID", ("ctx-test-host-" + std::to_string(a.rank / 2)).c_str(), 1);
    sx_status_t st;
    sx_context_t *ctx = make_context(a.rendezvous, a.rank, a.world, 0, &st, false, mode == "notice" ? 60000 : 20000);
    if (!ctx) return std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("context", st).c_str()), 3;
    const int sockets_before = sockets_open();
    Tenant t[2];
    for (int k = 0; k < 2; ++k) {
        t[k].id = k;
        t[k].rank = a.rank;
        t[k].memory_copies = mode == "regroup" ? 1 : 0;
        std::string e = (st = t[k].create(ctx, "", "p" + std::to_string(k))) == SX_OK ? t[k].train(2) : failed("create", st);
        if (!e.empty()) return std::fprintf(stderr, "rank %d tenant %d: %s\n", a.rank, k, e.c_str()), 3;
    }
    if (mode == "regroup") {
        // The last rank dies; the survivors' tenants fail, then each regroups on its own
        // from the memory copies, out of the context, and steps on.
        if (a.rank == a.world - 1) ::raise(SIGKILL);
        for (int k = 0; k < 2; ++k) {
            while ((st = t[k].step(2)) == SX_OK) ::usleep(10000);
            sx_regroup_options_t ro;
            sx_regroup_options_init(&ro, sizeof ro);
            ro.expected_world_size = a.world - 1;
            sx_regroup_result_t rr;
            sx_regroup_result_init(&rr, sizeof rr);
            if ((st = sx_regroup(t[k].g, &ro, &rr)) != SX_OK || rr.world_size != a.world - 1 || !rr.from_memory)
                return std::fprintf(stderr, "tenant %d: %s (world %d)\n", k, failed("regroup", st).c_str(), rr.world_size), 3;
            t[k].rank = rr.rank;
            if ((st = t[k].step(3)) != SX_OK)
                return std::fprintf(stderr, "tenant %d: %s\n", k, failed("step after the regroup", st).c_str()), 3;
        }
        // The broken context goes too: its threads (the failure notices' ended with its
        // transport) are joined, not left to the process's exit.
        sx_destroy_context(ctx);
        return 0;
    }
    if (mode == "notice") {
        // Tenant a fails on rank 0 (sx_abort); tenant b steps on to the bits of the same
        // tenant trained alone (by threads of this process).
        std::vector<float> got;
        // Two hosts of two: ranks 1 and 3 come late, and rank 2 (the other host's) must fail
        // when rank 0 does, not when its own host peer comes.
        std::string e = peers_fail_at_once(ctx, a.rank, false, &got, nullptr, hosts == "pairs" ? 7000 : 2000);
        if (e.empty() && hosts == "pairs") {
            // Alone in these processes: a hierarchy of the same hosts, as threads have none.
            std::vector<float> want;
            e = alone_in_processes(a, a.get("--ref", ""), 1, 3, &want);
            if (e.empty() && a.rank == 0 && got != want) e = "tenant b's params differ from the same tenant trained alone";
        } else if (e.empty() && a.rank == 0) {
            const std::vector<std::vector<float>> want = reference(a.world, 2, 3, "notice-child", apart);
            if (got != want[1]) e = "tenant b's params differ from the same tenant trained alone";
        }
        if (!e.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str()), 3;
        sx_destroy_context(ctx);
        return 0;
    }
    if (mode == "die") {
        if (a.rank == 1) ::raise(SIGKILL);
        ::sleep(1);
        // Both tenants fail, naming the lost peer, at their next step.
        for (int k = 0; k < 2; ++k) {
            st = t[k].step(2);
            if (st != SX_ERR_COMM && st != SX_ERR_TIMEOUT)
                return std::fprintf(stderr, "tenant %d after the peer's death: %s\n", k, failed("step", st).c_str()), 3;
        }
        sx_destroy_context(ctx);
        return 0;
    }
    sx_context_stats_t s;
    sx_context_stats_init(&s, sizeof s);
    sx_get_context_stats(ctx, &s);
    int rc = 0;
    if (apart) {
        rc = many_groups_no_socket(ctx, a.rank, s, sockets_before);
    } else if (hosts == "pairs") {
        rc = hosts_of_two(a, s, sockets_before, &t[1]);
    } else if (s.shared_memory != 1) {
        rc = (std::fprintf(stderr, "processes of one host: no shared memory\n"), 3);
    } else if (sockets_open() != sockets_before || s.channels < 2) {
        // Two live groups, trained: they opened channels, and no connection.
        rc = (std::fprintf(stderr, "rank %d: %d sockets before the groups, %d with them; %lld channels\n", a.rank,
                           sockets_before, sockets_open(), static_cast<long long>(s.channels)), 3);
    }
    sx_destroy_context(ctx);
    return rc;
}

void test_processes(void **) {
    const std::string err = sxtest::run_process_ranks(2, {"--mode", "train"}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_processes_on_hosts_apart(void **) {
    const std::string err = sxtest::run_process_ranks(3, {"--mode", "train", "--hosts", "apart"}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// 6 hosts of one rank on a sparse mesh: rank 3 has no pair with rank 0 (its peers are the
// ranks 1 and 2 away).
void test_processes_on_a_sparse_mesh(void **) {
    const std::string err = sxtest::run_process_ranks(6, {"--mode", "train", "--hosts", "sparse"}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Two hosts of two ranks each, with a rendezvous for the tenant made without a context.
void test_processes_on_hosts_of_two(void **) {
    const std::string ref = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
    const std::string err = sxtest::run_process_ranks(4, {"--mode", "train", "--hosts", "pairs", "--ref", ref}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A process that is not one of a context's ranks joins one of its groups by name.
void test_a_process_joins_a_tenant(void **) {
    const std::string err = sxtest::run_process_ranks(3, {"--mode", "join"}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void every_tenant_regroups(const char *hosts, int world = 3) {
    std::vector<sxtest::ProcessResult> results;
    sxtest::run_process_ranks(world, {"--mode", "regroup", "--hosts", hosts}, 120, &results);
    assert_int_equal(results.size(), world);
    for (int r = 0; r + 1 < world; ++r) assert_int_equal(results[static_cast<size_t>(r)].exit_code, 0);
    assert_int_equal(results[static_cast<size_t>(world - 1)].signal, SIGKILL);
}

// 3 processes: shared memory on one host, Gloo channels on hosts apart; 4 on two hosts of
// two (rank 3 calls when rank 1 does).
void peers_fail_at_once_processes(const char *hosts, int world = 3) {
    const std::string ref = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
    const std::string err =
        sxtest::run_process_ranks(world, {"--mode", "notice", "--hosts", hosts, "--ref", ref}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
}
void test_peers_fail_at_once_processes_on_hosts_of_two(void **) { peers_fail_at_once_processes("pairs", 4); }
void test_every_tenant_regroups_on_hosts_of_two(void **) { every_tenant_regroups("pairs", 4); }

void test_peers_fail_at_once_processes(void **) { peers_fail_at_once_processes("one"); }
void test_peers_fail_at_once_processes_on_hosts_apart(void **) { peers_fail_at_once_processes("apart"); }
// Rank 3 learns of rank 0's failure from the peers it relays through, and fails at once.
void test_peers_fail_at_once_processes_on_a_sparse_mesh(void **) { peers_fail_at_once_processes("sparse", 6); }

void test_every_tenant_regroups(void **) { every_tenant_regroups("one"); }
void test_every_tenant_regroups_on_hosts_apart(void **) { every_tenant_regroups("apart"); }

void a_peers_death_fails_every_tenant(const char *hosts, int world = 2) {
    std::vector<sxtest::ProcessResult> results;
    sxtest::run_process_ranks(world, {"--mode", "die", "--hosts", hosts}, 120, &results);
    assert_int_equal(results.size(), world);
    for (int r = 0; r < world; ++r)
        if (r != 1) assert_int_equal(results[static_cast<size_t>(r)].exit_code, 0);
    assert_int_equal(results[1].signal, SIGKILL);
}
void test_a_peers_death_fails_every_tenant_on_hosts_of_two(void **) { a_peers_death_fails_every_tenant("pairs", 4); }

void test_a_peers_death_fails_every_tenant(void **) { a_peers_death_fails_every_tenant("one"); }
void test_a_peers_death_fails_every_tenant_on_hosts_apart(void **) { a_peers_death_fails_every_tenant("apart"); }
void test_a_peers_death_fails_every_tenant_on_a_sparse_mesh(void **) { a_peers_death_fails_every_tenant("sparse", 6); }

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_rank_off_shared_memory),
        cmocka_unit_test(test_tenants_at_once_2),
        cmocka_unit_test(test_tenants_at_once_3),
        cmocka_unit_test(test_tenants_at_once_on_gloo_channels_2),
        cmocka_unit_test(test_tenants_at_once_on_gloo_channels_3),
        cmocka_unit_test(test_mesh_tenants_on_gloo_channels),
        cmocka_unit_test_teardown(test_mesh_tenants_on_a_sparse_mesh, unset_gloo_mesh),
        cmocka_unit_test(test_a_tenants_failure_stays_in_it),
        cmocka_unit_test(test_a_tenants_failure_stays_in_it_on_gloo_channels),
        cmocka_unit_test(test_peers_fail_at_once_abort),
        cmocka_unit_test(test_peers_fail_at_once_timeout),
        cmocka_unit_test(test_peers_fail_at_once_abort_on_gloo_channels),
        cmocka_unit_test(test_peers_fail_at_once_timeout_on_gloo_channels),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_names_and_lifetime),
        cmocka_unit_test(test_gone_groups_keys_are_erased),
        cmocka_unit_test(test_processes),
        cmocka_unit_test(test_a_peers_death_fails_every_tenant),
        cmocka_unit_test(test_every_tenant_regroups),
        cmocka_unit_test(test_processes_on_hosts_apart),
        cmocka_unit_test(test_a_peers_death_fails_every_tenant_on_hosts_apart),
        cmocka_unit_test(test_every_tenant_regroups_on_hosts_apart),
        cmocka_unit_test(test_peers_fail_at_once_processes),
        cmocka_unit_test(test_peers_fail_at_once_processes_on_hosts_apart),
        cmocka_unit_test(test_processes_on_hosts_of_two),
        cmocka_unit_test(test_a_process_joins_a_tenant),
        cmocka_unit_test(test_a_peers_death_fails_every_tenant_on_hosts_of_two),
        cmocka_unit_test(test_processes_on_a_sparse_mesh),
        cmocka_unit_test(test_peers_fail_at_once_processes_on_a_sparse_mesh),
        cmocka_unit_test(test_a_peers_death_fails_every_tenant_on_a_sparse_mesh),
        cmocka_unit_test(test_every_tenant_regroups_on_hosts_of_two),
        cmocka_unit_test(test_peers_fail_at_once_processes_on_hosts_of_two),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
