// bench_sx section scale: what one rank of a 1024-, 4096- or 16384-rank job does to lay
// out, save and load a 70-billion-param model, simulated here with the library's own
// code (docs/scale.md). Nothing of the model is allocated and no file is written: the
// layout, the plans and the MANIFEST are built from the params' shapes alone.
//
// The model: Llama 3 70B's shapes (vocabulary 128256, hidden 8192, MLP 28672, 80
// layers, 8 key-value heads) with biases on q, k and v (as Qwen2 has them): 963 params,
// 70.55 billion elements, bf16, AdamW (values and two states in fp32 in a checkpoint).
// Units: one per layer (its 12 params), one for the embedding, one for the final norm
// and the output head: 82 units, the grain FSDP wraps a transformer at. With
// --scale-unit-per-param, one unit per param instead.
//
// Per topology (flat: one shard group of W ranks; mesh SxR: shard groups of S ranks,
// R replicas, only replica 0 writing), for rank 0, which writes a shard file in every
// topology and commits:
//   layout      core::Layout::build with S shards
//   write plan  ckpt::plan_write for its shard index
//   commit      what rank 0 does at a commit: the manifest's skeleton, every writer's
//               report received (a string as long as the report, as from the store)
//               and its chunks filed under their tensors, each tensor's chunks sorted,
//               then ckpt::encode_manifest (validate() and the FlatBuffer). The writers'
//               plans are made by ckpt::plan_write, outside the time and the count.
//   load        a rank of the loading job reads the MANIFEST (a copy of the encoded
//               bytes, as read_manifest reads the file into a string), decodes it
//               (ckpt::decode_manifest: CRC, verifier, copy, validate()), matches params
//               by name and plans its reads (ckpt::plan_read), for a whole load (values
//               and both states). The rank shown is the one with the most reads among
//               up to 64 shard indices spread evenly.
// Unlike the other sections' figures, these are absolute, not ratios to a peer: the goal
// they are held to is absolute (under a second and a few MiB per rank), and what they
// show is how each grows from one world size to the next.
// Time: the median of --scale-reps runs. Memory: the most heap bytes live at once
// during a run beyond those live before it (a counting global operator new,
// bench/heap_counter.cc): what the rank holds for that step and nothing else.
//
// Then the store traffic of creating a Gloo communicator (the full mesh every group
// connects), measured at small world sizes through a counting store around the
// in-process one, the ranks as threads.
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <unordered_map>

#include "bench_util.h"
#include "ckpt/directory.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "comm/communicator.h"
#include "comm/stores.h"
#include "core/layout.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

namespace ckpt = sx::ckpt;
namespace comm = sx::comm;
namespace core = sx::core;
using sx::Status;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr uint64_t kAlignBytes = 64;  // the group's default alignment
constexpr int kNodeShards = 8;        // a mesh's shard group: the GPUs of a node

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "bench_sx scale: %s\n", what.c_str());
    std::exit(1);
}

void check(const Status &s, const char *what) {
    if (!s.ok()) die(std::string(what) + ": " + s.message());
}

// ---------------------------------------------------------------------- the model

struct Model {
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<core::ParamShape> layout_params;  // unit, numel, 2 bytes (bf16)
    std::vector<std::vector<ckpt::TensorKind>> kinds;
    sx::optim::Hyper adamw;
    uint64_t numel = 0;
    int units = 0;

    void add(const std::string &name, std::vector<int64_t> shape, int32_t unit) {
        core::ParamShape p;
        p.unit = unit;
        p.numel = 1;
        for (int64_t e : shape) p.numel *= static_cast<uint64_t>(e);
        p.elem_bytes = 2;
        numel += p.numel;
        names.push_back(name);
        shapes.push_back(std::move(shape));
        layout_params.push_back(p);
        kinds.push_back(ckpt::stored_kinds(adamw));
    }
};

Model llama_70b(bool unit_per_param) {
    const int64_t vocab = 128256, hidden = 8192, mlp = 28672, kv = 1024, layers = 80;
    Model m;
    m.adamw.weight_decay = 0.1;
    int32_t unit = 0;
    // One unit per layer: the layer's index + 1 (the embedding is unit 0).
    auto next = [&](int32_t layer_unit) { return unit_per_param ? unit++ : layer_unit; };
    m.add("model.embed_tokens.weight", {vocab, hidden}, next(0));
    for (int64_t l = 0; l < layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const int32_t u = static_cast<int32_t>(l + 1);
        for (const char *proj : {"q_proj", "k_proj", "v_proj"}) {
            const int64_t out = proj[0] == 'q' ? hidden : kv;
            m.add(p + "self_attn." + proj + ".weight", {out, hidden}, next(u));
            m.add(p + "self_attn." + proj + ".bias", {out}, next(u));
        }
        m.add(p + "self_attn.o_proj.weight", {hidden, hidden}, next(u));
        m.add(p + "mlp.gate_proj.weight", {mlp, hidden}, next(u));
        m.add(p + "mlp.up_proj.weight", {mlp, hidden}, next(u));
        m.add(p + "mlp.down_proj.weight", {hidden, mlp}, next(u));
        m.add(p + "input_layernorm.weight", {hidden}, next(u));
        m.add(p + "post_attention_layernorm.weight", {hidden}, next(u));
    }
    m.add("model.norm.weight", {hidden}, next(static_cast<int32_t>(layers + 1)));
    m.add("lm_head.weight", {vocab, hidden}, next(static_cast<int32_t>(layers + 1)));
    m.units = unit_per_param ? unit : static_cast<int>(layers + 2);
    return m;
}

// ---------------------------------------------------------------------- topologies

struct Topology {
    int world = 1;   // ranks
    int shards = 1;  // S: ranks of a shard group (world for a flat group), the files of a checkpoint
    bool flat() const { return shards == world; }
    std::string name() const {
        return flat() ? "flat " + std::to_string(world)
                      : std::to_string(shards) + "x" + std::to_string(world / shards);
    }
};

Topology flat(int world) { return {world, world}; }
Topology mesh(int world) { return {world, kNodeShards}; }

// ---------------------------------------------------------------------- measuring

struct Cost {
    double ms = 0;
    int64_t peak = 0;  // bytes: the most live at once beyond those live before
    int64_t kept = 0;  // bytes the first run left allocated (its result)
};

// Runs fn `reps` times: the median wall time, the largest peak, what the first run kept.
template <class F>
Cost measure(int reps, F &&fn) {
    std::vector<double> t;
    Cost c;
    for (int r = 0; r < reps; ++r) {
        const int64_t before = HeapCounter::live();
        HeapCounter::reset_peak();
        const double t0 = now_seconds();
        fn();
        t.push_back(now_seconds() - t0);
        c.peak = std::max(c.peak, HeapCounter::peak() - before);
        if (r == 0) c.kept = HeapCounter::live() - before;
    }
    c.ms = median(t) * 1e3;
    return c;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }
double kib(int64_t bytes) { return static_cast<double>(bytes) / 1024.0; }

core::Layout build_layout(const Model &model, Topology topo, Cost *cost, int reps) {
    core::Layout layout;
    *cost = measure(reps, [&] {
        core::Layout l;
        check(core::Layout::build(model.layout_params, topo.shards, kAlignBytes, &l), "Layout::build");
        layout = std::move(l);
    });
    return layout;
}

// ---------------------------------------------------------------------- saving

// What a writer tells rank 0 after its file is durable (save.cc's report): a status
// code, an empty message and its NUL, then per chunk: param, kind, begin, end, offset,
// length, CRC32C and 4 bytes of padding (48 bytes).
constexpr size_t kRecordBytes = 48;
constexpr size_t kReportHead = sizeof(int32_t) + 1;

// A stand-in for a chunk's CRC32C: any non-zero value (FlatBuffers leaves out a field
// equal to its default, so a zero would make the manifest smaller than a real one).
uint32_t fake_crc(int writer, uint64_t offset) {
    uint64_t x = (static_cast<uint64_t>(writer) << 40) ^ offset ^ 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return static_cast<uint32_t>(x >> 32) | 1u;
}

std::string report_of(const ckpt::WritePlan &plan, int writer) {
    std::string out(kReportHead + plan.chunks.size() * kRecordBytes, '\0');
    char *p = &out[kReportHead];
    for (const ckpt::WriteChunk &c : plan.chunks) {
        const int32_t head[2] = {c.param, static_cast<int32_t>(c.kind)};
        const uint64_t range[4] = {c.begin, c.end, c.file_offset, (c.end - c.begin) * sizeof(float)};
        const uint32_t crc = fake_crc(writer, c.file_offset);
        std::memcpy(p, head, sizeof head);
        std::memcpy(p + 8, range, sizeof range);
        std::memcpy(p + 40, &crc, sizeof crc);
        p += kRecordBytes;
    }
    return out;
}

// Files writer w's report into *m, as rank 0's commit does (save.cc, gather_chunks).
void file_report(const std::string &report, int writer, int files, ckpt::Manifest *m) {
    m->files.push_back(ckpt::shard_file_name(writer, files));
    const size_t n = (report.size() - kReportHead) / kRecordBytes;
    for (size_t i = 0; i < n; ++i) {
        const char *p = report.data() + kReportHead + i * kRecordBytes;
        int32_t head[2];
        uint64_t range[4];
        uint32_t crc;
        std::memcpy(head, p, sizeof head);
        std::memcpy(range, p + 8, sizeof range);
        std::memcpy(&crc, p + 40, sizeof crc);
        for (ckpt::Tensor &t : m->params[head[0]].tensors) {
            if (static_cast<int32_t>(t.kind) != head[1]) continue;
            ckpt::Chunk c;
            c.begin = range[0], c.end = range[1], c.file = static_cast<uint32_t>(writer);
            c.offset = range[2], c.length = range[3], c.crc32c = crc;
            t.chunks.push_back(c);
        }
    }
}

// The manifest of a save but for its files and chunks (save.cc, skeleton_of).
ckpt::Manifest skeleton_of(const Model &model, Topology topo) {
    ckpt::Manifest m;
    m.library_version = SX_VERSION_NUMBER;
    m.step = 100000;
    m.world_size = topo.world;
    m.shard_size = topo.shards;
    m.stage = 3;
    m.alignment = static_cast<int32_t>(kAlignBytes);
    m.created_unix_ms = 1790000000000ull;
    m.param_groups.push_back(ckpt::param_group_entry(model.adamw));
    for (size_t p = 0; p < model.names.size(); ++p) {
        ckpt::ParamEntry e;
        e.name = model.names[p];
        e.shape = model.shapes[p];
        e.dtype = SX_DTYPE_BF16;
        e.unit = model.layout_params[p].unit;
        e.step = 100000;
        for (ckpt::TensorKind k : model.kinds[p]) {
            ckpt::Tensor t;
            t.kind = k;
            e.tensors.push_back(t);
        }
        m.params.push_back(std::move(e));
    }
    return m;
}

struct SaveFigures {
    Topology topo;
    Cost layout, plan, gather, encode;
    size_t plan_chunks = 0;       // rank 0's
    uint64_t plan_file_bytes = 0;
    size_t manifest_chunks = 0;
    size_t manifest_bytes = 0;    // 0: encode_manifest refused it
    size_t max_writer_chunks = 0;
    uint64_t report_bytes_max = 0, report_bytes_total = 0;
    int64_t commit_peak = 0;      // rank 0: the manifest while gathering, then while encoding
    std::string encoded;          // the MANIFEST's bytes, for the loads
};

SaveFigures simulate_save(const Model &model, Topology topo, int reps) {
    SaveFigures s;
    s.topo = topo;
    const core::Layout layout = build_layout(model, topo, &s.layout, reps);
    ckpt::WritePlan plan;
    s.plan = measure(reps, [&] { plan = ckpt::plan_write(layout, 0, model.kinds); });
    s.plan_chunks = plan.chunks.size();
    s.plan_file_bytes = plan.file_bytes;

    // The commit on rank 0: from the skeleton, every writer's report in turn.
    const ckpt::Manifest skeleton = skeleton_of(model, topo);
    ckpt::Manifest m;
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
        const int64_t before = HeapCounter::live();
        HeapCounter::reset_peak();
        double t0 = now_seconds(), spent = 0;
        ckpt::Manifest got = skeleton;
        spent += now_seconds() - t0;
        for (int w = 0; w < topo.shards; ++w) {
            std::string sent;
            {
                HeapCounter::Uncounted writer_side;
                sent = report_of(ckpt::plan_write(layout, w, model.kinds), w);
            }
            if (r == 0) {
                const size_t n = (sent.size() - kReportHead) / kRecordBytes;
                s.max_writer_chunks = std::max(s.max_writer_chunks, n);
                s.report_bytes_max = std::max<uint64_t>(s.report_bytes_max, sent.size());
                s.report_bytes_total += sent.size();
            }
            t0 = now_seconds();
            const std::string received = sent;  // the store's answer to rank 0's get
            file_report(received, w, topo.shards, &got);
            spent += now_seconds() - t0;
        }
        t0 = now_seconds();
        for (ckpt::ParamEntry &p : got.params)
            for (ckpt::Tensor &t : p.tensors)
                std::sort(t.chunks.begin(), t.chunks.end(),
                          [](const ckpt::Chunk &a, const ckpt::Chunk &b) { return a.begin < b.begin; });
        m = std::move(got);
        spent += now_seconds() - t0;
        times.push_back(spent);
        s.gather.peak = std::max(s.gather.peak, HeapCounter::peak() - before);
        if (r == 0) s.gather.kept = HeapCounter::live() - before;
    }
    s.gather.ms = median(times) * 1e3;
    for (const ckpt::ParamEntry &p : m.params)
        for (const ckpt::Tensor &t : p.tensors) s.manifest_chunks += t.chunks.size();

    Status encoded;
    s.encode = measure(reps, [&] {
        std::string bytes;
        encoded = ckpt::encode_manifest(m, &bytes);
        s.encoded = std::move(bytes);
    });
    s.commit_peak = std::max(s.gather.peak, s.gather.kept + s.encode.peak);
    if (!encoded.ok()) {
        std::printf("  %s: encode_manifest refused the manifest: %s\n", topo.name().c_str(), encoded.message().c_str());
        s.encoded.clear();
    }
    s.manifest_bytes = s.encoded.size();
    return s;
}

// ---------------------------------------------------------------------- loading

struct LoadFigures {
    std::string from;
    Topology into;
    int rank = 0;             // the loading rank shown (its shard index)
    uint64_t manifest_bytes = 0;
    Cost decode, layout, plan;
    size_t reads = 0;
    size_t files = 0;          // files it reads from
    uint64_t bytes_read = 0;   // whole chunks
    uint64_t bytes_needed = 0; // the parts it keeps
};

void plan_for(const ckpt::Manifest &m, const core::Layout &layout, int shard, const Model &model,
              std::vector<ckpt::ReadOp> *ops) {
    // Params matched by name, as a load does (load.cc, match_params).
    std::unordered_map<std::string, int32_t> by_name;
    for (size_t i = 0; i < m.params.size(); ++i) by_name.emplace(m.params[i].name, static_cast<int32_t>(i));
    std::vector<int32_t> index(model.names.size(), -1);
    for (size_t p = 0; p < model.names.size(); ++p) index[p] = by_name.at(model.names[p]);
    check(ckpt::plan_read(m, layout, shard, index, model.kinds, ops), "plan_read");
}

LoadFigures simulate_load(const Model &model, const SaveFigures &save, Topology into, int reps) {
    LoadFigures f;
    f.from = save.topo.name();
    f.into = into;
    f.manifest_bytes = save.encoded.size();
    ckpt::Manifest m;
    f.decode = measure(reps, [&] {
        const std::string file = save.encoded;  // read_manifest reads the whole file into a string
        ckpt::Manifest decoded;
        check(ckpt::decode_manifest(file.data(), file.size(), &decoded), "decode_manifest");
        m = std::move(decoded);
    });
    const core::Layout layout = build_layout(model, into, &f.layout, reps);

    // The rank with the most reads among up to 64 shard indices spread evenly.
    {
        HeapCounter::Uncounted choosing;
        const int candidates = std::min(into.shards, 64);
        size_t most = 0;
        for (int i = 0; i < candidates; ++i) {
            const int64_t spread = static_cast<int64_t>(i) * (into.shards - 1) / std::max(candidates - 1, 1);
            const int shard = static_cast<int>(spread);
            std::vector<ckpt::ReadOp> ops;
            plan_for(m, layout, shard, model, &ops);
            if (ops.size() >= most) most = ops.size(), f.rank = shard;
        }
    }
    std::vector<ckpt::ReadOp> ops;
    f.plan = measure(reps, [&] {
        std::vector<ckpt::ReadOp> planned;
        plan_for(m, layout, f.rank, model, &planned);
        ops = std::move(planned);
    });
    std::set<uint32_t> files;
    for (const ckpt::ReadOp &op : ops) {
        files.insert(op.chunk->file);
        f.bytes_read += op.chunk->length;
        f.bytes_needed += (op.copy_end - op.copy_begin) * sizeof(float);
    }
    f.reads = ops.size();
    f.files = files.size();
    return f;
}

// ---------------------------------------------------------------------- rendezvous

// A rank's view of the store that counts its requests and bytes.
class CountingStore final : public comm::Store {
  public:
    explicit CountingStore(std::shared_ptr<comm::Store> inner) : inner_(std::move(inner)) {}

    Status set(const std::string &key, const std::string &value) override {
        count(key.size() + value.size(), 0);
        ++sets;
        return inner_->set(key, value);
    }
    Status get(const std::string &key, std::string *value, comm::Millis timeout) override {
        Status s = inner_->get(key, value, timeout);
        count(key.size(), s.ok() ? value->size() : 0);
        return s;
    }
    Status wait(const std::vector<std::string> &keys, comm::Millis timeout) override {
        count(bytes_of(keys), 0);
        return inner_->wait(keys, timeout);
    }
    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        count(key.size() + 8, 8);
        return inner_->add(key, delta, result);
    }
    Status check(const std::vector<std::string> &keys, bool *present) override {
        count(bytes_of(keys), 1);
        return inner_->check(keys, present);
    }
    Status erase(const std::string &key) override {
        count(key.size(), 0);
        return inner_->erase(key);
    }

    int64_t requests = 0, sets = 0, sent = 0, received = 0;

  private:
    static size_t bytes_of(const std::vector<std::string> &keys) {
        size_t n = 0;
        for (const std::string &k : keys) n += k.size();
        return n;
    }
    void count(size_t out, size_t in) {
        ++requests;
        sent += static_cast<int64_t>(out);
        received += static_cast<int64_t>(in);
    }
    std::shared_ptr<comm::Store> inner_;
};

struct RendezvousFigures {
    int world = 0;
    double ms = 0;
    int64_t requests_max = 0, keys = 0;
    double requests_mean = 0, received_mean = 0, sent_mean = 0;
};

// `world` threads connect a Gloo communicator over 127.0.0.1, each through its own
// counting view of one in-process store. The in-process meeting (every rank a thread of
// one process) is off: ranks in separate processes skip it after one or two keys.
RendezvousFigures gloo_rendezvous(int world) {
    RendezvousFigures f;
    f.world = world;
    std::shared_ptr<comm::Store> inner = comm::open_local_store("bench-scale-" + std::to_string(world));
    std::vector<std::shared_ptr<CountingStore>> views;
    for (int r = 0; r < world; ++r) views.push_back(std::make_shared<CountingStore>(inner));
    std::vector<std::unique_ptr<comm::Communicator>> comms(world);
    std::vector<Status> status(world);
    comm::GlooOptions o;
    o.bind_address = "127.0.0.1";
    o.timeout = comm::Millis(120000);
    o.in_process = false;
    const double t0 = now_seconds();
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] { status[r] = comm::create_gloo_communicator(views[r], r, world, o, &comms[r]); });
    for (std::thread &t : threads) t.join();
    f.ms = (now_seconds() - t0) * 1e3;
    for (int r = 0; r < world; ++r) {
        check(status[r], "create_gloo_communicator");
        f.requests_max = std::max(f.requests_max, views[r]->requests);
        f.requests_mean += static_cast<double>(views[r]->requests) / world;
        f.received_mean += static_cast<double>(views[r]->received) / world;
        f.sent_mean += static_cast<double>(views[r]->sent) / world;
        f.keys += views[r]->sets;
    }
    // Each rank's own thread tears its communicator down: Gloo closes a pair in a tick of
    // its device's loop (up to 10 ms), one pair after another.
    threads.clear();
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { comms[r].reset(); });
    for (std::thread &t : threads) t.join();
    return f;
}

// ---------------------------------------------------------------------- the report

void print_saves(const std::vector<SaveFigures> &saves, const Model &model, const Options &opt) {
    std::printf("\nsave: rank 0 (shard index 0: a writer in every topology, and the rank that commits)\n");
    std::printf("%-11s %6s %6s %6s | %-15s | %-28s | %-17s | %-30s | %s\n", "topology", "ranks", "shards", "files",
                "layout", "write plan (rank 0)", "MANIFEST", "commit on rank 0", "writers' reports");
    std::printf("%-11s %6s %6s %6s | %7s %7s | %7s %7s %6s %6s | %9s %7s | %8s %8s %10s | %9s %9s\n", "", "", "", "",
                "ms", "KiB", "chunks", "GiB", "ms", "KiB", "chunks", "MiB", "gather ms", "encode ms", "peak MiB",
                "max KiB", "total MiB");
    for (const SaveFigures &s : saves) {
        char manifest[16] = "refused";
        if (s.manifest_bytes > 0)
            std::snprintf(manifest, sizeof manifest, "%.2f", mib(static_cast<int64_t>(s.manifest_bytes)));
        std::printf("%-11s %6d %6d %6d | %7.3f %7.1f | %7zu %7.2f %6.3f %6.1f | %9zu %7s | %8.1f %8.1f %10.1f | "
                    "%9.1f %9.2f\n",
                    s.topo.name().c_str(), s.topo.world, s.topo.shards, s.topo.shards, s.layout.ms, kib(s.layout.peak),
                    s.plan_chunks, static_cast<double>(s.plan_file_bytes) / (kMiB * 1024), s.plan.ms,
                    kib(s.plan.peak), s.manifest_chunks, manifest, s.gather.ms,
                    s.encode.ms, mib(s.commit_peak), kib(static_cast<int64_t>(s.report_bytes_max)),
                    mib(static_cast<int64_t>(s.report_bytes_total)));
    }
    for (const SaveFigures &s : saves) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"save\",\"model_params\":%zu,\"model_elements\":%llu,"
                    "\"units\":%d,"
                    "\"topology\":\"%s\",\"ranks\":%d,\"shards\":%d,\"files\":%d,\"reps\":%d,"
                    "\"layout_ms\":%.4f,\"layout_peak_bytes\":%lld,\"plan_ms\":%.4f,\"plan_peak_bytes\":%lld,"
                    "\"plan_chunks\":%zu,\"plan_file_bytes\":%llu,\"manifest_chunks\":%zu,\"manifest_bytes\":%zu,"
                    "\"gather_ms\":%.3f,\"gather_peak_bytes\":%lld,\"encode_ms\":%.3f,\"encode_peak_bytes\":%lld,"
                    "\"commit_peak_bytes\":%lld,\"max_writer_chunks\":%zu,\"report_bytes_max\":%llu,"
                    "\"report_bytes_total\":%llu}\n",
                    model.names.size(), static_cast<unsigned long long>(model.numel), model.units,
                    s.topo.name().c_str(), s.topo.world, s.topo.shards, s.topo.shards, opt.scale_reps, s.layout.ms,
                    static_cast<long long>(s.layout.peak), s.plan.ms, static_cast<long long>(s.plan.peak),
                    s.plan_chunks, static_cast<unsigned long long>(s.plan_file_bytes), s.manifest_chunks,
                    s.manifest_bytes, s.gather.ms, static_cast<long long>(s.gather.peak), s.encode.ms,
                    static_cast<long long>(s.encode.peak), static_cast<long long>(s.commit_peak),
                    s.max_writer_chunks, static_cast<unsigned long long>(s.report_bytes_max),
                    static_cast<unsigned long long>(s.report_bytes_total));
    }
}

void print_loads(const std::vector<LoadFigures> &loads, const Options &opt) {
    std::printf("\nload: a whole load (values and states) by the rank with the most reads of up to 64 shard "
                "indices (index: its shard index)\n");
    std::printf("%-11s   %-11s %6s | %8s | %-20s | %-15s | %-16s | %7s %6s %9s %9s\n", "saved by", "loaded by",
                "index", "MANIFEST", "read + decode", "layout", "plan_read", "reads", "files", "read GiB",
                "kept GiB");
    std::printf("%-11s   %-11s %6s | %8s | %9s %10s | %7s %7s | %7s %8s |\n", "", "", "", "MiB", "ms", "peak MiB", "ms",
                "KiB", "ms", "KiB");
    for (const LoadFigures &f : loads) {
        std::printf("%-11s-> %-11s %6d | %8.2f | %9.1f %10.1f | %7.3f %7.1f | %7.3f %8.1f | %7zu %6zu %9.2f %9.2f\n",
                    f.from.c_str(), f.into.name().c_str(), f.rank, mib(static_cast<int64_t>(f.manifest_bytes)),
                    f.decode.ms, mib(f.decode.peak), f.layout.ms, kib(f.layout.peak), f.plan.ms, kib(f.plan.peak),
                    f.reads, f.files, static_cast<double>(f.bytes_read) / (kMiB * 1024),
                    static_cast<double>(f.bytes_needed) / (kMiB * 1024));
    }
    for (const LoadFigures &f : loads) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"load\",\"saved_by\":\"%s\",\"loaded_by\":\"%s\",\"ranks\":%d,"
                    "\"shards\":%d,\"shard\":%d,\"reps\":%d,\"manifest_bytes\":%llu,\"decode_ms\":%.3f,"
                    "\"decode_peak_bytes\":%lld,\"manifest_kept_bytes\":%lld,\"layout_ms\":%.4f,"
                    "\"layout_peak_bytes\":%lld,\"plan_ms\":%.4f,\"plan_peak_bytes\":%lld,\"reads\":%zu,"
                    "\"files\":%zu,\"bytes_read\":%llu,\"bytes_needed\":%llu}\n",
                    f.from.c_str(), f.into.name().c_str(), f.into.world, f.into.shards, f.rank, opt.scale_reps,
                    static_cast<unsigned long long>(f.manifest_bytes), f.decode.ms,
                    static_cast<long long>(f.decode.peak), static_cast<long long>(f.decode.kept), f.layout.ms,
                    static_cast<long long>(f.layout.peak), f.plan.ms, static_cast<long long>(f.plan.peak), f.reads,
                    f.files, static_cast<unsigned long long>(f.bytes_read),
                    static_cast<unsigned long long>(f.bytes_needed));
    }
}

void print_rendezvous(const std::vector<RendezvousFigures> &rv, const std::vector<int> &opts_worlds) {
    std::printf("\ngroup creation: the store traffic of Gloo's full mesh (measured, ranks as threads, 127.0.0.1)\n");
    std::printf("%6s | %9s %9s %6s | %12s %12s %14s | %9s\n", "ranks", "req/rank", "req max", "keys", "sent B/rank",
                "recv B/rank", "recv/(W-1)^2", "ms");
    for (const RendezvousFigures &f : rv) {
        const double w1 = static_cast<double>(f.world - 1);
        std::printf("%6d | %9.1f %9lld %6lld | %12.0f %12.0f %14.1f | %9.1f\n", f.world, f.requests_mean,
                    static_cast<long long>(f.requests_max), static_cast<long long>(f.keys), f.sent_mean,
                    f.received_mean, f.received_mean / (w1 * w1), f.ms);
    }
    // Requests per rank grow linearly and bytes with (W-1)^2 (the table shows both): the
    // line through the last two rows, and the last row's bytes per (W-1)^2.
    if (rv.size() >= 2) {
        const RendezvousFigures &a = rv[rv.size() - 2], &b = rv.back();
        const double slope = (b.requests_mean - a.requests_mean) / (b.world - a.world);
        const double per_pair = b.received_mean / ((b.world - 1.0) * (b.world - 1.0));
        std::printf("  at scale (requests/rank = %.2f + %.2f W, received = %.1f (W-1)^2 B/rank):\n",
                    b.requests_mean - slope * b.world, slope, per_pair);
        for (int w : opts_worlds) {
            const double req = b.requests_mean + slope * (w - b.world);
            const double got = per_pair * (w - 1.0) * (w - 1.0);
            std::printf("    %6d ranks: %8.0f requests and %8.2f GiB per rank; %12.0f requests and %9.2f TiB "
                        "through rank 0's store\n",
                        w, req, got / (kMiB * 1024), req * w, got * w / (kMiB * kMiB));
        }
    }
    for (const RendezvousFigures &f : rv) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"gloo_rendezvous\",\"ranks\":%d,\"requests_per_rank\":%.1f,"
                    "\"requests_max\":%lld,\"keys\":%lld,\"sent_bytes_per_rank\":%.0f,"
                    "\"received_bytes_per_rank\":%.0f,\"ms\":%.1f}\n",
                    f.world, f.requests_mean, static_cast<long long>(f.requests_max), static_cast<long long>(f.keys),
                    f.sent_mean, f.received_mean, f.ms);
    }
}

}  // namespace

int section_scale(const Options &opt) {
    const Model model = llama_70b(opt.scale_unit_per_param);
    const int reps = opt.scale_reps;
    std::printf("scale: %zu params, %.2f billion elements, bf16, AdamW (a checkpoint: %.1f GiB of fp32 values and "
                "states); %d units (%s); alignment %llu bytes; median of %d runs\n",
                model.names.size(), static_cast<double>(model.numel) / 1e9,
                static_cast<double>(model.numel) * 12 / (kMiB * 1024), model.units,
                opt.scale_unit_per_param ? "one per param" : "one per layer, the embedding, the head",
                static_cast<unsigned long long>(kAlignBytes), reps);
    const double t0 = now_seconds();

    std::vector<SaveFigures> saves;
    std::vector<LoadFigures> loads;
    auto load = [&](const SaveFigures &s, Topology into) {
        if (!s.encoded.empty()) loads.push_back(simulate_load(model, s, into, reps));
    };
    for (int world : opt.scale_worlds) {
        for (Topology t : {flat(world), mesh(world)}) {
            if (t.world % kNodeShards != 0 && !t.flat()) continue;
            saves.push_back(simulate_save(model, t, reps));
            load(saves.back(), t);  // the same job resumes
            if (world == opt.scale_load_from) {
                load(saves.back(), flat(opt.scale_load_into));
                if (opt.scale_load_into % kNodeShards == 0) load(saves.back(), mesh(opt.scale_load_into));
            }
            std::string().swap(saves.back().encoded);  // its size is kept
        }
    }
    const double simulated = now_seconds() - t0;

    std::vector<RendezvousFigures> rv;
    for (int world : {2, 4, 8, 16, 32}) rv.push_back(gloo_rendezvous(world));

    print_saves(saves, model, opt);
    print_loads(loads, opt);
    print_rendezvous(rv, opt.scale_worlds);
    std::printf("  (saves and loads took %.1f s in all, including the writers' plans and the search for the "
                "loading rank)\n",
                simulated);
    return 0;
}

}  // namespace sxbench
