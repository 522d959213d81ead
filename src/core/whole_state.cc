// The whole-state exchange part (whole_state.h).
#include "core/whole_state.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <array>
#include <cstring>

#include "base/half.h"
#include "base/vector_state.h"
#include "optim/state_codec.h"

namespace sx {
namespace core {
namespace {

constexpr const char *kMaster = "master";
constexpr size_t kMessageBytes = 1024;

// Unit u's shard of state slot `slot` (-1: the masters).
float *state_pointer(const UnitShard &unit, int slot) { return slot < 0 ? unit.values : unit.state[slot]; }

// The slots a unit keeps once every param of it is trainable: the most its params'
// optimizers keep.
int slots_when_trainable(const ShardAccess &g, size_t u) {
    int slots = 0;
    for (int32_t p : g.layout().units()[u].params)
        slots = std::max(slots, optim::state_slots(g.hyper(g.param(p).group), static_cast<int>(g.param(p).shape.size())));
    return slots;
}

// The progress a scatter restores: the root's step counts (per param: step,
// momentum_steps, mu_product's bits) over `base`. NAdam's mu_product as the root's
// callback gave it; where it left 0, from the step count with the group's beta1 and
// momentum_decay (torch's value unless those changed during training), computed once per
// group and step count.
ShardProgress scattered_progress(const ShardAccess &g, const ShardProgress &base, const std::vector<int64_t> &steps) {
    ShardProgress progress = base;
    std::map<std::pair<int32_t, int64_t>, float> derived;
    for (size_t p = 0; p < progress.params.size(); ++p) {
        const int32_t group = g.param(static_cast<int32_t>(p)).group;
        const optim::Hyper &h = g.hyper(group);
        const int64_t step = steps[3 * p];
        float mu_product = 1.0f;
        const uint32_t bits = static_cast<uint32_t>(steps[3 * p + 2]);
        std::memcpy(&mu_product, &bits, sizeof mu_product);
        if (optim::spec_of(h.kind).param_scalar == nullptr) {
            mu_product = 1.0f;
        } else if (mu_product == 0.0f) {
            const auto key = std::make_pair(group, step);
            const auto found = derived.find(key);
            mu_product = found != derived.end() ? found->second : (derived[key] = optim::mu_product_after(h, step));
        }
        progress.params[p].step = step;
        progress.params[p].momentum_steps = steps[3 * p + 1];
        progress.params[p].mu_product = mu_product;
    }
    // The whole state is per param; an optimizer that counts steps per group (kGroup) takes
    // the most any of its params has had: its group's count but where every param of the
    // group sat out steps while it counted on.
    for (size_t grp = 0; grp < progress.group_steps.size(); ++grp) {
        if (optim::spec_of(g.hyper(static_cast<int32_t>(grp)).kind).step_count != optim::StepCount::kGroup) continue;
        int64_t most = 0;
        for (size_t p = 0; p < progress.params.size(); ++p)
            if (g.param(static_cast<int32_t>(p)).group == static_cast<int32_t>(grp)) most = std::max(most, progress.params[p].step);
        progress.group_steps[grp] = most;
    }
    return progress;
}

}  // namespace

std::vector<StateTensor> state_tensors(const ShardAccess &g, const UnitShard &unit, int32_t p, bool as_if_allocated) {
    std::vector<StateTensor> t;
    const optim::Hyper &h = g.hyper(g.param(p).group);
    const int ndim = static_cast<int>(g.param(p).shape.size());
    const int slots = optim::state_slots(h, ndim);
    // A unit's state exists once it has been trainable; it has the most slots any of its
    // params' optimizers keeps.
    if (as_if_allocated || (unit.state_slots > 0 && unit.state_slots >= slots))
        for (int k = 0; k < slots; ++k) t.push_back({optim::state_slot_name(h, k, ndim), k});
    if (unit.master) t.push_back({kMaster, -1});
    return t;
}

WholeTensorSizes whole_tensor_sizes(const ShardAccess &g, int32_t p) {
    const ParamSpec &spec = g.param(p);
    WholeTensorSizes w;
    w.row = optim::spec_of(g.hyper(spec.group).kind).whole_tensors;
    for (int t = 0; t < w.count(); ++t) w.numel[t] = w.row->numel(t, spec.shape);
    return w;
}

namespace {

// This rank's piece of param p in a unit of packed state (UnitShard::pieces), or null: a
// unit of fp32 state, or a param of which this rank holds nothing.
const StatePiece *packed_piece(const UnitShard &unit, int32_t p) {
    for (const StatePiece &sp : unit.pieces)
        if (sp.param == p) return &sp;
    return nullptr;
}

}  // namespace

// Packed state as the whole-state calls carry it: fp32, through host memory.
//
// Decoding is the step's: a bf16 value widened (exact), an 8-bit code's map value times
// its block's scale (optim::decode_block, what the kernels compute). Encoding is the
// step's too, with one refinement: bf16 is rounded to nearest even (half.h, the kernels'
// narrow_bf16), and 8-bit blocks take optim::encode_decoded_block, which is
// optim::encode_block (the reference the kernels' encoders are tested against) for any
// values but those a decoding gave, which get back the codes and scale they were decoded
// from. Blocks follow the param, and every shard of an 8-bit param starts on a block
// boundary, so a rank's piece holds whole blocks and encodes them alone.
//
// Decoding then encoding gives back the same bytes. bf16: a widened value is exactly
// representable, so rounding it again is the identity. 8-bit: where a block's largest
// magnitude was positive (or the map unsigned), that element's quotient was exactly 1,
// whose code is the map's last (1.0): it decodes to exactly the scale s, no decoded value
// exceeds s in magnitude (|map| <= 1), so encode_block finds the same scale; each decoded
// value m * s (rounded once), divided by s again, lies within two ulps of m, far nearer m
// than the half-way point to a neighbouring entry (the maps' entries are distinct and
// at least 0.35% apart relative to their size), so it takes the code it came from. Where
// the largest magnitude was negative under the signed map, whose lowest entry is
// -0.99297, not -1, encode_block would take a smaller scale; encode_decoded_block then
// finds s from that element and keeps it where the codes under it decode exactly to the
// values (state_codec.h). A NaN block decodes to NaN everywhere and encodes back to a NaN
// scale with every code 0, as the step left it. A block never updated (scale 0, codes 0)
// comes back as it was under the signed map; under the unsigned map it decodes to +0.0
// as a block of zeros after a step does, and takes that block's scale (1e-12): the same
// values in other bytes.
class PieceCodec {
  public:
    explicit PieceCodec(DeviceOps &ops) : ops_(ops) {}
    // Room for pieces of up to n elements.
    Status reserve(uint64_t n) {
        try {
            values_.resize(n);
            packed_.resize(n * sizeof(float));
            scales_.resize(n / optim::kQuantBlock + 1);
        } catch (const std::bad_alloc &) {
            return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %llu bytes of host memory to convert packed optimizer "
                            "state failed", static_cast<unsigned long long>(n * 9));
        }
        return Status::Ok();
    }
    // Slot `bytes` (and 8-bit `scales`) of a unit's shard: piece sp as fp32 into out
    // (sp.n floats in the state's memory).
    Status decode(const StatePiece &sp, const void *bytes, const float *scales, const float *map, float *out) {
        const char *from = static_cast<const char *>(bytes) + sp.byte_offset;
        if (sp.dtype == SX_STATE_FP32) return ops_.copy(out, from, sp.n * sizeof(float));
        SX_TRY(ops_.to_host(packed_.data(), from, sp.n * optim::state_elem_bytes(sp.dtype)));
        if (sp.dtype == SX_STATE_BF16) {
            half::to_f32(SX_DTYPE_BF16, reinterpret_cast<const uint16_t *>(packed_.data()), values_.data(), sp.n);
        } else {
            SX_TRY(ops_.to_host(scales_.data(), scales + sp.scale_offset, blocks(sp) * sizeof(float)));
            for (uint64_t b = 0; b < blocks(sp); ++b)
                optim::decode_block(packed_.data() + b * optim::kQuantBlock, optim::kQuantBlock, scales_[b], map,
                                    values_.data() + b * optim::kQuantBlock);
        }
        return ops_.from_host(out, values_.data(), sp.n * sizeof(float));
    }
    // The reverse: sp.n fp32 values `in` (the state's memory) into piece sp of slot
    // `bytes` and, 8-bit, of `scales`.
    Status encode(const StatePiece &sp, const float *in, const float *map, void *bytes, float *scales) {
        char *to = static_cast<char *>(bytes) + sp.byte_offset;
        if (sp.dtype == SX_STATE_FP32) return ops_.copy(to, in, sp.n * sizeof(float));
        SX_TRY(ops_.to_host(values_.data(), in, sp.n * sizeof(float)));
        if (sp.dtype == SX_STATE_BF16) {
            half::from_f32(SX_DTYPE_BF16, values_.data(), reinterpret_cast<uint16_t *>(packed_.data()), sp.n);
        } else {
            for (uint64_t b = 0; b < blocks(sp); ++b)
                scales_[b] = optim::encode_decoded_block(values_.data() + b * optim::kQuantBlock, optim::kQuantBlock,
                                                         map, packed_.data() + b * optim::kQuantBlock);
            SX_TRY(ops_.from_host(scales + sp.scale_offset, scales_.data(), blocks(sp) * sizeof(float)));
        }
        return ops_.from_host(to, packed_.data(), sp.n * optim::state_elem_bytes(sp.dtype));
    }

  private:
    static uint64_t blocks(const StatePiece &sp) { return sp.dtype == SX_STATE_8BIT ? sp.n / optim::kQuantBlock : 0; }
    DeviceOps &ops_;
    std::vector<float> values_;
    std::vector<uint8_t> packed_;
    std::vector<float> scales_;
};

namespace {

// The map of slot `slot` of param p's 8-bit state (StateSlot::nonnegative: unsigned).
const float *slot_map(const ShardAccess &g, int32_t p, int slot) {
    const ParamSpec &spec = g.param(p);
    return optim::state_slot_nonnegative(g.hyper(spec.group), slot, static_cast<int>(spec.shape.size()))
               ? optim::kUnsignedMap
               : optim::kSignedMap;
}

// The most elements of any param's piece of packed state on this rank (what a codec
// and the fp32 copy of one param's pieces must hold, per tensor).
uint64_t largest_packed_piece(const std::vector<UnitShard> &units) {
    uint64_t most = 0;
    for (const UnitShard &unit : units)
        for (const StatePiece &sp : unit.pieces) most = std::max(most, sp.n);
    return most;
}

// Where this rank's own piece of each of param p's tensors is, as fp32 in the state's
// memory: in place (fp32 state, the masters), or decoded from a packed slot into
// `scratch` (tensor t's at t times the piece's length).
Status own_fp32(const ShardAccess &g, PieceCodec &codec, const UnitShard &unit, int32_t p,
                const std::vector<StateTensor> &tensors, float *scratch, std::vector<float *> *at) {
    const ShardPiece piece = g.layout().piece(p, g.shard_rank());
    const StatePiece *sp = packed_piece(unit, p);
    at->clear();
    for (size_t t = 0; t < tensors.size(); ++t) {
        const int slot = tensors[t].slot;
        if (slot < 0 || unit.pieces.empty()) {
            at->push_back(state_pointer(unit, slot) + piece.shard_offset);
        } else if (sp == nullptr) {
            at->push_back(scratch);  // this rank holds none of the param: nothing is read there
        } else {
            at->push_back(scratch + t * sp->n);
            SX_TRY(codec.decode(*sp, unit.state[slot], unit.scales[slot], slot_map(g, p, slot), at->back()));
        }
    }
    return Status::Ok();
}

// The tensors param p keeps whole, each values[t] of counts[t] elements, added to st's.
void add_whole(ParamState *st, const WholeTensorSizes &w, float *const *values, const uint64_t *counts) {
    for (int t = 0; t < w.count(); ++t) {
        st->names.push_back(w.row->names[t]);
        st->tensors.push_back(values[t]);
        st->numels.push_back(counts[t]);
    }
}

// The tensors kept whole in a scatter: every param's that has them, one after another;
// the root's callback fills them, and every rank takes them whole.
class ScatteredWhole {
  public:
    explicit ScatteredWhole(const ShardAccess &g) : g_(g), at_(static_cast<size_t>(g.num_params()) + 1, 0) {
        for (int32_t p = 0; p < g.num_params(); ++p)
            at_[static_cast<size_t>(p) + 1] = at_[static_cast<size_t>(p)] + whole_tensor_sizes(g, p).total();
        values_.assign(at_.back(), 0.0f);
    }
    std::vector<float> &values() { return values_; }
    // The root: param p's whole tensors among st's (zero for its callback to fill).
    void offer(int32_t p, ParamState *st) {
        const WholeTensorSizes w = whole_tensor_sizes(g_, p);
        if (!w.any()) return;
        float *values[optim::kMaxWholeTensors] = {};
        float *at = here(p);
        for (int t = 0; t < w.count(); at += w.numel[t], ++t) values[t] = at;
        add_whole(st, w, values, w.numel);
    }
    // The root, after the callback: every value one its tensor may hold.
    Status check(int32_t p, const char *name) const {
        const WholeTensorSizes w = whole_tensor_sizes(g_, p);
        const float *m = values_.data() + at_[static_cast<size_t>(p)];
        for (int t = 0; t < w.count(); m += w.numel[t], ++t)
            for (uint64_t i = 0; i < w.numel[t]; ++i)
                SX_CHECK_ARG(w.row->valid(m[i]), "param '%s': %s[%llu] is %g; %s", name, w.row->names[t],
                             static_cast<unsigned long long>(i), static_cast<double>(m[i]), w.row->rule);
        return Status::Ok();
    }
    // Every rank, once they are broadcast: each param's whole tensors into the progress.
    void into(ShardProgress *progress) const {
        for (int32_t p = 0; p < g_.num_params(); ++p) {
            const WholeTensorSizes w = whole_tensor_sizes(g_, p);
            ParamProgress &pp = progress->params[static_cast<size_t>(p)];
            const float *m = values_.data() + at_[static_cast<size_t>(p)];
            for (int t = 0; t < optim::kMaxWholeTensors; m += w.numel[t], ++t) pp.whole(t).assign(m, m + w.numel[t]);
        }
    }

  private:
    float *here(int32_t p) { return values_.data() + at_[static_cast<size_t>(p)]; }
    const ShardAccess &g_;
    std::vector<uint64_t> at_;
    std::vector<float> values_;
};

// The root's checks of what its callback gave for a param: the rules a checkpoint's
// manifest is held to, so that what is scattered in can be saved and stepped on.
Status check_scattered(const ParamState &st, const ScatteredWhole &whole) {
    SX_CHECK_ARG(optim::valid_steps(st.step, st.momentum_steps),
                 "param '%s': step %lld and momentum_steps %lld; they must satisfy 0 <= momentum_steps <= step <= %llu",
                 st.name, static_cast<long long>(st.step), static_cast<long long>(st.momentum_steps),
                 static_cast<unsigned long long>(optim::kMaxSteps));
    return whole.check(st.param, st.name);
}
}  // namespace

Status WholeState::root_buffers(int root, const std::vector<UnitShard> &units, bool as_if_allocated, Buffer *staging,
                                std::vector<float> *host) {
    if (g_.rank() != root) return Status::Ok();
    uint64_t most = 0;
    for (int32_t p = 0; p < g_.num_params(); ++p) {
        const UnitShard &unit = units[static_cast<size_t>(g_.layout().placement(p).unit_index)];
        most = std::max<uint64_t>(most, state_tensors(g_, unit, p, as_if_allocated).size() * g_.param(p).numel);
    }
    if (most == 0) return Status::Ok();
    SX_TRY(g_.state_ops().allocate(most * sizeof(float), "one param's whole optimizer state", staging, true));
    if (g_.state_ops().device() != SX_DEVICE_CPU) {
        try {
            host->resize(most);
        } catch (const std::bad_alloc &) {
            return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %llu bytes of host memory for one param's whole "
                            "optimizer state failed", static_cast<unsigned long long>(most * sizeof(float)));
        }
    }
    return Status::Ok();
}

Status WholeState::share_outcome(int root, Status mine, const char *what) {
    // Every rank's code, the worst wins; root's words go to everyone.
    uint64_t code = static_cast<uint64_t>(mine.code());
    std::vector<char> text(kMessageBytes, 0);
    if (g_.rank() == root) std::snprintf(text.data(), kMessageBytes, "%s", mine.message().c_str());
    if (mesh_.world) {
        Status s = mesh_.world->all_reduce_max(&code, 1);
        if (s.ok()) s = mesh_.world->broadcast(text.data(), kMessageBytes, root);
        if (!s.ok()) return g_.fail(s);
    }
    if (!mine.ok()) return mine;
    if (code == 0) return Status::Ok();
    if (text[0]) return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on rank %d (the root): %s", what, root,
                                 text.data());
    return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on another rank (%s); nothing changed", what,
                    sx_status_string(static_cast<sx_status_t>(code)));
}

Status WholeState::gather(int root, const StateFn &fn) {
    ShardState shard;
    Buffer staging, pieces;
    std::vector<float> host;
    PieceCodec codec(g_.state_ops());
    // The shard as it stands, with the masters of 16-bit units derived (what is gathered).
    Status local = g_.export_shard(&shard);
    if (local.ok()) local = root_buffers(root, shard.units, false, &staging, &host);
    if (local.ok()) local = packed_scratch(shard.units, &codec, &pieces);
    SX_TRY(share_outcome(root, local, "sx_gather_optim_state"));

    // The root's shard group holds every shard: its ranks alone send (the other replica
    // groups have nothing to do but the outcome's exchange).
    const int rank = g_.rank(), S = g_.shard_size(), root_shard = root % S;
    DeviceOps &ops = g_.state_ops();
    Status outcome;  // the root's callback's, once it fails no more calls are made
    for (int32_t p = 0; p < g_.num_params() && in_root_group(root); ++p) {
        const size_t u = static_cast<size_t>(g_.layout().placement(p).unit_index);
        const UnitShard &unit = shard.units[u];
        const std::vector<StateTensor> tensors = state_tensors(g_, unit, p, false);
        const ParamSpec &spec = g_.param(p);
        const uint64_t n = spec.numel;
        float *full = staging.as<float>();
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(rank == root ? static_cast<size_t>(S) : 0);
        std::vector<float *> here;  // this rank's piece of each tensor, as fp32
        Status decoded = own_fp32(g_, codec, unit, p, tensors, pieces.as<float>(), &here);
        if (!decoded.ok()) return g_.fail(decoded);
        for (int q = 0; q < S && !tensors.empty(); ++q) {
            const ShardPiece piece = g_.layout().piece(p, q);
            const size_t bytes = (piece.end - piece.begin) * sizeof(float);
            for (size_t t = 0; t < tensors.size(); ++t) {
                float *at = here[t];
                if (q == g_.shard_rank() && rank != root) mine.push_back({at, bytes});
                if (rank == root && q != root_shard) theirs[q].push_back({full + t * n + piece.begin, bytes});
                if (rank == root && q == root_shard && bytes) {
                    Status s = ops.copy(full + t * n + piece.begin, at, bytes);
                    if (!s.ok()) return g_.fail(s);
                }
            }
        }
        if (S > 1 && !tensors.empty()) {
            Status s = mesh_.shard->gather_pieces(mine, theirs, root_shard);
            if (!s.ok()) return g_.fail(s);
        }
        if (rank != root || !outcome.ok()) continue;
        float *data = full;
        if (!host.empty() && !tensors.empty()) {
            Status s = ops.to_host(host.data(), full, tensors.size() * n * sizeof(float));
            if (!s.ok()) return g_.fail(s);
            data = host.data();
        }
        ParamState st = gathered(p, tensors, data, shard.progress.params[static_cast<size_t>(p)]);
        leave_vector_state_clean();  // the trainer's code runs next, on this thread
        outcome = catching([&] { return fn(st); });
    }
    return share_outcome(root, outcome, "sx_gather_optim_state");
}

// What the root's callback sees of param p: its step counts, its tensors (data: each
// numel fp32 in host memory), and the tensors kept whole on every rank (the root's own,
// once the param has been updated: empty until then).
ParamState WholeState::gathered(int32_t p, const std::vector<StateTensor> &tensors, float *data, ParamProgress &own) {
    const ParamSpec &spec = g_.param(p);
    const uint64_t n = spec.numel;
    ParamState st;
    st.param = p;
    st.group = spec.group;
    st.name = spec.name.c_str();
    st.numel = n;
    st.step = spec.step;
    st.momentum_steps = spec.momentum_steps;
    if (optim::spec_of(g_.hyper(spec.group).kind).param_scalar) st.mu_product = spec.mu_product;
    for (size_t t = 0; t < tensors.size(); ++t) {
        st.names.push_back(tensors[t].name);
        st.tensors.push_back(data + t * n);
        st.numels.push_back(n);
    }
    const WholeTensorSizes w = whole_tensor_sizes(g_, p);
    if (w.any() && !own.whole(0).empty()) {
        float *values[optim::kMaxWholeTensors] = {};
        uint64_t counts[optim::kMaxWholeTensors] = {};
        for (int t = 0; t < w.count(); ++t) values[t] = own.whole(t).data(), counts[t] = own.whole(t).size();
        add_whole(&st, w, values, counts);
    }
    return st;
}

Status WholeState::scatter(int root, const StateFn &fn) {
    ShardState shard;
    SX_TRY(share_outcome(root, g_.export_shard(&shard), "sx_scatter_optim_state"));
    Targets targets;
    PieceCodec codec(g_.state_ops());
    SX_TRY(share_outcome(root, catching([&] { return allocate_targets(root, shard.units, &codec, &targets); }),
                         "sx_scatter_optim_state"));
    std::vector<std::array<Buffer, 3>> &state = targets.state;
    std::vector<Buffer> &masters = targets.masters;
    std::vector<float> &host = targets.host;
    DeviceOps &ops = g_.state_ops();

    const int rank = g_.rank();
    Status outcome;  // the root's callback's, once it fails the root sends zeros
    // Per param: step, momentum_steps, and mu_product's bits (0: derive it from the step).
    std::vector<int64_t> steps(3 * static_cast<size_t>(g_.num_params()), 0);
    ScatteredWhole whole(g_);
    for (int32_t p = 0; p < g_.num_params(); ++p) {
        const size_t u = static_cast<size_t>(g_.layout().placement(p).unit_index);
        const std::vector<StateTensor> tensors = state_tensors(g_, shard.units[u], p, true);
        if (tensors.empty() && rank != root) continue;
        const ParamSpec &spec = g_.param(p);
        const uint64_t n = spec.numel;
        float *full = targets.staging.as<float>();
        if (rank == root) {
            // The root's callback fills the param's whole state (zero where it writes nothing).
            float *data = host.empty() ? full : host.data();
            if (!tensors.empty()) std::memset(data, 0, tensors.size() * n * sizeof(float));
            ParamState st;
            st.param = p;
            st.group = spec.group;
            st.name = spec.name.c_str();
            st.numel = n;
            for (size_t t = 0; t < tensors.size(); ++t) {
                st.names.push_back(tensors[t].name);
                st.tensors.push_back(data + t * n);
                st.numels.push_back(n);
            }
            whole.offer(p, &st);
            leave_vector_state_clean();  // the trainer's code runs next, on this thread
            if (outcome.ok()) outcome = catching([&] { return fn(st); });
            if (outcome.ok()) outcome = check_scattered(st, whole);
            steps[3 * p] = st.step;
            steps[3 * p + 1] = st.momentum_steps;
            uint32_t bits = 0;
            std::memcpy(&bits, &st.mu_product, sizeof bits);
            steps[3 * p + 2] = bits;
            if (!host.empty() && !tensors.empty()) {
                Status s = ops.from_host(full, host.data(), tensors.size() * n * sizeof(float));
                if (!s.ok()) return g_.fail(s);
            }
        }
        if (tensors.empty()) continue;
        SX_TRY(scatter_param(root, p, full, own_targets(shard.units[u], p, tensors, &targets)));
        SX_TRY(encode_own(shard.units[u], p, tensors, &codec, &targets));
    }
    SX_TRY(share_outcome(root, outcome, "sx_scatter_optim_state"));
    if (mesh_.world) {
        Status s = mesh_.world->broadcast(steps.data(), steps.size() * sizeof(int64_t), root);
        std::vector<float> &m = whole.values();
        if (s.ok() && !m.empty()) s = mesh_.world->broadcast(m.data(), m.size() * sizeof(float), root);
        if (!s.ok()) return g_.fail(s);
    }

    // Every rank has its pieces: they replace the shard (once a checkpoint's snapshot has
    // been copied out of it), with each param's step counts; 16-bit params take their
    // values from the new masters, on every rank.
    g_.shard_fence().wait_readers();
    ShardProgress progress = scattered_progress(g_, shard.progress, steps);
    whole.into(&progress);
    ShardRestore restore;
    restore.state = &state;
    restore.scales = &targets.scales;
    restore.slots = targets.slots;
    restore.masters = &masters;
    restore.progress = &progress;
    SX_TRY(g_.restore_shard(restore));
    const bool sixteen = std::any_of(shard.units.begin(), shard.units.end(), [](const UnitShard &v) { return v.master; });
    return sixteen ? g_.gather_params() : Status::Ok();
}

// Copies of this rank's shard to receive into: every slot any param's optimizer keeps,
// laid out as the unit's (UnitShard::slot_bytes, and a packed unit's scales), zero where
// the root leaves nothing (the units' padding, the gaps between packed pieces), and the
// masters; room to receive one param's packed pieces as fp32.
Status WholeState::allocate_targets(int root, const std::vector<UnitShard> &units, PieceCodec *codec, Targets *t) {
    const size_t nu = units.size();
    t->state.resize(nu);
    t->scales.resize(nu);
    t->slots.assign(nu, 0);
    t->masters.resize(nu);
    DeviceOps &ops = g_.state_ops();
    for (size_t u = 0; u < nu; ++u) {
        const uint64_t bytes = units[u].shard_numel * sizeof(float), scales = units[u].slot_scales * sizeof(float);
        t->slots[u] = std::max(units[u].state_slots, slots_when_trainable(g_, u));
        for (int k = 0; k < t->slots[u]; ++k) {
            SX_TRY(ops.allocate(units[u].slot_bytes, "a copy of the optimizer state to scatter into", &t->state[u][k]));
            SX_TRY(ops.zero(t->state[u][k].data(), units[u].slot_bytes));
            if (scales == 0) continue;
            SX_TRY(ops.allocate(scales, "a copy of the 8-bit optimizer state's scales to scatter into", &t->scales[u][k]));
            SX_TRY(ops.zero(t->scales[u][k].data(), scales));
        }
        if (units[u].master) {
            SX_TRY(ops.allocate(bytes, "a copy of the master weights to scatter into", &t->masters[u]));
            SX_TRY(ops.zero(t->masters[u].data(), bytes));
        }
    }
    SX_TRY(packed_scratch(units, codec, &t->pieces));
    return root_buffers(root, units, true, &t->staging, &t->host);
}

Status WholeState::packed_scratch(const std::vector<UnitShard> &units, PieceCodec *codec, Buffer *pieces) {
    const uint64_t most = largest_packed_piece(units);
    if (most == 0) return Status::Ok();
    SX_TRY(codec->reserve(most));
    return g_.state_ops().allocate(most * 3 * sizeof(float), "one param's packed optimizer state as fp32", pieces);
}

// Where this rank's own piece of each of param p's tensors is received: in place in the
// copy of an fp32 slot or of the masters, or as fp32 into the scratch for a packed slot
// (encode_own then encodes it into the slot's copy).
std::vector<float *> WholeState::own_targets(const UnitShard &unit, int32_t p, const std::vector<StateTensor> &tensors,
                                             Targets *t) {
    const size_t u = static_cast<size_t>(g_.layout().placement(p).unit_index);
    const uint64_t offset = g_.layout().piece(p, g_.shard_rank()).shard_offset;
    const StatePiece *sp = packed_piece(unit, p);
    std::vector<float *> own;
    for (size_t k = 0; k < tensors.size(); ++k) {
        const int slot = tensors[k].slot;
        if (slot < 0) own.push_back(t->masters[u].as<float>() + offset);
        else if (unit.pieces.empty()) own.push_back(t->state[u][slot].as<float>() + offset);
        else own.push_back(t->pieces.as<float>() + (sp ? k * sp->n : 0));  // none of it here: nothing lands
    }
    return own;
}

Status WholeState::encode_own(const UnitShard &unit, int32_t p, const std::vector<StateTensor> &tensors,
                              PieceCodec *codec, Targets *t) {
    const StatePiece *sp = packed_piece(unit, p);
    if (sp == nullptr) return Status::Ok();
    const size_t u = static_cast<size_t>(g_.layout().placement(p).unit_index);
    for (size_t k = 0; k < tensors.size(); ++k) {
        const int slot = tensors[k].slot;
        if (slot < 0) continue;
        Status s = codec->encode(*sp, t->pieces.as<float>() + k * sp->n, slot_map(g_, p, slot), t->state[u][slot].data(),
                                 t->scales[u][slot].empty() ? nullptr : t->scales[u][slot].as<float>());
        if (!s.ok()) return g_.fail(s);
    }
    return Status::Ok();
}

Status WholeState::scatter_param(int root, int32_t p, float *full, const std::vector<float *> &own) {
    // The root's shard group takes its pieces from the root; every other replica group's
    // rank then takes its shard's from the rank of the root's group with its shard index.
    const int rank = g_.rank(), S = g_.shard_size();
    const int root_shard = root % S, root_replica = root / S;
    const uint64_t n = g_.param(p).numel;
    std::vector<comm::Piece> mine;
    std::vector<std::vector<comm::Piece>> theirs(rank == root ? static_cast<size_t>(S) : 0);
    for (int q = 0; q < S; ++q) {
        const ShardPiece piece = g_.layout().piece(p, q);
        const size_t bytes = (piece.end - piece.begin) * sizeof(float);
        for (size_t t = 0; t < own.size(); ++t) {
            float *dst = own[t];
            if (q == g_.shard_rank()) mine.push_back({dst, bytes});
            if (rank == root && q != root_shard) theirs[q].push_back({full + t * n + piece.begin, bytes});
            if (rank == root && q == root_shard && bytes) {
                Status s = g_.state_ops().copy(dst, full + t * n + piece.begin, bytes);
                if (!s.ok()) return g_.fail(s);
            }
        }
    }
    if (S > 1 && in_root_group(root)) {
        const std::vector<comm::Piece> receive = rank == root ? std::vector<comm::Piece>() : mine;
        Status s = mesh_.shard->scatter_pieces(theirs, receive, root_shard);
        if (!s.ok()) return g_.fail(s);
    }
    for (const comm::Piece &piece : mine) {
        if (!mesh_.replica || piece.bytes == 0) continue;
        Status s = mesh_.replica->broadcast(piece.data, piece.bytes, root_replica);
        if (!s.ok()) return g_.fail(s);
    }
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
