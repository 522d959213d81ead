// bench_sx section param_sums: the step of the optimizers that look at whole params
// against AdamW's on the same model, at 2 and 4 ranks (threads of this process over
// local://, one pool thread each): the slower rank's step time, the two groups stepped
// alternately. LAMB (per-param sums over the ranks: its trust ratio's norms) with the
// bytes a rank exchanges per step for the sums (one all-reduce of 16 bytes per param);
// Muon (each matrix orthogonalised whole on one rank) with the bytes of the pieces
// its ranks send to the owners and get back, from the layout; both against the gradients'
// reduce-scatter; Adafactor (each matrix's row and column sums over the ranks, then its
// update's RMS: two all-reduces) with the bytes of both, measured from a step's trace over
// shared memory and over TCP (which gathers), and its state per element. Then
// Newton-Schulz itself with each of sx's product flavours (optim/gemm.h: OpenBLAS's
// where built with it, and sx's ordered one) and the default flavour's product against
// torch's (torch.optim.Muon's bf16 iterations, torch.matmul in fp32) in the same run,
// where --torch-python names a Python with torch.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "core/layout.h"
#include "fixtures.h"
#include "optim/muon.h"
#include "optim/thread_pool.h"
#include "sx/sx.h"

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

// The bytes of the spans named `name` in a rank's trace file (their "bytes" args).
double span_bytes(const std::string &path, const char *name) {
    FILE *f = std::fopen(path.c_str(), "r");
    if (!f) return -1.0;
    std::string text;
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
    const std::string key = std::string("\"name\":\"") + name + "\"";
    double bytes = 0.0;
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
        const size_t b = text.find("\"bytes\":", at), end = text.find('}', at);
        if (b != std::string::npos && b < end) bytes += std::atof(text.c_str() + b + 8);
    }
    return bytes;
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
        const double b = span_bytes(path, "param_sums_exchange") + span_bytes(path, "update_sums_exchange");
        most = std::max(most, b / steps);
        std::remove(path.c_str());
    }
    ::rmdir(dir.c_str());
    return most;
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
    // The exchanges' bytes per rank, measured from the step's trace: shared memory sums
    // with its all-reduce (which adds in rank order: width doubles per rank); TCP (Gloo,
    // whose all-reduce adds in an order of its own) gathers every rank's block.
    std::printf("\nAdafactor's per-param sums per rank and step (the two exchanges' collective buffers, from the "
                "trace of 3 steps): shared memory (all-reduce) vs TCP (all-gather), ranks as threads\n");
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
