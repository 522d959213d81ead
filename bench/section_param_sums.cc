// bench_sx section param_sums: the step of the optimizers that look at whole params
// against AdamW's on the same model, at 2 and 4 ranks (threads of this process over
// local://, one pool thread each): the slower rank's step time, the two groups stepped
// alternately. LAMB (per-param sums over the ranks: its trust ratio's norms) with the
// bytes a rank exchanges per step for the sums (one all-reduce of 16 bytes per param);
// Muon (each matrix orthogonalised whole on one rank) with the bytes of the pieces
// its ranks send to the owners and get back, from the layout; both against the gradients'
// reduce-scatter; Adafactor (each matrix's row and column sums over the ranks, then its
// update's RMS: two all-reduces) with the bytes of both, measured from a step's trace over
// shared memory and over TCP, and its state per element; the TCP mesh's rank-ordered sum
// through rank 0, in parts, and as the all-gather it replaced, timed at 4 ranks. Then
// Newton-Schulz itself with each of sx's product flavours (optim/gemm.h: OpenBLAS's
// where built with it, and sx's ordered one) and the default flavour's product against
// torch's (torch.optim.Muon's bf16 iterations, torch.matmul in fp32) in the same run,
// where --torch-python names a Python with torch.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "comm/communicator.h"
#include "core/layout.h"
#include "fixtures.h"
#include "optim/muon.h"
#include "optim/thread_pool.h"
#include "rdzv/rendezvous.h"
#include "sx/sx.h"
#include "trace_spans.h"

namespace sxbench {
namespace {

// `count` square params of rows x rows elements, one unit, one param group of `optimizer`.
// transport and trace: sx_group_config_t's (0 and null: the defaults).
sx_shard_group_t *model(const std::string &url, int rank, int world, int32_t optimizer, int count, int64_t rows,
                        int32_t transport = 0, const char *trace = nullptr) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.transport = transport;
    cfg.trace_path = trace;
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.backend = SX_BACKEND_CPU;
    cfg.timeout_ms = 600000;
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pd;
    sx_param_group_desc_init(&pd, sizeof pd, optimizer);
    pd.weight_decay = 0.01;
    check(sx_add_param_group(g, &pd, nullptr), "sx_add_param_group");
    const int64_t shape[2] = {rows, rows};
    for (int k = 0; k < count; ++k) {
        const std::string name = "w" + std::to_string(k);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 2;
        d.shape = shape;
        check(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    check(sx_finalize(g), "sx_finalize");
    for (int k = 0; k < count; ++k) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        check(sx_param_view(g, k, &v), "sx_param_view");
        fill(v, 1.0f);
        check(sx_grad_view(g, k, &v), "sx_grad_view");
        fill(v, 0.1f);
    }
    return g;
}

// The slower rank's step times of an AdamW group (a) and a group of `other` (b) over the
// same model, alternating which goes first.
PairTimes steps(int world, int count, int64_t rows, int reps, int32_t other) {
    PairTimes t;
    Barrier barrier(world);
    std::vector<double> rank_s(static_cast<size_t>(world), 0.0);
    const std::string base = "local://bench-param-sums-" + std::to_string(::getpid()) + "-" + std::to_string(world);
    auto rank_main = [&](int r) {
        sx_shard_group_t *adamw = model(base + "-adamw", r, world, SX_OPTIM_ADAMW, count, rows);
        sx_shard_group_t *lamb = model(base + "-other", r, world, other, count, rows);
        sx_step_options_t keep;
        sx_step_options_init(&keep, sizeof keep);
        keep.keep_grads = 1;
        for (int it = 0; it <= reps; ++it)
            for (int k = 0; k < 2; ++k) {
                const bool lamb_side = (k == 0) == (it % 2 == 0);
                barrier.wait();
                const double t0 = now_seconds();
                check(sx_step(lamb_side ? lamb : adamw, &keep, nullptr), "sx_step");
                rank_s[static_cast<size_t>(r)] = now_seconds() - t0;
                barrier.wait();
                if (r == 0 && it > 0) (lamb_side ? t.b : t.a).push_back(max_of(rank_s.data(), world));
            }
        sx_destroy_shard_group(lamb);
        sx_destroy_shard_group(adamw);
    };
    std::vector<std::thread> others;
    for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
    rank_main(0);
    for (std::thread &th : others) th.join();
    return t;
}

// Per rank and step, the bytes of Adafactor's two exchanges (the per-param sums: the spans
// param_sums_exchange and update_sums_exchange, each the bytes of its collective's buffer
// on the rank), measured from the traces of `steps` steps of `world` ranks (threads over
// local://) over `transport`: the largest over the ranks.
double adafactor_exchange_bytes(int world, int count, int64_t rows, int32_t transport, int steps) {
    char tmpl[] = "/tmp/sx-bench-param-sums-XXXXXX";
    if (!mkdtemp(tmpl)) return -1.0;
    const std::string dir = tmpl, trace = dir + "/trace.json";
    const std::string url = "local://bench-adafactor-bytes-" + std::to_string(::getpid()) + "-" +
                            std::to_string(world) + "-" + std::to_string(transport);
    auto rank_main = [&](int r) {
        sx_shard_group_t *g = model(url, r, world, SX_OPTIM_ADAFACTOR, count, rows, transport, trace.c_str());
        sx_step_options_t keep;
        sx_step_options_init(&keep, sizeof keep);
        keep.keep_grads = 1;
        for (int i = 0; i < steps; ++i) check(sx_step(g, &keep, nullptr), "sx_step");
        sx_destroy_shard_group(g);
    };
    std::vector<std::thread> others;
    for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
    rank_main(0);
    for (std::thread &th : others) th.join();
    double most = 0.0;
    for (int r = 0; r < world; ++r) {
        const std::string path = dir + "/trace.rank" + std::to_string(r) + ".json";
        const double b =
            sxtest::span_bytes(path, "param_sums_exchange") + sxtest::span_bytes(path, "update_sums_exchange");
        most = std::max(most, b / steps);
        std::remove(path.c_str());
    }
    ::rmdir(dir.c_str());
    return most;
}

// The ways a group's own Gloo mesh can add `n` doubles per rank in rank order, timed at
// `world` ranks (threads over local://, every byte through TCP): its all_reduce_sum through
// rank 0 and in parts (GlooOptions::rooted_sum_bytes), and what RankOrderedSum did before
// it (a ring all-gather of every rank's block, added on each). Medians over `reps` of the
// slower rank's milliseconds; each call's result checked against the first way's.
struct SumTimes {
    double rooted_ms, parts_ms, gather_ms;
};

SumTimes ordered_sum_times(int world, size_t n, int reps) {
    enum { kRooted, kParts, kGather, kWays };
    std::vector<double> ms[kWays];
    std::vector<double> rank_ms(static_cast<size_t>(world));
    Barrier barrier(world);
    const std::string url = "local://bench-ordered-sum-" + std::to_string(::getpid()) + "-" + std::to_string(world) +
                            "-" + std::to_string(n);
    auto ok = [](const sx::Status &s, const char *what) {
        if (!s.ok()) die(std::string("ordered sums: ") + what + ": " + s.message());
    };
    auto rank_main = [&](int r) {
        std::unique_ptr<sx::comm::Communicator> c[2];
        for (int k = 0; k < 2; ++k) {
            sx::comm::GlooOptions o;
            o.bind_address = "127.0.0.1";
            o.timeout = std::chrono::milliseconds(120000);
            o.in_process = false;
            o.rooted_sum_bytes = k == 0 ? SIZE_MAX : 1;
            sx::rdzv::Rendezvous rv;
            std::shared_ptr<sx::rdzv::Store> store;
            const std::string where = url + "-" + std::to_string(k);
            sx::Status s = sx::rdzv::parse_rendezvous(where.c_str(), r, world, &rv);
            if (s.ok()) s = sx::rdzv::open_store(rv, o.timeout, &store);
            if (s.ok()) s = sx::comm::create_gloo_communicator(store, r, world, o, &c[k]);
            if (!s.ok()) die("ordered sums: " + s.message());
        }
        std::vector<double> data(n), all(n * static_cast<size_t>(world)), want;
        for (int it = 0; it <= reps; ++it)
            for (int way = 0; way < kWays; ++way) {
                for (size_t i = 0; i < n; ++i) data[i] = 1.0 / static_cast<double>(r + 1 + static_cast<int>(i % 7));
                barrier.wait();
                const double t0 = now_seconds();
                if (way == kGather) {
                    std::copy(data.begin(), data.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n));
                    ok(c[0]->all_gather(all.data(), n * sizeof(double)), "all_gather");
                    for (size_t i = 0; i < n; ++i) {
                        double sum = 0.0;
                        for (int q = 0; q < world; ++q) sum += all[static_cast<size_t>(q) * n + i];
                        data[i] = sum;
                    }
                } else {
                    ok(c[way]->all_reduce_sum(data.data(), n), "all_reduce_sum");
                }
                rank_ms[static_cast<size_t>(r)] = (now_seconds() - t0) * 1e3;
                if (way == kRooted) want = data;
                for (size_t i = 0; i < n; ++i)
                    if (data[i] != want[i]) die("ordered sums: the ways disagree");
                barrier.wait();
                if (r == 0 && it > 0) ms[way].push_back(max_of(rank_ms.data(), world));
            }
    };
    std::vector<std::thread> others;
    for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
    rank_main(0);
    for (std::thread &th : others) th.join();
    return {median(ms[kRooted]), median(ms[kParts]), median(ms[kGather])};
}

}  // namespace

// Per rank and step, the bytes Muon's pieces travel: each param's pieces held by a rank
// other than its owner go to the owner and come back (as muon's step assigns owners: a
// param on one rank stays there, the rest largest first to the least-loaded rank).
double muon_bytes_per_rank(int world, int count, int64_t rows) {
    std::vector<sx::core::ParamShape> shapes(static_cast<size_t>(count));
    for (auto &s : shapes) s.numel = static_cast<uint64_t>(rows * rows);
    sx::core::Layout layout;
    if (!sx::core::Layout::build(shapes, world, 256, &layout).ok()) return -1.0;
    std::vector<double> load(static_cast<size_t>(world), 0.0);
    double moved = 0.0;
    std::vector<int> spread;
    for (int p = 0; p < count; ++p) {
        int holders = 0, holder = 0;
        for (int q = 0; q < world; ++q) {
            const sx::core::ShardPiece piece = layout.piece(p, q);
            if (piece.begin != piece.end) ++holders, holder = q;
        }
        if (holders == 1)
            load[static_cast<size_t>(holder)] += 1.0;
        else
            spread.push_back(p);
    }
    for (int p : spread) {  // equal sizes: the least-loaded rank, lowest first
        const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        load[static_cast<size_t>(owner)] += 1.0;
        for (int q = 0; q < world; ++q) {
            const sx::core::ShardPiece piece = layout.piece(p, q);
            if (q != owner) moved += 2.0 * 4.0 * static_cast<double>(piece.end - piece.begin);
        }
    }
    return moved / world;
}

// Milliseconds (fastest of reps) of f.
template <typename F>
double fastest_ms(int reps, F f) {
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
        const double t0 = now_seconds();
        f();
        if (r > 0) best = std::min(best, (now_seconds() - t0) * 1e3);
    }
    return best;
}

// torch's times for n x n: "ns_ms" (torch.optim.Muon's Newton-Schulz, bf16) and
// "matmul_ms" (fp32), from bench/torch_muon.py; empty where it cannot run.
std::vector<double> torch_times(const std::string &python, int64_t n, int reps, int threads) {
    if (python.empty()) return {};
    const std::string cmd = torch_command(python, SX_BENCH_SOURCE_DIR "/torch_muon.py --n " + std::to_string(n) +
                                                      " --reps " + std::to_string(reps) + " --threads " +
                                                      std::to_string(threads));
    FILE *f = popen(cmd.c_str(), "r");
    if (!f) return {};
    double ns = -1, mm = -1;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
        if (std::sscanf(line, "{\"ns_ms\": %lf, \"matmul_ms\": %lf}", &ns, &mm) == 2) continue;
        std::printf("  (torch) %s", line);
    }
    pclose(f);
    if (ns < 0) return {};
    return {ns, mm};
}

int section_param_sums(const Options &opt) {
    // 16 params of 512 x 512: 4 Mi elements, 16 MiB of fp32 gradients.
    const int count = 16;
    const int64_t rows = 512;
    const double elements = static_cast<double>(count) * static_cast<double>(rows * rows);
    std::printf("param_sums: sx_step with LAMB (per-param norms summed over the ranks) vs AdamW on the same model "
                "(%d params of %lld x %lld, one unit, fp32, keep_grads), ranks as threads over local://, one pool "
                "thread each; ratio = median over reps of LAMB's step time / AdamW's (the slower rank's)\n",
                count, static_cast<long long>(rows), static_cast<long long>(rows));
    std::printf("%6s %11s %10s %8s %16s %18s %12s\n", "ranks", "adamw_ms", "lamb_ms", "ratio", "sums_bytes/rank",
                "reduce_scatter_b/r", "bytes_ratio");
    std::vector<std::string> json;
    for (int world : {2, 4}) {
        const PairTimes t = steps(world, count, rows, opt.reps, SX_OPTIM_LAMB);
        // Per rank and step: the all-reduce of 2 doubles per LAMB param (shared memory adds
        // in rank order: one block per rank; a TCP group gathers world_size of them),
        // against the reduce-scatter of the fp32 gradients (the world - 1 shards it sends).
        const double sums = 16.0 * count;
        const double scatter = 4.0 * elements * (world - 1) / world;
        std::printf("%6d %11.3f %10.3f %8.3f %16.0f %18.0f %12.2e\n", world, t.min_a() * 1e3, t.min_b() * 1e3,
                    t.paired_ratio(), sums, scatter, sums / scatter);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"optimizer\":\"Lamb\",\"ranks\":%d,\"elements\":%.0f,\"params\":%d,"
                      "\"reps\":%d,\"adamw_ms\":%.4f,\"lamb_ms\":%.4f,\"ratio_lamb_vs_adamw\":%.4f,"
                      "\"sums_bytes_per_rank\":%.0f,\"reduce_scatter_bytes_per_rank\":%.0f}",
                      world, elements, count, opt.reps, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(), sums,
                      scatter);
        json.push_back(line);
    }
    std::printf("state per element per rank: LAMB 8 bytes / world (exp_avg, exp_avg_sq: Adam's), AdamW the same\n");

    // Adafactor on the same model: two exchanges (the sums of each param's squares and of
    // each row's and column's squared gradients; then the updates' sums of squares).
    std::printf("\nparam_sums: sx_step with Adafactor (factored moments: row and column sums over the ranks) vs AdamW, "
                "the same model and ranks\n");
    std::printf("%6s %11s %13s %8s %16s %18s %12s\n", "ranks", "adamw_ms", "adafactor_ms", "ratio", "sums_bytes/rank",
                "reduce_scatter_b/r", "bytes_ratio");
    for (int world : {2, 4}) {
        const PairTimes t = steps(world, count, rows, opt.reps, SX_OPTIM_ADAFACTOR);
        // Per rank and step, the all-reduces' blocks (as LAMB's): the first's 1 + rows +
        // cols doubles per param, the second's 1 (measured below).
        const double sums = 8.0 * count * (1.0 + 2.0 * static_cast<double>(rows) + 1.0);
        const double scatter = 4.0 * elements * (world - 1) / world;
        std::printf("%6d %11.3f %13.3f %8.3f %16.0f %18.0f %12.2e\n", world, t.min_a() * 1e3, t.min_b() * 1e3,
                    t.paired_ratio(), sums, scatter, sums / scatter);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"optimizer\":\"Adafactor\",\"ranks\":%d,\"elements\":%.0f,"
                      "\"params\":%d,\"reps\":%d,\"adamw_ms\":%.4f,\"adafactor_ms\":%.4f,"
                      "\"ratio_adafactor_vs_adamw\":%.4f,\"sums_bytes_per_rank\":%.0f,"
                      "\"reduce_scatter_bytes_per_rank\":%.0f}",
                      world, elements, count, opt.reps, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(), sums,
                      scatter);
        json.push_back(line);
    }
    // The exchanges' bytes per rank, measured from the step's trace: both transports sum
    // with their all-reduce, which adds in rank order (width doubles per rank).
    std::printf("\nAdafactor's per-param sums per rank and step (the two exchanges' collective buffers, from the "
                "trace of 3 steps): shared memory vs TCP (Gloo), each its all-reduce in rank order, ranks as threads\n");
    std::printf("%6s %16s %16s %10s\n", "ranks", "shm_bytes/rank", "tcp_bytes/rank", "tcp / shm");
    for (int world : {2, 4}) {
        const double shm = adafactor_exchange_bytes(world, count, rows, SX_TRANSPORT_AUTO, 3);
        const double tcp = adafactor_exchange_bytes(world, count, rows, SX_TRANSPORT_TCP, 3);
        std::printf("%6d %16.0f %16.0f %10.2f\n", world, shm, tcp, shm > 0 ? tcp / shm : 0.0);
        char line[256];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"optimizer\":\"Adafactor\",\"figure\":\"exchange_bytes\","
                      "\"ranks\":%d,\"shm_bytes_per_rank\":%.0f,\"tcp_bytes_per_rank\":%.0f,"
                      "\"ratio_tcp_vs_shm\":%.4f}",
                      world, shm, tcp, shm > 0 ? tcp / shm : 0.0);
        json.push_back(line);
    }
    // The group's own Gloo mesh's rank-ordered sum: through rank 0 against in parts, and
    // against the all-gather it replaced, at sizes from LAMB's few sums per param to past
    // the Adafactor model's 131,328 bytes (the default: rooted up to 16 KiB).
    std::printf("\nrank-ordered sums of n doubles over a group's own Gloo mesh (TCP, %d ranks as threads): through "
                "rank 0 vs in parts vs the ring all-gather of every rank's block (median of %d, slower rank)\n",
                4, opt.reps * 10);
    std::printf("%9s %10s %10s %10s %12s %14s\n", "bytes", "rooted_ms", "parts_ms", "gather_ms", "parts/rooted",
                "parts/gather");
    for (size_t n : {size_t(16), size_t(256), size_t(1024), size_t(2048), size_t(4096), size_t(16416),
                     size_t(131072)}) {
        const SumTimes t = ordered_sum_times(4, n, opt.reps * 10);
        std::printf("%9zu %10.3f %10.3f %10.3f %12.2f %14.2f\n", n * 8, t.rooted_ms, t.parts_ms, t.gather_ms,
                    t.parts_ms / t.rooted_ms, t.parts_ms / t.gather_ms);
        char line[320];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"figure\":\"gloo_ordered_sum\",\"ranks\":4,\"bytes\":%zu,"
                      "\"rooted_ms\":%.4f,\"parts_ms\":%.4f,\"gather_ms\":%.4f,\"ratio_parts_vs_rooted\":%.4f,"
                      "\"ratio_parts_vs_gather\":%.4f}",
                      n * 8, t.rooted_ms, t.parts_ms, t.gather_ms, t.parts_ms / t.rooted_ms, t.parts_ms / t.gather_ms);
        json.push_back(line);
    }
    // Every rank keeps each matrix's row and column means whole: (rows + cols) x 4 bytes.
    const double factored = 4.0 * 2.0 * static_cast<double>(rows) / static_cast<double>(rows * rows);
    std::printf("state per element per rank: Adafactor %.4f bytes (row_var and col_var, (%lld + %lld) x 4 bytes per "
                "%lld x %lld matrix, on every rank), AdamW 8 / world (4 at 2 ranks, 2 at 4)\n",
                factored, static_cast<long long>(rows), static_cast<long long>(rows), static_cast<long long>(rows),
                static_cast<long long>(rows));

    // Muon: 6 params of 384 x 384 (0.84 Mi elements), so that some straddle the shards.
    const int mcount = 6;
    const int64_t mrows = 384;
    const double melements = static_cast<double>(mcount) * static_cast<double>(mrows * mrows);
    std::printf("\nMuon vs AdamW on %d params of %lld x %lld (one unit, fp32, keep_grads), as above; matrix_bytes/rank: "
                "the pieces sent to owners and back\n",
                mcount, static_cast<long long>(mrows), static_cast<long long>(mrows));
    std::printf("%6s %11s %10s %8s %16s %18s\n", "ranks", "adamw_ms", "muon_ms", "ratio", "matrix_bytes/rank",
                "reduce_scatter_b/r");
    for (int world : {2, 4}) {
        const PairTimes t = steps(world, mcount, mrows, opt.reps, SX_OPTIM_MUON);
        const double moved = muon_bytes_per_rank(world, mcount, mrows);
        const double scatter = 4.0 * melements * (world - 1) / world;
        std::printf("%6d %11.3f %10.3f %8.3f %16.0f %18.0f\n", world, t.min_a() * 1e3, t.min_b() * 1e3,
                    t.paired_ratio(), moved, scatter);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"optimizer\":\"Muon\",\"ranks\":%d,\"elements\":%.0f,"
                      "\"params\":%d,\"reps\":%d,\"adamw_ms\":%.4f,\"muon_ms\":%.4f,\"ratio_muon_vs_adamw\":%.4f,"
                      "\"matrix_bytes_per_rank\":%.0f,\"reduce_scatter_bytes_per_rank\":%.0f}",
                      world, melements, mcount, opt.reps, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(), moved,
                      scatter);
        json.push_back(line);
    }

    // Newton-Schulz and the product, 2 threads, against torch's in the same run.
    std::string python = opt.torch_python;
    if (python.empty() && std::getenv("SX_BENCH_TORCH_PYTHON")) python = std::getenv("SX_BENCH_TORCH_PYTHON");
    const int threads = 2;
    sx::optim::ThreadPool pool(threads);
    const sx::optim::Hyper h = sx::optim::default_hyper(sx::optim::Kind::kMuon);
    // sx's products: gemm.h's default flavour (OpenBLAS's where built with it) and sx's own
    // ordered one, side by side.
    const sx::optim::Gemm fast = sx::optim::default_gemm(), own = sx::optim::Gemm::kOrdered;
    std::printf("\nNewton-Schulz (5 iterations, bf16 arithmetic) and an n x n x n fp32 product, %d threads, fastest of "
                "%d; sx's products: %s (and %s); torch: %s\n",
                threads, opt.reps, sx::optim::gemm_name(fast), sx::optim::gemm_name(own),
                python.empty() ? "not run (no --torch-python or SX_BENCH_TORCH_PYTHON)" : python.c_str());
    std::printf("%6s %9s %11s %9s %9s %11s %11s %11s %9s\n", "n", "ns_ms", "ordered_ms", "torch_ns", "vs_torch",
                "matmul_ms", "matmul_GF/s", "torch_mm_ms", "vs_torch");
    for (int64_t n : {256, 384, 512, 1024}) {
        std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
        for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f, b[i] = a[i] * 0.5f;
        const double ns = fastest_ms(opt.reps, [&] { sx::optim::newton_schulz(a.data(), n, n, h, &pool, c.data(), fast); });
        const double ordered = fast == own ? ns : fastest_ms(opt.reps, [&] {
            sx::optim::newton_schulz(a.data(), n, n, h, &pool, c.data(), own);
        });
        const double mm = fastest_ms(opt.reps, [&] { sx::optim::gemm_ab(fast, a.data(), b.data(), c.data(), n, n, n, &pool); });
        const std::vector<double> tt = torch_times(python, n, opt.reps, threads);
        const double gf = 2.0 * static_cast<double>(n) * n * n / (mm * 1e-3) / 1e9;
        std::printf("%6lld %9.3f %11.3f %9.3f %9.3f %11.3f %11.1f %11.3f %9.3f\n", static_cast<long long>(n), ns, ordered,
                    tt.empty() ? 0.0 : tt[0], tt.empty() ? 0.0 : tt[0] / ns, mm, gf, tt.empty() ? 0.0 : tt[1],
                    tt.empty() ? 0.0 : tt[1] / mm);
        char line[640];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"kernel\":\"newton_schulz\",\"n\":%lld,\"threads\":%d,"
                      "\"gemm\":\"%s\",\"ns_ms\":%.4f,\"ordered_ns_ms\":%.4f,\"torch_ns_ms\":%.4f,"
                      "\"ratio_torch_vs_sx\":%.4f,\"matmul_ms\":%.4f,\"matmul_gflops\":%.2f,\"torch_matmul_ms\":%.4f}",
                      static_cast<long long>(n), threads, sx::optim::gemm_name(fast), ns, ordered,
                      tt.empty() ? -1.0 : tt[0], tt.empty() ? -1.0 : tt[0] / ns, mm, gf, tt.empty() ? -1.0 : tt[1]);
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
