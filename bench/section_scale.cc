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
//   commit      what rank 0 does at a commit: the manifest's skeleton (each param's place
//               in its unit), every writer's report received (a string as long as the
//               report, as from the store: where its file's index is) and filed, then
//               ckpt::encode_manifest (validate() and the FlatBuffer). The writers' plans
//               and indexes are made by ckpt::plan_write, outside the time and the count.
//   load        a rank of the loading job reads the MANIFEST (a copy of the encoded
//               bytes, as read_manifest reads the file into a string), decodes it
//               (ckpt::decode_manifest: CRC, verifier, copy, validate()), matches params
//               by name, reads the indexes of the files its shard lies in
//               (ckpt::read_file_indexes, through a FileOps that serves each index, made
//               beforehand outside the time and the count) and plans its reads
//               (ckpt::plan_read), for a whole load (values and both states). The rank
//               shown is the one with the most files to read among up to 64 shard indices
//               spread evenly.
// Unlike the other sections' figures, these are absolute, not ratios to a peer: the goal
// they are held to is absolute (under a second and a few MiB per rank), and what they
// show is how each grows from one world size to the next.
// Time: the median of --scale-reps runs. Memory: the most heap bytes live at once
// during a run beyond those live before it (a counting global operator new,
// bench/heap_counter.cc): what the rank holds for that step and nothing else.
//
// Then the store traffic of creating a Gloo communicator (its mesh, full or sparse,
// comm/gloo/full_mesh.h), measured at small world sizes through a counting store around
// the in-process one, the ranks as threads; and the rate at which one of sx's TCP stores
// serves requests from many clients, from which the time of a sparse mesh's rendezvous
// at scale is estimated (every request through rank 0's one server thread, one at a time).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <unordered_map>

#include "bench_util.h"
#include "ckpt/directory.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_index.h"
#include "ckpt/shard_plan.h"
#include "comm/communicator.h"
#include "comm/gloo/full_mesh.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "core/layout.h"
#include "io/crc32c.h"
#include "io/file_ops.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

namespace ckpt = sx::ckpt;
namespace comm = sx::comm;
namespace rdzv = sx::rdzv;
namespace core = sx::core;
using sx::Millis;
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

// A stand-in for a chunk's CRC32C: any non-zero value.
uint32_t fake_crc(int writer, uint64_t offset) {
    uint64_t x = (static_cast<uint64_t>(writer) << 40) ^ offset ^ 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return static_cast<uint32_t>(x >> 32) | 1u;
}

// Writer w's file index: the chunk table at the end of its file (save.cc, write_shard).
std::string index_of(const ckpt::WritePlan &plan, int writer) {
    std::vector<ckpt::IndexRecord> records;
    records.reserve(plan.chunks.size());
    for (const ckpt::WriteChunk &c : plan.chunks) {
        ckpt::IndexRecord r;
        r.param = c.param;
        r.kind = static_cast<int32_t>(c.kind);
        r.begin = c.begin, r.end = c.end, r.offset = c.file_offset;
        r.length = (c.end - c.begin) * sizeof(float);
        r.crc32c = fake_crc(writer, c.file_offset);
        records.push_back(r);
    }
    return ckpt::encode_index(records);
}

// What a writer tells rank 0 after its file is durable (save.cc's report): a status
// code, an empty message and its NUL, then where its index is (a FileIndex).
constexpr size_t kReportHead = sizeof(int32_t) + 1;

std::string report_of(const ckpt::WritePlan &plan, const std::string &index) {
    ckpt::FileIndex fi;
    fi.offset = plan.file_bytes;
    fi.length = index.size();
    fi.crc32c = sx::io::crc32c(index.data(), index.size());
    fi.chunks = static_cast<uint32_t>(plan.chunks.size());
    std::string out(kReportHead + sizeof fi, '\0');
    std::memcpy(&out[kReportHead], &fi, sizeof fi);
    return out;
}

// Files writer w's report into *m, as rank 0's commit does (save.cc, gather_file_indexes).
void file_report(const std::string &report, int writer, int files, ckpt::Manifest *m) {
    ckpt::FileIndex fi;
    std::memcpy(&fi, report.data() + kReportHead, sizeof fi);
    m->files.push_back(ckpt::shard_file_name(writer, files));
    m->file_indexes.push_back(fi);
}

// The manifest of a save but for its files (save.cc, skeleton_of).
ckpt::Manifest skeleton_of(const Model &model, Topology topo, const core::Layout &layout) {
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
        const core::ParamPlacement &at = layout.placement(static_cast<int32_t>(p));
        e.unit_offset = at.offset;
        e.unit_shard_numel = layout.units()[at.unit_index].shard_numel;
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
    size_t manifest_chunks = 0;   // every file's, in their indexes
    size_t manifest_bytes = 0;    // 0: encode_manifest refused it
    size_t max_writer_chunks = 0;
    uint64_t index_bytes_max = 0; // the largest file index
    uint64_t report_bytes_max = 0, report_bytes_total = 0;
    int64_t commit_peak = 0;      // rank 0: the manifest while gathering, then while encoding
    std::string encoded;          // the MANIFEST's bytes, for the loads
    core::Layout saved_layout;    // for the loads: the files' indexes are made again from it
};

SaveFigures simulate_save(const Model &model, Topology topo, int reps) {
    SaveFigures s;
    s.topo = topo;
    const core::Layout layout = build_layout(model, topo, &s.layout, reps);
    ckpt::WritePlan plan;
    s.plan = measure(reps, [&] { plan = ckpt::plan_write(layout, 0, model.kinds); });
    s.plan_chunks = plan.chunks.size();
    s.plan_file_bytes = plan.file_bytes;

    // The writers' reports, made outside the time and the count (each writer's own work).
    std::vector<std::string> reports(static_cast<size_t>(topo.shards));
    {
        HeapCounter::Uncounted writer_side;
        for (int w = 0; w < topo.shards; ++w) {
            const ckpt::WritePlan wp = ckpt::plan_write(layout, w, model.kinds);
            const std::string index = index_of(wp, w);
            reports[w] = report_of(wp, index);
            s.max_writer_chunks = std::max(s.max_writer_chunks, wp.chunks.size());
            s.index_bytes_max = std::max<uint64_t>(s.index_bytes_max, index.size());
            s.manifest_chunks += wp.chunks.size();
            s.report_bytes_max = std::max<uint64_t>(s.report_bytes_max, reports[w].size());
            s.report_bytes_total += reports[w].size();
        }
    }

    // The commit on rank 0: from the skeleton, every writer's report in turn.
    ckpt::Manifest m;
    s.gather = measure(reps, [&] {
        ckpt::Manifest got = skeleton_of(model, topo, layout);
        for (int w = 0; w < topo.shards; ++w) {
            const std::string received = reports[w];  // the store's answer to rank 0's get
            file_report(received, w, topo.shards, &got);
        }
        m = std::move(got);
    });

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
    s.saved_layout = layout;
    return s;
}

// ---------------------------------------------------------------------- loading

struct LoadFigures {
    std::string from;
    Topology into;
    int rank = 0;             // the loading rank shown (its shard index)
    uint64_t manifest_bytes = 0;
    Cost decode, layout, plan;  // decode: the MANIFEST and the indexes of the files it reads
    size_t index_files = 0;    // indexes read
    uint64_t index_bytes = 0;
    size_t reads = 0;
    size_t files = 0;          // files it reads from
    uint64_t bytes_read = 0;   // whole chunks
    uint64_t bytes_needed = 0; // the parts it keeps
};

// The checkpoint's shard files as far as a load reads them before planning: each file's
// index, at the offset its FileIndex gives, made (outside the time and the count) from
// the saved layout for the files one rank reads. Nothing else can be opened.
class IndexFiles final : public sx::io::FileOps {
  public:
    IndexFiles(const Model &model, const SaveFigures &save, const std::vector<uint32_t> &files) {
        HeapCounter::Uncounted writer_side;
        for (uint32_t f : files)
            index_[f] = index_of(ckpt::plan_write(save.saved_layout, static_cast<int>(f), model.kinds),
                                 static_cast<int>(f));
    }
    Status open_read(const std::string &path, int *fd) override {
        int rank = 0, world = 0;
        if (std::sscanf(path.c_str() + path.rfind('/') + 1, "shard-%d-of-%d.bin", &rank, &world) != 2 ||
            index_.count(static_cast<uint32_t>(rank)) == 0)
            return SX_ERROR(SX_ERR_NOT_FOUND, "%s is not simulated", path.c_str());
        *fd = rank;
        return Status::Ok();
    }
    Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) override {
        const std::string &index = index_.at(static_cast<uint32_t>(fd));
        (void)offset;  // the index is all a simulated file holds
        if (n != index.size()) return SX_ERROR(SX_ERR_CORRUPT, "%s: %zu bytes asked of its index", path.c_str(), n);
        std::memcpy(data, index.data(), n);
        return Status::Ok();
    }
    Status close(int, const std::string &) override { return Status::Ok(); }
    Status open_write(const std::string &path, int *) override { return refused(path); }
    Status pwrite_all(int, const void *, size_t, uint64_t, const std::string &path) override { return refused(path); }
    Status file_size(int, uint64_t *, const std::string &path) override { return refused(path); }
    Status fsync(int, const std::string &path) override { return refused(path); }
    Status mkdir(const std::string &path) override { return refused(path); }
    Status rename(const std::string &from, const std::string &) override { return refused(from); }
    Status fsync_dir(const std::string &path) override { return refused(path); }
    Status unlink(const std::string &path) override { return refused(path); }
    Status remove_tree(const std::string &path) override { return refused(path); }
    Status list_dir(const std::string &path, std::vector<std::string> *) override { return refused(path); }
    Status exists(const std::string &path, bool *) override { return refused(path); }
    Status is_directory(const std::string &path, bool *) override { return refused(path); }

  private:
    static Status refused(const std::string &path) {
        return SX_ERROR(SX_ERR_UNSUPPORTED, "%s: a simulated checkpoint is only read", path.c_str());
    }
    std::map<uint32_t, std::string> index_;
};

// Params matched by name, as a load does (load.cc, match_params).
std::vector<int32_t> match(const ckpt::Manifest &m, const Model &model) {
    std::unordered_map<std::string, int32_t> by_name;
    for (size_t i = 0; i < m.params.size(); ++i) by_name.emplace(m.params[i].name, static_cast<int32_t>(i));
    std::vector<int32_t> index(model.names.size(), -1);
    for (size_t p = 0; p < model.names.size(); ++p) index[p] = by_name.at(model.names[p]);
    return index;
}

LoadFigures simulate_load(const Model &model, const SaveFigures &save, Topology into, int reps) {
    LoadFigures f;
    f.from = save.topo.name();
    f.into = into;
    f.manifest_bytes = save.encoded.size();
    const core::Layout layout = build_layout(model, into, &f.layout, reps);

    // The rank with the most files to read among up to 64 shard indices spread evenly.
    std::vector<uint32_t> files;
    {
        HeapCounter::Uncounted choosing;
        ckpt::Manifest m0;
        check(ckpt::decode_manifest(save.encoded.data(), save.encoded.size(), &m0), "decode_manifest");
        const std::vector<int32_t> index = match(m0, model);
        const int candidates = std::min(into.shards, 64);
        for (int i = 0; i < candidates; ++i) {
            const int64_t spread = static_cast<int64_t>(i) * (into.shards - 1) / std::max(candidates - 1, 1);
            const int shard = static_cast<int>(spread);
            std::vector<uint32_t> need = ckpt::files_for_shard(m0, layout, shard, index);
            if (need.size() >= files.size()) files = std::move(need), f.rank = shard;
        }
    }
    IndexFiles disk(model, save, files);

    // What a load does before it plans: read and decode the MANIFEST, match the params,
    // and read the indexes of the files its shard lies in.
    ckpt::Manifest m;
    std::vector<int32_t> index;
    f.decode = measure(reps, [&] {
        const std::string file = save.encoded;  // read_manifest reads the whole file into a string
        ckpt::Manifest decoded;
        check(ckpt::decode_manifest(file.data(), file.size(), &decoded), "decode_manifest");
        std::vector<int32_t> matched = match(decoded, model);
        check(ckpt::read_file_indexes(disk, "simulated", ckpt::files_for_shard(decoded, layout, f.rank, matched), &decoded),
              "read_file_indexes");
        m = std::move(decoded);
        index = std::move(matched);
    });
    f.index_files = files.size();
    for (uint32_t file : files) f.index_bytes += m.file_indexes[file].length;

    std::vector<ckpt::ReadOp> ops;
    f.plan = measure(reps, [&] {
        std::vector<ckpt::ReadOp> planned;
        check(ckpt::plan_read(m, layout, f.rank, index, model.kinds, &planned), "plan_read");
        ops = std::move(planned);
    });
    std::set<uint32_t> read_from;
    for (const ckpt::ReadOp &op : ops) {
        read_from.insert(op.chunk->file);
        f.bytes_read += op.chunk->length;
        f.bytes_needed += (op.copy_end - op.copy_begin) * sizeof(float);
    }
    f.reads = ops.size();
    f.files = read_from.size();
    return f;
}

// ---------------------------------------------------------------------- rendezvous

// What the ranks' views share: the keys set and not yet erased (every key the mesh's
// connect sets is a new one, and it erases only keys that exist), and the most at once.
struct KeysHeld {
    std::atomic<int64_t> now{0}, most{0};
    void add(int64_t d) {
        const int64_t n = now.fetch_add(d) + d;
        int64_t m = most.load();
        while (n > m && !most.compare_exchange_weak(m, n)) {
        }
    }
};

// A rank's view of the store that counts its requests and bytes.
class CountingStore final : public rdzv::Store {
  public:
    CountingStore(std::shared_ptr<rdzv::Store> inner, std::shared_ptr<KeysHeld> held)
        : inner_(std::move(inner)), held_(std::move(held)) {}

    Status set(const std::string &key, const std::string &value) override {
        count(key.size() + value.size(), 0);
        ++sets;
        held_->add(1);
        return inner_->set(key, value);
    }
    Status get(const std::string &key, std::string *value, Millis timeout) override {
        Status s = inner_->get(key, value, timeout);
        count(key.size(), s.ok() ? value->size() : 0);
        return s;
    }
    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
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
        held_->add(-1);
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
    std::shared_ptr<rdzv::Store> inner_;
    std::shared_ptr<KeysHeld> held_;
};

struct RendezvousFigures {
    int world = 0;
    bool sparse = false;
    double pairs_mean = 0;  // pairs per rank
    double ms = 0;
    int64_t requests_max = 0, keys = 0, keys_held_most = 0;
    double requests_mean = 0, received_mean = 0, sent_mean = 0;
};

// `world` threads connect a Gloo communicator over 127.0.0.1, each through its own
// counting view of one in-process store. The in-process meeting (every rank a thread of
// one process) is off: ranks in separate processes skip it after one or two keys.
RendezvousFigures gloo_rendezvous(int world, bool sparse) {
    RendezvousFigures f;
    f.world = world;
    f.sparse = sparse;
    std::shared_ptr<rdzv::Store> inner =
        rdzv::open_local_store("bench-scale-" + std::to_string(world) + (sparse ? "-sparse" : ""));
    auto held = std::make_shared<KeysHeld>();
    std::vector<std::shared_ptr<CountingStore>> views;
    for (int r = 0; r < world; ++r) views.push_back(std::make_shared<CountingStore>(inner, held));
    std::vector<std::unique_ptr<comm::Communicator>> comms(world);
    std::vector<Status> status(world);
    comm::GlooOptions o;
    o.bind_address = "127.0.0.1";
    o.timeout = Millis(120000);
    o.in_process = false;
    o.mesh = sparse ? comm::GlooOptions::Mesh::kSparse : comm::GlooOptions::Mesh::kFull;
    for (int r = 0; r < world; ++r)
        f.pairs_mean += static_cast<double>(sparse ? comm::sparse_peers(r, world).size() : world - 1) / world;
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
    f.keys_held_most = held->most.load();
    // Each rank's own thread tears its communicator down: Gloo closes a pair in a tick of
    // its device's loop (up to 10 ms), one pair after another.
    threads.clear();
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { comms[r].reset(); });
    for (std::thread &t : threads) t.join();
    return f;
}

// Pairs per rank of a sparse mesh of `world`, the mean over its ranks.
double sparse_pairs_mean(int world) {
    double sum = 0;
    for (int r = 0; r < world; ++r) sum += static_cast<double>(comm::sparse_peers(r, world).size());
    return sum / world;
}

// Requests per second that one of sx's TCP stores (its rank 0's server, one thread)
// serves to `clients` client threads, each SETting, GETting and ERASEing keys of its own
// (the mesh's requests) for about `seconds`.
double store_rate(int clients, double seconds) {
    const std::string url = "tcp://127.0.0.1:" + std::to_string(free_ports(1));
    std::vector<std::shared_ptr<rdzv::Store>> stores(static_cast<size_t>(clients) + 1);
    std::vector<std::thread> threads;
    std::vector<Status> opened(stores.size());
    for (int r = 0; r <= clients; ++r)
        threads.emplace_back([&, r] {
            rdzv::Rendezvous rv;
            opened[r] = rdzv::parse_rendezvous(url.c_str(), r, clients + 1, &rv);
            if (opened[r].ok()) opened[r] = rdzv::open_store(rv, Millis(30000), &stores[r]);
        });
    for (std::thread &t : threads) t.join();
    for (const Status &s : opened) check(s, "open_store");
    threads.clear();
    std::atomic<int64_t> served{0};
    std::vector<Status> failed(stores.size());
    const double t0 = now_seconds();
    for (int r = 1; r <= clients; ++r)
        threads.emplace_back([&, r] {
            int64_t n = 0;
            std::string value;
            for (int i = 0; now_seconds() - t0 < seconds; ++i) {
                const std::string key = "rate/" + std::to_string(r) + "/" + std::to_string(i);
                Status s = stores[r]->set(key, std::string(16, 'a'));
                if (s.ok()) s = stores[r]->get(key, &value, Millis(10000));
                if (s.ok()) s = stores[r]->erase(key);
                if (!s.ok()) {
                    failed[r] = s;
                    break;
                }
                n += 3;
            }
            served.fetch_add(n);
        });
    for (std::thread &t : threads) t.join();
    const double took = now_seconds() - t0;
    for (const Status &s : failed) check(s, "the store's rate");
    return static_cast<double>(served.load()) / took;
}

// ---------------------------------------------------------------------- the report

void print_saves(const std::vector<SaveFigures> &saves, const Model &model, const Options &opt) {
    std::printf("\nsave: rank 0 (shard index 0: a writer in every topology, and the rank that commits)\n");
    std::printf("%-11s %6s %6s %6s | %-15s | %-28s | %-27s | %-30s | %s\n", "topology", "ranks", "shards", "files",
                "layout", "write plan (rank 0)", "chunks, indexes, MANIFEST", "commit on rank 0", "writers' reports");
    std::printf("%-11s %6s %6s %6s | %7s %7s | %7s %7s %6s %6s | %9s %8s %8s | %8s %8s %10s | %9s %9s\n", "", "", "",
                "", "ms", "KiB", "chunks", "GiB", "ms", "KiB", "chunks", "index KiB", "MiB", "gather ms",
                "encode ms", "peak MiB", "max KiB", "total MiB");
    for (const SaveFigures &s : saves) {
        char manifest[16] = "refused";
        if (s.manifest_bytes > 0)
            std::snprintf(manifest, sizeof manifest, "%.2f", mib(static_cast<int64_t>(s.manifest_bytes)));
        std::printf("%-11s %6d %6d %6d | %7.3f %7.1f | %7zu %7.2f %6.3f %6.1f | %9zu %8.1f %8s | %8.1f %8.1f %10.1f | "
                    "%9.2f %9.2f\n",
                    s.topo.name().c_str(), s.topo.world, s.topo.shards, s.topo.shards, s.layout.ms, kib(s.layout.peak),
                    s.plan_chunks, static_cast<double>(s.plan_file_bytes) / (kMiB * 1024), s.plan.ms,
                    kib(s.plan.peak), s.manifest_chunks, kib(static_cast<int64_t>(s.index_bytes_max)), manifest,
                    s.gather.ms,
                    s.encode.ms, mib(s.commit_peak), kib(static_cast<int64_t>(s.report_bytes_max)),
                    mib(static_cast<int64_t>(s.report_bytes_total)));
    }
    for (const SaveFigures &s : saves) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"save\",\"model_params\":%zu,\"model_elements\":%llu,"
                    "\"units\":%d,"
                    "\"topology\":\"%s\",\"ranks\":%d,\"shards\":%d,\"files\":%d,\"reps\":%d,"
                    "\"layout_ms\":%.4f,\"layout_peak_bytes\":%lld,\"plan_ms\":%.4f,\"plan_peak_bytes\":%lld,"
                    "\"plan_chunks\":%zu,\"plan_file_bytes\":%llu,\"checkpoint_chunks\":%zu,\"index_bytes_max\":%llu,"
                    "\"manifest_bytes\":%zu,"
                    "\"gather_ms\":%.3f,\"gather_peak_bytes\":%lld,\"encode_ms\":%.3f,\"encode_peak_bytes\":%lld,"
                    "\"commit_peak_bytes\":%lld,\"max_writer_chunks\":%zu,\"report_bytes_max\":%llu,"
                    "\"report_bytes_total\":%llu}\n",
                    model.names.size(), static_cast<unsigned long long>(model.numel), model.units,
                    s.topo.name().c_str(), s.topo.world, s.topo.shards, s.topo.shards, opt.scale_reps, s.layout.ms,
                    static_cast<long long>(s.layout.peak), s.plan.ms, static_cast<long long>(s.plan.peak),
                    s.plan_chunks, static_cast<unsigned long long>(s.plan_file_bytes), s.manifest_chunks,
                    static_cast<unsigned long long>(s.index_bytes_max), s.manifest_bytes, s.gather.ms, static_cast<long long>(s.gather.peak), s.encode.ms,
                    static_cast<long long>(s.encode.peak), static_cast<long long>(s.commit_peak),
                    s.max_writer_chunks, static_cast<unsigned long long>(s.report_bytes_max),
                    static_cast<unsigned long long>(s.report_bytes_total));
    }
}

void print_loads(const std::vector<LoadFigures> &loads, const Options &opt) {
    std::printf("\nload: a whole load (values and states) by the rank with the most files to read of up to 64 "
                "shard indices (shard: its shard index)\n");
    std::printf("%-11s   %-11s %6s | %8s | %-36s | %-15s | %-16s | %7s %6s %9s %9s\n", "saved by", "loaded by",
                "shard", "MANIFEST", "MANIFEST and indexes: read + decode", "layout", "plan_read", "reads", "files",
                "read GiB", "kept GiB");
    std::printf("%-11s   %-11s %6s | %8s | %7s %9s %8s %8s | %7s %7s | %7s %8s |\n", "", "", "", "MiB", "indexes",
                "index KiB", "ms", "peak MiB", "ms", "KiB", "ms", "KiB");
    for (const LoadFigures &f : loads) {
        std::printf("%-11s-> %-11s %6d | %8.2f | %7zu %9.1f %8.1f %8.2f | %7.3f %7.1f | %7.3f %8.1f | %7zu %6zu %9.2f "
                    "%9.2f\n",
                    f.from.c_str(), f.into.name().c_str(), f.rank, mib(static_cast<int64_t>(f.manifest_bytes)),
                    f.index_files, kib(static_cast<int64_t>(f.index_bytes)), f.decode.ms, mib(f.decode.peak),
                    f.layout.ms, kib(f.layout.peak), f.plan.ms, kib(f.plan.peak),
                    f.reads, f.files, static_cast<double>(f.bytes_read) / (kMiB * 1024),
                    static_cast<double>(f.bytes_needed) / (kMiB * 1024));
    }
    for (const LoadFigures &f : loads) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"load\",\"saved_by\":\"%s\",\"loaded_by\":\"%s\",\"ranks\":%d,"
                    "\"shards\":%d,\"shard\":%d,\"reps\":%d,\"manifest_bytes\":%llu,\"indexes_read\":%zu,"
                    "\"index_bytes_read\":%llu,\"decode_ms\":%.3f,"
                    "\"decode_peak_bytes\":%lld,\"manifest_kept_bytes\":%lld,\"layout_ms\":%.4f,"
                    "\"layout_peak_bytes\":%lld,\"plan_ms\":%.4f,\"plan_peak_bytes\":%lld,\"reads\":%zu,"
                    "\"files\":%zu,\"bytes_read\":%llu,\"bytes_needed\":%llu}\n",
                    f.from.c_str(), f.into.name().c_str(), f.into.world, f.into.shards, f.rank, opt.scale_reps,
                    static_cast<unsigned long long>(f.manifest_bytes), f.index_files,
                    static_cast<unsigned long long>(f.index_bytes), f.decode.ms,
                    static_cast<long long>(f.decode.peak), static_cast<long long>(f.decode.kept), f.layout.ms,
                    static_cast<long long>(f.layout.peak), f.plan.ms, static_cast<long long>(f.plan.peak), f.reads,
                    f.files, static_cast<unsigned long long>(f.bytes_read),
                    static_cast<unsigned long long>(f.bytes_needed));
    }
}

void print_rendezvous(const std::vector<RendezvousFigures> &rv, const std::vector<int> &opts_worlds, double rate,
                      int rate_clients) {
    std::printf("\ngroup creation: the store traffic of connecting Gloo's mesh, full or sparse (measured, ranks as "
                "threads, 127.0.0.1)\n");
    std::printf("%-6s %6s | %7s %9s %9s %8s %9s | %12s %12s %11s | %9s\n", "mesh", "ranks", "pairs", "req/rank",
                "req max", "keys", "held most", "sent B/rank", "recv B/rank", "recv/pair", "ms");
    for (const RendezvousFigures &f : rv) {
        std::printf("%-6s %6d | %7.2f %9.1f %9lld %8lld %9lld | %12.0f %12.0f %11.1f | %9.1f\n",
                    f.sparse ? "sparse" : "full", f.world, f.pairs_mean, f.requests_mean,
                    static_cast<long long>(f.requests_max), static_cast<long long>(f.keys),
                    static_cast<long long>(f.keys_held_most), f.sent_mean, f.received_mean,
                    f.received_mean / f.pairs_mean, f.ms);
    }
    // Requests and bytes per rank are a constant per pair (the table shows both): the
    // last row of each kind's requests and bytes per pair, times the pairs at scale.
    std::printf("  one of sx's TCP stores served %.0f requests/s to %d client threads (SET, GET, ERASE)\n", rate,
                rate_clients);
    for (bool sparse : {false, true}) {
        const RendezvousFigures *b = nullptr;
        for (const RendezvousFigures &f : rv)
            if (f.sparse == sparse) b = &f;
        if (b == nullptr) continue;
        // Full: 3 requests and one address per pair. Sparse: a request per pair and two of
        // its own key; each GET brings the peer's whole key, an address per pair of its:
        // about P^2 addresses. Both from the last row of the kind.
        const double P = b->pairs_mean;
        const double per_pair = sparse ? 1.0 : b->requests_mean / P;
        const double fixed = b->requests_mean - per_pair * P;
        const double got_per = sparse ? b->received_mean / (P * P) : b->received_mean / P;
        if (sparse)
            std::printf("  sparse mesh at scale (requests/rank = P + %.2f, received = %.1f P^2 B/rank; P, the pairs "
                        "per rank, from sparse_peers):\n",
                        fixed, got_per);
        else
            std::printf("  full mesh at scale (requests/rank = %.2f P, received = %.1f P B/rank; P = W - 1):\n",
                        per_pair, got_per);
        for (int w : opts_worlds) {
            const double pairs = sparse ? sparse_pairs_mean(w) : w - 1.0;
            const double req = fixed + per_pair * pairs, got = got_per * pairs * (sparse ? pairs : 1.0);
            std::printf("    %6d ranks: %6.1f pairs, %8.0f requests and %8.1f KiB per rank; %12.0f requests and "
                        "%9.1f MiB through rank 0's store: %8.1f s at the rate above\n",
                        w, pairs, req, got / 1024, req * w, got * w / kMiB, req * w / rate);
            std::printf("{\"bench\":\"scale\",\"figure\":\"gloo_rendezvous_at_scale\",\"mesh\":\"%s\","
                        "\"ranks\":%d,\"pairs_per_rank\":%.2f,\"requests_per_rank\":%.0f,"
                        "\"requests_through_rank0\":%.0f,\"store_rate\":%.0f,\"seconds\":%.2f}\n",
                        sparse ? "sparse" : "full", w, pairs, req, req * w, rate, req * w / rate);
        }
    }
    for (const RendezvousFigures &f : rv) {
        std::printf("{\"bench\":\"scale\",\"figure\":\"gloo_rendezvous\",\"mesh\":\"%s\",\"ranks\":%d,"
                    "\"pairs_per_rank\":%.2f,\"requests_per_rank\":%.1f,"
                    "\"requests_max\":%lld,\"keys\":%lld,\"keys_held_most\":%lld,\"sent_bytes_per_rank\":%.0f,"
                    "\"received_bytes_per_rank\":%.0f,\"ms\":%.1f}\n",
                    f.sparse ? "sparse" : "full", f.world, f.pairs_mean, f.requests_mean,
                    static_cast<long long>(f.requests_max), static_cast<long long>(f.keys),
                    static_cast<long long>(f.keys_held_most), f.sent_mean, f.received_mean, f.ms);
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
    for (int world : {2, 4, 8, 16, 32}) rv.push_back(gloo_rendezvous(world, false));
    for (int world : {2, 4, 8, 16, 32, 64, 128}) rv.push_back(gloo_rendezvous(world, true));
    constexpr int kRateClients = 64;
    const double rate = store_rate(kRateClients, 2.0);

    print_saves(saves, model, opt);
    print_loads(loads, opt);
    print_rendezvous(rv, opt.scale_worlds, rate, kRateClients);
    std::printf("  (saves and loads took %.1f s in all, including the writers' plans and the search for the "
                "loading rank)\n",
                simulated);
    return 0;
}

}  // namespace sxbench
