// The units' memory on this rank (units.h).
#include "core/units.h"

#include "optim/custom.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <unordered_map>

namespace sx {
namespace core {
namespace {

const char *dtype_name(int32_t dtype) {
    return dtype == SX_DTYPE_F32 ? "fp32" : dtype == SX_DTYPE_F16 ? "fp16" : "bf16";
}

}  // namespace

void Units::configure(const Settings &settings, DeviceOps *ops, DeviceOps *state_ops, trace::Tracer *tracer,
                      const Table &table) {
    settings_ = settings;
    ops_ = ops;
    state_ops_ = state_ops ? state_ops : ops;
    tracer_ = tracer;
    table_ = table;
}

void Units::append(std::vector<Unit> *added) {
    for (Unit &unit : *added) units_.push_back(std::move(unit));
    added->clear();
}

void Units::count_bytes(uint64_t *params, uint64_t *grads, uint64_t *optimizer, uint64_t *unsharded,
                        uint64_t *device) const {
    const auto add = [device](uint64_t *category, const Buffer &b) {
        *category += b.size();
        if (b.on_device()) *device += b.size();
    };
    for (size_t u = 0; u < units_.size(); ++u) {
        const Unit &unit = units_[u];
        add(params, unit.params);
        add(params, unit.own);
        add(params, unit.host_params);
        add(grads, unit.grads);
        add(grads, unit.accum);
        // fp32 master weights count as optimizer state, as in ZeRO's accounting.
        add(optimizer, unit.master);
        for (int k = 0; k < unit.state_slots; ++k) {
            add(optimizer, unit.state[k]);
            add(optimizer, unit.scales[k]);
            add(optimizer, unit.state_next[k]);
        }
        add(optimizer, unit.undo);
        // An offloaded fp32 unit's host copy of its values is no master that one process
        // would keep.
        const uint64_t numel = table_.layout->units()[u].numel;
        const bool master = unit.dtype != SX_DTYPE_F32 && !unit.master.empty();
        *unsharded += (master ? 1 : 0) * numel * sizeof(float);
        if (unit.state_pieces.empty()) {
            *unsharded += static_cast<uint64_t>(unit.state_slots) * numel * sizeof(float);
            continue;
        }
        for (int32_t p : table_.layout->units()[u].params) {  // packed: each param's slots as one process keeps them
            const ParamSpec &spec = (*table_.params)[p];
            const int32_t dtype = param_state_dtype(spec, (*table_.groups)[spec.group]);
            const uint64_t scales = dtype == SX_STATE_8BIT ? spec.numel / optim::kQuantBlock * sizeof(float) : 0;
            *unsharded += static_cast<uint64_t>(unit.state_slots) * (spec.numel * optim::state_elem_bytes(dtype) + scales);
        }
    }
    add(grads, reduce_scratch_);
    add(grads, device_sum_[0]);
    add(grads, device_sum_[1]);
    add(grads, host_sum_);
}

Status Units::check_dtypes() const {
    // One flat buffer holds one dtype.
    std::unordered_map<int32_t, int32_t> first_of_unit;
    for (size_t i = 0; i < table_.params->size(); ++i) {
        auto it = first_of_unit.emplace((*table_.params)[i].unit, static_cast<int32_t>(i)).first;
        const ParamSpec &first = (*table_.params)[it->second];
        SX_CHECK_ARG(first.dtype == (*table_.params)[i].dtype,
                     "unit %d mixes dtypes: param '%s' is %s but param '%s' is %s; the params of a unit "
                     "share one flat buffer and so one dtype",
                     (*table_.params)[i].unit, first.name.c_str(), dtype_name(first.dtype), (*table_.params)[i].name.c_str(),
                     dtype_name((*table_.params)[i].dtype));
    }
    return check_stochastic_round();
}

Status Units::check_stochastic_round() const {
    // bf16_stochastic_round is a unit's way of keeping its values: every param of the unit
    // takes it, and every one is bf16.
    std::unordered_map<int32_t, int32_t> first_of_unit;
    for (size_t i = 0; i < table_.params->size(); ++i) {
        const ParamSpec &spec = (*table_.params)[i];
        const bool sr = (*table_.groups)[spec.group].hyper.bf16_stochastic_round;
        SX_CHECK_ARG(!sr || spec.dtype == SX_DTYPE_BF16,
                     "param '%s' is %s, but its param group %d has bf16_stochastic_round = 1, which takes bf16 "
                     "params only",
                     spec.name.c_str(), dtype_name(spec.dtype), spec.group);
        const ParamSpec &first = (*table_.params)[first_of_unit.emplace(spec.unit, static_cast<int32_t>(i)).first->second];
        const bool first_sr = (*table_.groups)[first.group].hyper.bf16_stochastic_round;
        SX_CHECK_ARG(sr == first_sr,
                     "unit %d mixes params with and without bf16_stochastic_round: param '%s' (param group %d) %s it, "
                     "param '%s' (param group %d) %s; a unit keeps fp32 masters for all its params or for none",
                     spec.unit, first.name.c_str(), first.group, first_sr ? "takes it" : "does not",
                     spec.name.c_str(), spec.group, sr ? "takes it" : "does not");
    }
    return Status::Ok();
}

Units::UnitBuffers Units::buffers_of(const UnitLayout &ul) const {
    UnitBuffers b;
    const ParamSpec &first = (*table_.params)[ul.params[0]];
    b.dtype = first.dtype;
    b.stochastic_round = (*table_.groups)[first.group].hyper.bf16_stochastic_round;
    b.grad_dtype = settings_.grad_dtype ? settings_.grad_dtype : b.dtype;
    const uint64_t dsize = dtype_size(b.dtype);
    // Stage 3 keeps this rank's shard of the params; the whole exists only while gathered.
    b.params = (settings_.stage == 3 ? ul.shard_numel : ul.padded_numel) * dsize;
    b.grads = ul.padded_numel * dtype_size(b.grad_dtype);
    // Offloaded, every unit's fp32 values are on the host (the masters), the 16-bit ones'
    // rounded params beside them. (No masters for bf16_stochastic_round units, offloaded
    // or not: their bf16 params are their values.)
    b.has_master = !b.stochastic_round && (b.dtype != SX_DTYPE_F32 || settings_.offload);
    b.master = b.has_master ? ul.shard_numel * sizeof(float) : 0;
    b.has_host_params = b.dtype != SX_DTYPE_F32 && settings_.offload && !own_on_host();
    b.host_params = b.has_host_params ? ul.shard_numel * dsize : 0;
    return b;
}

Status Units::allocate(const Layout &layout, size_t first, std::vector<Unit> *added) const {
    added->resize(layout.units().size() - first);
    for (size_t k = 0; k < added->size(); ++k) {
        const UnitLayout &ul = layout.units()[first + k];
        Unit &unit = (*added)[k];
        // Elements are bounded (2^62 per param) but a unit's byte size may still not fit
        // in 64 bits; wrapped around, it would allocate a tiny buffer behind a huge view.
        SX_CHECK(ul.padded_numel <= SIZE_MAX / sizeof(float), SX_ERR_OUT_OF_MEMORY,
                 "unit %d holds %llu elements, more bytes than this machine can address", ul.unit_id,
                 static_cast<unsigned long long>(ul.padded_numel));
        const UnitBuffers b = buffers_of(ul);
        unit.dtype = b.dtype;
        unit.stochastic_round = b.stochastic_round;
        unit.grad_dtype = b.grad_dtype;
        if (settings_.stage == 3)
            SX_TRY((own_on_host() ? state_ops_ : ops_)->allocate(b.params, "a param shard", &unit.own));
        else
            SX_TRY(ops_->allocate(b.params, "a flat param buffer", &unit.params, false, settings_.exchanged));
        SX_TRY(ops_->allocate(b.grads, "a flat grad buffer", &unit.grads, false, settings_.exchanged));
        if (b.has_master) SX_TRY(state_ops_->allocate(b.master, "fp32 master weights", &unit.master));
        if (b.has_host_params)
            SX_TRY(state_ops_->allocate(b.host_params, "the params' shard on the host", &unit.host_params));
    }
    return Status::Ok();
}

uint64_t Units::planned_bytes(const Layout &layout, size_t first, const std::vector<uint8_t> &trainable) const {
    uint64_t total = 0;
    for (size_t u = first; u < layout.units().size(); ++u) {
        const UnitLayout &ul = layout.units()[u];
        total += buffers_of(ul).total();
        int slots = 0;
        for (int32_t p : ul.params) {
            if (static_cast<size_t>(p) >= trainable.size() || !trainable[p]) continue;
            const ParamSpec &spec = (*table_.params)[p];
            slots = std::max(slots, optim::state_slots((*table_.groups)[spec.group].hyper,
                                                       static_cast<int>(spec.shape.size())));
        }
        uint64_t slot_bytes = 0, scales = 0;
        state_pieces_of(layout, settings_.shard_rank, u, *table_.params, *table_.groups, &slot_bytes, &scales);
        total += static_cast<uint64_t>(slots) * (slot_bytes + scales * sizeof(float));
    }
    return total;
}

std::vector<StatePiece> state_pieces_of(const Layout &layout, int shard, size_t u, const std::deque<ParamSpec> &params,
                                        const std::vector<ParamGroup> &groups, uint64_t *bytes, uint64_t *scales) {
    const UnitLayout &ul = layout.units()[u];
    std::vector<StatePiece> pieces;
    bool packed = false;
    for (int32_t p : ul.params) packed = packed || param_state_dtype(params[p], groups[params[p].group]) != SX_STATE_FP32;
    *bytes = packed ? 0 : ul.shard_numel * sizeof(float);
    *scales = 0;
    if (!packed) return pieces;
    for (int32_t p : ul.params) {
        const ShardPiece sp = layout.piece(p, shard);
        if (sp.begin == sp.end) continue;
        StatePiece piece;
        piece.param = p;
        piece.dtype = param_state_dtype(params[p], groups[params[p].group]);
        piece.shard_offset = sp.shard_offset;
        piece.n = sp.end - sp.begin;
        // Each piece starts 64-byte aligned, as the kernels' dense slots do.
        piece.byte_offset = (*bytes + 63) / 64 * 64;
        piece.scale_offset = *scales;
        *bytes = piece.byte_offset + piece.n * optim::state_elem_bytes(piece.dtype);
        if (piece.dtype == SX_STATE_8BIT) *scales += piece.n / optim::kQuantBlock;
        pieces.push_back(piece);
    }
    return pieces;
}

std::vector<StatePiece> Units::state_pieces(size_t u, uint64_t *bytes, uint64_t *scales) const {
    return state_pieces_of(*table_.layout, settings_.shard_rank, u, *table_.params, *table_.groups, bytes, scales);
}

Status Units::allocate_slots(size_t u, int need, Buffer *state, Buffer *scales,
                             std::vector<StatePiece> *pieces) const {
    uint64_t slot_bytes = 0, count = 0;
    *pieces = state_pieces(u, &slot_bytes, &count);
    for (int k = units_[u].state_slots; k < need; ++k) {
        SX_TRY(state_ops_->allocate(slot_bytes, "optimizer state", &state[k]));
        if (count > 0) SX_TRY(state_ops_->allocate(count * sizeof(float), "8-bit optimizer state's scales", &scales[k]));
    }
    return Status::Ok();
}

int Units::required_slots(size_t u, const std::vector<uint8_t> &mask) const {
    int slots = 0;
    for (int32_t p : table_.layout->units()[u].params)
        if (mask[p]) {
            const ParamSpec &spec = (*table_.params)[p];
            slots = std::max(slots, optim::state_slots((*table_.groups)[spec.group].hyper, static_cast<int>(spec.shape.size())));
        }
    return slots;
}

Status Units::prepare(const std::vector<uint8_t> &mask, bool accumulate) {
    // Allocate everything first into temporaries, so that a failed allocation
    // changes nothing.
    struct Pending {
        size_t unit;
        int slots;
        Buffer state[3], scales[3];
        std::vector<StatePiece> pieces;
        Buffer accum;
    };
    std::vector<Pending> pending;
    std::vector<char> trainable(units_.size(), 0);  // under `mask`
    for (size_t u = 0; u < units_.size(); ++u)
        for (int32_t p : table_.layout->units()[u].params) trainable[u] |= mask[p] != 0;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!trainable[u]) continue;
        const int need = required_slots(u, mask);
        const bool need_accum = needs_accum(u, accumulate) && units_[u].accum.empty();
        if (need <= units_[u].state_slots && !need_accum) continue;
        pending.emplace_back();
        Pending &pd = pending.back();
        pd.unit = u;
        pd.slots = std::max(need, units_[u].state_slots);
        const uint64_t bytes = table_.layout->units()[u].shard_numel * sizeof(float);
        SX_TRY(allocate_slots(u, need, pd.state, pd.scales, &pd.pieces));
        if (need_accum) SX_TRY(state_ops_->allocate(bytes, "the sharded gradient accumulator", &pd.accum));
    }
    // An fp32 reduction of 16-bit gradients widens one unit at a time into one scratch.
    uint64_t scratch_bytes = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (trainable[u] && settings_.shard_size > 1 && units_[u].grad_dtype != SX_DTYPE_F32 && !reduces_in_16bit(u))
            scratch_bytes = std::max<uint64_t>(scratch_bytes, table_.layout->units()[u].padded_numel * sizeof(float));
    }
    Buffer scratch;
    if (scratch_bytes > reduce_scratch_.size())
        SX_TRY(ops_->allocate(scratch_bytes, "the fp32 gradient reduction buffer", &scratch, false,
                              settings_.exchanged));
    // Offloaded: the device's fp32 sums of two units' 16-bit gradients (one copied to the
    // host while the next is reduced), and the host's micro-batch sum on its way into a
    // stage-2 or stage-3 accumulator.
    Buffer device_sum[2], host_sum;
    if (settings_.offload) {
        uint64_t sum_bytes = 0, host_bytes = 0;
        for (size_t u = 0; u < units_.size(); ++u) {
            if (!trainable[u]) continue;
            const uint64_t bytes = table_.layout->units()[u].shard_numel * sizeof(float);
            if (units_[u].grad_dtype != SX_DTYPE_F32) sum_bytes = std::max(sum_bytes, bytes);
            if (accumulate && settings_.stage != 1) host_bytes = std::max(host_bytes, bytes);
        }
        for (int k = 0; k < 2 && sum_bytes > device_sum_[k].size(); ++k)
            SX_TRY(ops_->allocate(sum_bytes, "the device's sum of one unit's gradients", &device_sum[k]));
        if (host_bytes > host_sum_.size())
            SX_TRY(state_ops_->allocate(host_bytes, "the host's sum of one unit's gradients", &host_sum));
    }
    if (!scratch.empty()) reduce_scratch_ = std::move(scratch);
    for (int k = 0; k < 2; ++k)
        if (!device_sum[k].empty()) {
            SX_TRY(ops_->wait_copy(device_sum_copy_[k]));  // the old one's last copy
            device_sum_copy_[k] = 0;
            device_sum_[k] = std::move(device_sum[k]);
        }
    if (!host_sum.empty()) host_sum_ = std::move(host_sum);
    for (Pending &pd : pending) {
        Unit &unit = units_[pd.unit];
        for (int k = unit.state_slots; k < pd.slots; ++k) {
            unit.state[k] = std::move(pd.state[k]);
            unit.scales[k] = std::move(pd.scales[k]);
        }
        unit.state_slots = pd.slots;
        unit.state_pieces = std::move(pd.pieces);
        if (!pd.accum.empty()) unit.accum = std::move(pd.accum);
    }
    for (size_t u = 0; u < units_.size(); ++u) units_[u].trainable = trainable[u] != 0;
    return Status::Ok();
}

float *Units::shard_values(size_t u) const {
    const Unit &unit = units_[u];
    // A stochastic-rounding unit has fp32 values only while a checkpoint's copy exists
    // (an export_shard's); its bf16 params are its values always (UnitShard::bf16_params).
    return !unit.master.empty()     ? unit.master.as<float>()
           : unit.stochastic_round ? nullptr
                                   : static_cast<float *>(own_params(u));
}

UnitShard Units::shard(size_t u) const {
    const Unit &unit = units_[u];
    UnitShard v;
    v.values = shard_values(u);
    v.bf16_params = unit.stochastic_round ? rounded_params(u) : nullptr;
    for (int k = 0; k < unit.state_slots; ++k) v.state[k] = unit.state[k].as<float>();
    v.state_slots = unit.state_slots;
    v.shard_numel = table_.layout->units()[u].shard_numel;
    v.master = unit.dtype != SX_DTYPE_F32;
    v.pieces = state_pieces(u, &v.slot_bytes, &v.slot_scales);
    for (int k = 0; k < unit.state_slots; ++k) v.scales[k] = unit.scales[k].empty() ? nullptr : unit.scales[k].as<float>();
    return v;
}

bool Units::needs_accum(size_t u, bool accumulate) const {
    // The reduced shard goes in place into the unit's own part of its gradient buffer at
    // stages 1 and 2; an fp32 accumulator beside it holds it for 16-bit gradients (the
    // sum is fp32), at stage 3, and for a stage-2 unit's accumulated micro-batches
    // (allocated at the first sx_accumulate_grads, then kept). Stage 1 keeps
    // micro-batches in place. Offloaded, the reduced shard is always on the host.
    return settings_.offload || units_[u].grad_dtype != SX_DTYPE_F32 || settings_.stage == 3 || (settings_.stage == 2 && accumulate);
}

bool Units::reduces_in_16bit(size_t u) const {
    return units_[u].grad_dtype != SX_DTYPE_F32 && settings_.reduce_dtype != SX_DTYPE_F32;
}

void *Units::own_params(size_t u) const {
    const Unit &unit = units_[u];
    if (settings_.stage == 3) return unit.own.data();
    return unit.params.as<char>() +
           static_cast<uint64_t>(settings_.shard_rank) * table_.layout->units()[u].shard_numel * dtype_size(unit.dtype);
}

uint16_t *Units::rounded_params(size_t u) const {
    return settings_.offload && !own_on_host() ? units_[u].host_params.as<uint16_t>() : own_params16(u);
}

Status Units::ensure_masters(bool checkpoint) {
    for (size_t u = 0; u < units_.size(); ++u) SX_TRY(ensure_master(u, checkpoint));
    return Status::Ok();
}

void Units::drop_checkpoint_copies() {
    for (Unit &unit : units_)
        if (unit.stochastic_round && !unit.master.empty()) {
            unit.master = Buffer();
        }
}

Status Units::ensure_master(size_t u, bool checkpoint) {
    Unit &unit = units_[u];
    const uint64_t S = table_.layout->units()[u].shard_numel;
    if (unit.stochastic_round) {
        // Offloaded at stages 1-2, the host's copy of the params is taken from the device
        // where the device's are newer (the host's kernels update it, as the masters).
        // Elsewhere the params themselves are the values the update takes.
        if (settings_.offload && !own_on_host() && !unit.values_valid)
            SX_TRY(ops_->to_host(unit.host_params.data(), own_params(u), S * dtype_size(unit.dtype)));
        unit.values_valid = true;
        if (!checkpoint) return Status::Ok();
        if (unit.master.empty())
            SX_TRY(state_ops_->allocate(S * sizeof(float), "the fp32 values of bf16 params for a checkpoint", &unit.master));
        return state_ops_->widen(unit.dtype, rounded_params(u), unit.master.as<float>(), S, false);
    }
    if (unit.master.empty() || unit.values_valid) return Status::Ok();
    if (!settings_.offload) {
        SX_TRY(ops_->widen(unit.dtype, own_params16(u), unit.master.as<float>(), S, false));
    } else if (own_on_host()) {
        if (unit.dtype == SX_DTYPE_F32)
            SX_TRY(state_ops_->copy(unit.master.data(), own_params(u), S * sizeof(float)));
        else
            SX_TRY(state_ops_->widen(unit.dtype, own_params16(u), unit.master.as<float>(), S, false));
    } else if (unit.dtype == SX_DTYPE_F32) {
        SX_TRY(ops_->to_host(unit.master.data(), own_params(u), S * sizeof(float)));
    } else {
        SX_TRY(ops_->to_host(unit.host_params.data(), own_params(u), S * dtype_size(unit.dtype)));
        SX_TRY(state_ops_->widen(unit.dtype, unit.host_params.as<uint16_t>(), unit.master.as<float>(), S, false));
    }
    unit.values_valid = true;
    return Status::Ok();
}

Status Units::masters_to_params() {
    for (size_t u = 0; u < units_.size(); ++u) {
        Unit &unit = units_[u];
        const uint64_t S = table_.layout->units()[u].shard_numel;
        // An offloaded bf16_stochastic_round unit without a checkpoint's copy: its params
        // on the host (which a restore may have written) go to the device as they are.
        if (unit.master.empty() && unit.stochastic_round && settings_.offload && unit.values_valid) {
            SX_TRY(upload(u, 0, S));
            SX_TRY(wait_params(u));
        }
        if (unit.master.empty()) continue;
        if (!settings_.offload) {
            SX_TRY(ops_->narrow(unit.dtype, unit.master.as<float>(), own_params16(u), S));
        } else {
            if (unit.dtype != SX_DTYPE_F32)
                SX_TRY(state_ops_->narrow(unit.dtype, unit.master.as<float>(),
                                          own_on_host() ? own_params16(u) : unit.host_params.as<uint16_t>(), S));
            SX_TRY(upload(u, 0, S));
            SX_TRY(wait_params(u));  // the params are gathered next, on the device
        }
        unit.values_valid = true;
    }
    return Status::Ok();
}

// The pieces of the params the step updated alone, runs of them copied at once (what
// lies between two is padding): a frozen param's values on the device are the trainer's,
// which the host's copy may not know.
Status Units::upload_params(size_t u) {
    if (!settings_.offload || !units_[u].trainable) return Status::Ok();
    uint64_t begin = 0, end = 0;  // the run of updated elements of the shard not copied yet
    for (int32_t p : table_.layout->units()[u].params) {
        const ShardPiece piece = table_.layout->piece(p, settings_.shard_rank);
        if (piece.begin == piece.end) continue;
        if (!(*table_.applied)[p]) {
            SX_TRY(upload(u, begin, end));
            begin = end = 0;
            continue;
        }
        if (begin == end) begin = piece.shard_offset;
        end = piece.shard_offset + (piece.end - piece.begin);
    }
    return upload(u, begin, end);
}

Status Units::upload(size_t u, uint64_t begin, uint64_t end) {
    if (begin >= end) return Status::Ok();
    Unit &unit = units_[u];
    const size_t es = dtype_size(unit.dtype);
    // Stage 3: the update wrote a 16-bit shard in place; an fp32 one takes the masters.
    if (own_on_host())
        return unit.dtype == SX_DTYPE_F32 ? state_ops_->copy(static_cast<float *>(own_params(u)) + begin,
                                                             unit.master.as<float>() + begin, (end - begin) * es)
                                          : Status::Ok();
    const Buffer &from = unit.dtype == SX_DTYPE_F32 ? unit.master : unit.host_params;
    return ops_->from_host_async(static_cast<char *>(own_params(u)) + begin * es, from.as<char>() + begin * es,
                                 (end - begin) * es, &unit.params_copy);
}

Status Units::wait_grads(size_t u) const {
    const uint64_t t = units_[u].grads_copy;
    units_[u].grads_copy = 0;
    return ops_->wait_copy(t);
}

Status Units::wait_params(size_t u) {
    const uint64_t t = units_[u].params_copy;
    units_[u].params_copy = 0;
    return ops_->wait_copy(t);
}

Status Units::wait_copies() {
    for (size_t u = 0; u < units_.size(); ++u) {
        SX_TRY(wait_grads(u));
        SX_TRY(wait_params(u));
    }
    return Status::Ok();
}

Units::~Units() {
    // Copies in flight write into the units' buffers, which go with them.
    if (ops_) (void)wait_copies();
}

Status Units::reduce(size_t u, comm::Communicator &c, bool into_accum, float **shard_grad) {
    if (settings_.offload) return reduce_offloaded(u, c, into_accum, shard_grad);
    Unit &unit = units_[u];
    // The bytes of gradients the unit puts into the sum (its whole flat buffer).
    SX_TRACE_SPAN(tracer_, "step", "reduce_scatter", table_.layout->units()[u].unit_id, unit.grads.size());
    const uint64_t S = table_.layout->units()[u].shard_numel;
    if (unit.grad_dtype == SX_DTYPE_F32) {
        float *grads = unit.grads.as<float>();
        // One rank per shard group with nothing accumulated: the gradients are already its
        // shard's sum. (Otherwise one rank goes through the communicator too, which then
        // copies or adds.)
        if (settings_.shard_size == 1 && !into_accum && !unit.accum_live) {
            *shard_grad = grads;
        } else if (settings_.stage <= 2 && !into_accum && !unit.accum_live) {
            // In place: this rank's shard of the grad buffer receives the sum (a stage-2
            // unit has an fp32 accumulator only once micro-batches were accumulated).
            float *own = grads + static_cast<uint64_t>(settings_.shard_rank) * S;
            SX_TRY(c.reduce_scatter_sum(grads, S, own, false));
            *shard_grad = own;
        } else {
            SX_TRY(c.reduce_scatter_sum(grads, S, unit.accum.as<float>(), unit.accum_live));
            *shard_grad = unit.accum.as<float>();
        }
        return Status::Ok();
    }
    // 16-bit gradients: the reduced shard is always fp32, in the accumulator.
    uint16_t *grads = unit.grads.as<uint16_t>();
    float *out = unit.accum.as<float>();
    const uint64_t total = table_.layout->units()[u].padded_numel;
    unit.grads16_pending = settings_.shard_size == 1 && widens_in_update(u, into_accum);
    if (unit.grads16_pending) {
        // The update widens them as it reads them (append_segments).
        *shard_grad = out;
        return Status::Ok();
    }
    if (settings_.shard_size == 1) {
        // Nothing to sum: widen (or add) this rank's gradients into the fp32 shard.
        SX_TRY(ops_->widen(unit.grad_dtype, grads, out, S, unit.accum_live));
    } else if (reduces_in_16bit(u)) {
        // Summed in the 16-bit dtype: divided by the pre-divide factor f before, so that
        // the sum does not overflow, and multiplied back by f in fp32 after (the average's
        // 1/N comes with the update's gradient scale), so that small values do not
        // underflow. f is a power of two by default, so neither scaling rounds.
        const float f = static_cast<float>(settings_.predivide);
        SX_TRY(ops_->scale16(unit.grad_dtype, grads, 1.0f / f, total));
        SX_TRY(c.reduce_scatter_sum_16(grads, unit.grad_dtype, S, out, f, unit.accum_live));
    } else {
        float *wide = reduce_scratch_.as<float>();
        SX_TRY(ops_->widen(unit.grad_dtype, grads, wide, total, false));
        SX_TRY(c.reduce_scatter_sum(wide, S, out, unit.accum_live));
    }
    *shard_grad = out;
    return Status::Ok();
}

// Whether unit u's 16-bit gradients, this rank's whole sum, can reach the update as they
// are: the device reads them so, nothing is accumulated, and only the elementwise update
// reads the unit's reduced shard (the passes over whole params and custom optimizers
// read fp32).
bool Units::widens_in_update(size_t u, bool into_accum) const {
    return settings_.widen_in_update && !into_accum && !units_[u].accum_live && !has_custom(u) &&
           !looks_at_whole_params(u);
}

// Offloaded: the micro-batch's sum on the device (the trainer's gradients reduced over the
// shard group in the device's memory), then copied into the host's accumulator, or added
// to what it holds.
// The step's last micro-batch is copied in the background (wait_grads, before the host
// reads it), while the next unit is reduced; an earlier micro-batch's copy is waited for,
// as its gradients are zeroed next.
Status Units::reduce_offloaded(size_t u, comm::Communicator &c, bool into_accum, float **shard_grad) {
    Unit &unit = units_[u];
    SX_TRACE_SPAN(tracer_, "step", "reduce_scatter", table_.layout->units()[u].unit_id, unit.grads.size());
    const uint64_t S = table_.layout->units()[u].shard_numel;
    float *sum = nullptr;
    int slot = -1;
    SX_TRY(wait_grads(u));  // the accumulator is written again
    SX_TRY(reduce_on_device(u, c, &sum, &slot));
    float *acc = unit.accum.as<float>();
    SX_TRACE_SPAN(tracer_, "step", "grads_to_host", table_.layout->units()[u].unit_id, S * sizeof(float));
    if (!unit.accum_live) {
        SX_TRY(ops_->to_host_async(acc, sum, S * sizeof(float), &unit.grads_copy));
        if (slot >= 0) device_sum_copy_[slot] = unit.grads_copy;
        if (into_accum) SX_TRY(wait_grads(u));
    } else {
        float *part = host_sum_.as<float>();
        SX_TRY(ops_->to_host(part, sum, S * sizeof(float)));
        for (uint64_t i = 0; i < S; ++i) acc[i] += part[i];
    }
    *shard_grad = acc;
    return Status::Ok();
}

Status Units::reduce_on_device(size_t u, comm::Communicator &c, float **device_sum, int *slot) {
    Unit &unit = units_[u];
    const uint64_t S = table_.layout->units()[u].shard_numel;
    if (unit.grad_dtype == SX_DTYPE_F32) {
        // In place: this rank's shard of the grad buffer receives the sum (with one rank
        // per shard group, the gradients are the sum).
        float *grads = unit.grads.as<float>();
        float *own = grads + static_cast<uint64_t>(settings_.shard_rank) * S;
        if (settings_.shard_size > 1) SX_TRY(c.reduce_scatter_sum(grads, S, own, false));
        *device_sum = own;
        return Status::Ok();
    }
    // 16-bit gradients: their fp32 sum, as reduce() makes it, into the device's one-unit sum.
    uint16_t *grads = unit.grads.as<uint16_t>();
    // The sum the copy before the last one read (two alternate), once that copy is done.
    *slot = next_sum_;
    next_sum_ ^= 1;
    SX_TRY(ops_->wait_copy(device_sum_copy_[*slot]));
    device_sum_copy_[*slot] = 0;
    float *out = device_sum_[*slot].as<float>();
    if (settings_.shard_size == 1) {
        SX_TRY(ops_->widen(unit.grad_dtype, grads, out, S, false));
    } else if (reduces_in_16bit(u)) {
        const float f = static_cast<float>(settings_.predivide);
        SX_TRY(ops_->scale16(unit.grad_dtype, grads, 1.0f / f, table_.layout->units()[u].padded_numel));
        SX_TRY(c.reduce_scatter_sum_16(grads, unit.grad_dtype, S, out, f, false));
    } else {
        float *wide = reduce_scratch_.as<float>();
        SX_TRY(ops_->widen(unit.grad_dtype, grads, wide, table_.layout->units()[u].padded_numel, false));
        SX_TRY(c.reduce_scatter_sum(wide, S, out, false));
    }
    *device_sum = out;
    return Status::Ok();
}

Status Units::zero_grads(const std::vector<float *> &reduced) {
    SX_TRY(wait_copies());  // the gradients' copies read the buffers
    for (Unit &unit : units_) unit.grads16_pending = false;
    for (size_t u = 0; u < units_.size(); ++u) {
        Buffer &grads = units_[u].grads;
        if (u >= zeroed_by_update_.size() || !zeroed_by_update_[u]) {
            SX_TRY(ops_->zero(grads.data(), grads.size()));
            continue;
        }
        // The update zeroed this rank's shard of the buffer (reduced in place); the rest
        // held the partial sums it sent its peers.
        const size_t begin = static_cast<size_t>(reduced[u] - grads.as<float>()) * sizeof(float);
        const size_t end = begin + table_.layout->units()[u].shard_numel * sizeof(float);
        SX_TRY(ops_->zero(grads.data(), begin));
        SX_TRY(ops_->zero(grads.as<char>() + end, grads.size() - end));
    }
    zeroed_by_update_.clear();
    return Status::Ok();
}

void Units::mark_zeroed_by_update(bool zero, const std::vector<float *> &reduced) {
    // A unit whose update reads its gradients where they were reduced, in the unit's own
    // gradient buffer (fp32 gradients reduced in place at stage 1 or 2, or one rank per
    // shard group; nothing accumulated; every param trainable; on the host), has this
    // rank's shard of that buffer zeroed by the update as it reads each gradient: one
    // more stream of stores in a pass that already streams them, rather than a pass of
    // its own after the step. The rest of the buffer (the peers' shards) is zeroed after.
    zeroed_by_update_.assign(units_.size(), 0);
    if (!zero || ops_->device() != SX_DEVICE_CPU || settings_.stage == 3) return;
    for (size_t u = 0; u < units_.size(); ++u) {
        const Unit &unit = units_[u];
        if (!unit.trainable || unit.grad_dtype != SX_DTYPE_F32) continue;
        const float *base = unit.grads.as<float>();
        const uint64_t own = table_.layout->units()[u].shard_numel;
        const float *shard = reduced[u];
        const bool in_place = shard >= base && shard + own <= base + unit.grads.size() / sizeof(float);
        // Custom optimizers and those that look at whole params do not zero the gradients
        // they read.
        if (!in_place || has_custom(u) || looks_at_whole_params(u)) continue;
        bool all = true;
        for (int32_t p : table_.layout->units()[u].params) all = all && (*table_.applied)[p] != 0;
        zeroed_by_update_[u] = all ? 1 : 0;
    }
}

namespace {

// A segment of param p in a unit of packed state: its slots where its state piece says.
void point_at_packed_state(const Units::Unit &unit, int32_t p, optim::Segment *seg) {
    const StatePiece *piece = find_state_piece(unit.state_pieces, p);
    if (!piece) return;
    seg->state_dtype = piece->dtype;
    for (int k = 0; k < unit.state_slots; ++k) {
        char *bytes = unit.state[k].as<char>() + piece->byte_offset;
        seg->state[k] = piece->dtype == SX_STATE_FP32 ? reinterpret_cast<float *>(bytes) : nullptr;
        seg->state16[k] = piece->dtype == SX_STATE_BF16 ? reinterpret_cast<uint16_t *>(bytes) : nullptr;
        seg->codes[k] = piece->dtype == SX_STATE_8BIT ? reinterpret_cast<uint8_t *>(bytes) : nullptr;
        seg->scales[k] = piece->dtype == SX_STATE_8BIT ? unit.scales[k].as<float>() + piece->scale_offset : nullptr;
    }
}

}  // namespace

void Units::append_segments(size_t u, float *reduced, std::vector<optim::Segment> *out) const {
    const Unit &unit = units_[u];
    if (!unit.trainable) return;
    float *const values = shard_values(u);  // not shard(u): the step has no use for its pieces
    const bool twice = double_buffered(u);
    for (int32_t p : table_.layout->units()[u].params) {
        if (!(*table_.applied)[p]) continue;
        const ShardPiece piece = table_.layout->piece(p, settings_.shard_rank);
        if (piece.begin == piece.end) continue;
        const ParamSpec &spec = (*table_.params)[p];
        optim::Segment seg;
        // fp32: the params, or the masters; none where the update widens the bf16 params
        // itself and rounds them back stochastically.
        seg.param = unit.stochastic_round ? nullptr : values + piece.shard_offset;
        seg.stochastic_round = unit.stochastic_round;
        if (unit.dtype != SX_DTYPE_F32) {  // ... rounded into the 16-bit params in the same pass
            // (offloaded: their shard on the host, copied up after the update)
            uint16_t *params16 = settings_.offload && !own_on_host() ? unit.host_params.as<uint16_t>() : own_params16(u);
            seg.compute_out = params16 + piece.shard_offset;
            seg.compute_dtype = unit.dtype;
        }
        if (unit.grads16_pending && reduced == unit.accum.as<float>()) {
            seg.grad16 = unit.grads.as<uint16_t>() + piece.shard_offset;
            seg.grad_dtype = unit.grad_dtype;
        } else {
            seg.grad = reduced + piece.shard_offset;
        }
        if (u < zeroed_by_update_.size() && zeroed_by_update_[u]) seg.zero_grad = reduced + piece.shard_offset;
        for (int k = 0; k < unit.state_slots; ++k) seg.state[k] = unit.state[k].as<float>() + piece.shard_offset;
        if (!unit.state_pieces.empty()) point_at_packed_state(unit, p, &seg);
        if (twice) {
            // The update reads the slots' values from `state` and writes `state_next`
            // (mark_zeroed_by_update leaves the unit's gradients to zero_grads).
            for (int k = 0; k < unit.state_slots; ++k) {
                seg.state_in[k] = seg.state[k];
                seg.state[k] = unit.state_next[k].as<float>() + piece.shard_offset;
            }
            seg.undo = unit.undo.as<float>() + piece.shard_offset;
        }
        seg.param_index = p;
        seg.param_group = spec.group;
        seg.param_offset = piece.begin;
        seg.n = piece.end - piece.begin;
        seg.hyper = &(*table_.groups)[spec.group].hyper;
        // The step count the optimizer's row asks for (optim::StepCount).
        const optim::StepCount counted = optim::spec_of(seg.hyper->kind).step_count;
        seg.step = (counted == optim::StepCount::kMomentumUpdates ? spec.momentum_steps
                    : counted == optim::StepCount::kGroup         ? (*table_.groups)[spec.group].steps
                                                                  : spec.step) +
                   1;
        seg.mu_product = optim::next_mu_product(*seg.hyper, spec.mu_product, spec.step + 1);
        out->push_back(seg);
    }
}

std::vector<optim::Segment> Units::segments(const std::vector<float *> &reduced, int32_t except,
                                            bool double_buffered) const {
    std::vector<optim::Segment> segs;
    for (size_t u = 0; u < units_.size(); ++u)
        if (static_cast<int32_t>(u) != except && this->double_buffered(u) == double_buffered)
            append_segments(u, reduced[u], &segs);
    return segs;
}

bool Units::double_buffered(size_t u) const {
    if (!units_[u].trainable) return false;
    for (int32_t p : table_.layout->units()[u].params)
        if ((*table_.applied)[p] && optim::double_buffers((*table_.groups)[(*table_.params)[p].group].hyper.kind))
            return true;
    return false;
}

bool Units::has_custom(size_t u) const {
    for (int32_t p : table_.layout->units()[u].params)
        if ((*table_.applied)[p] && optim::is_custom((*table_.groups)[(*table_.params)[p].group].hyper.kind))
            return true;
    return false;
}

bool Units::looks_at_whole_params(size_t u) const {
    for (int32_t p : table_.layout->units()[u].params)
        if ((*table_.applied)[p] &&
            optim::spec_of((*table_.groups)[(*table_.params)[p].group].hyper.kind).needs != optim::Needs::kElementwise)
            return true;
    return false;
}

std::vector<int32_t> Units::params_needing(optim::Needs needs) const {
    std::vector<int32_t> out;
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].trainable)
            for (int32_t p : table_.layout->units()[u].params)
                if ((*table_.applied)[p] &&
                    optim::spec_of((*table_.groups)[(*table_.params)[p].group].hyper.kind).needs == needs)
                    out.push_back(p);
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<optim::Segment> Units::segments_needing(const std::vector<float *> &reduced, optim::Needs needs) const {
    std::vector<optim::Segment> segs = segments(reduced);
    segs.erase(std::remove_if(segs.begin(), segs.end(),
                              [needs](const optim::Segment &s) { return optim::spec_of(s.hyper->kind).needs != needs; }),
               segs.end());
    return segs;
}

bool Units::any_looks_beyond_a_unit() const {
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].trainable && (double_buffered(u) || looks_at_whole_params(u))) return true;
    return false;
}

bool Units::any_double_buffered() const {
    for (size_t u = 0; u < units_.size(); ++u)
        if (double_buffered(u)) return true;
    return false;
}

Status Units::ensure_double_buffers() {
    struct Pending {
        size_t unit;
        Buffer next[3];
        Buffer undo;
    };
    std::vector<Pending> pending;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!double_buffered(u)) continue;
        const Unit &unit = units_[u];
        const uint64_t bytes = table_.layout->units()[u].shard_numel * sizeof(float);
        Pending pd;
        pd.unit = u;
        bool any = false;
        for (int k = 0; k < unit.state_slots; ++k)
            if (unit.state_next[k].empty()) {
                SX_TRY(state_ops_->allocate(bytes, "a custom optimizer's second state buffer", &pd.next[k]));
                any = true;
            }
        if (unit.undo.empty()) {
            SX_TRY(state_ops_->allocate(bytes, "a custom optimizer's copy of the params", &pd.undo));
            any = true;
        }
        if (any) pending.push_back(std::move(pd));
    }
    for (Pending &pd : pending) {
        Unit &unit = units_[pd.unit];
        for (int k = 0; k < 3; ++k)
            if (!pd.next[k].empty()) unit.state_next[k] = std::move(pd.next[k]);
        if (!pd.undo.empty()) unit.undo = std::move(pd.undo);
    }
    return Status::Ok();
}

void Units::commit_double_buffers() {
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!double_buffered(u)) continue;
        Unit &unit = units_[u];
        // The params the step left alone (frozen ones) keep their slots: copied over
        // before the swap, since the new buffers hold older values there.
        for (int32_t p : table_.layout->units()[u].params) {
            if ((*table_.applied)[p]) continue;
            const ShardPiece piece = table_.layout->piece(p, settings_.shard_rank);
            const size_t n = piece.end - piece.begin;
            for (int k = 0; k < unit.state_slots && n > 0; ++k)
                std::memcpy(unit.state_next[k].as<float>() + piece.shard_offset,
                            unit.state[k].as<float>() + piece.shard_offset, n * sizeof(float));
        }
        for (int k = 0; k < unit.state_slots; ++k) std::swap(unit.state[k], unit.state_next[k]);
    }
}

Status Units::sum_of_squares(size_t u, float *reduced, float grad_scale, double *out) const {
    std::vector<optim::Segment> segs;
    append_segments(u, reduced, &segs);
    *out = 0.0;
    if (segs.empty()) return Status::Ok();
    SX_TRY(wait_grads(u));
    return state_ops_->sum_of_squares(segs.data(), segs.size(), grad_scale, out);
}

Status Units::sum_of_squares(size_t u, float *reduced, float grad_scale, double *counted, double *others) const {
    std::vector<optim::Segment> segs, copies;
    append_segments(u, reduced, &segs);
    *counted = *others = 0.0;
    if (segs.empty()) return Status::Ok();
    const auto copy = [&](const optim::Segment &s) {
        return !(*table_.params)[static_cast<size_t>(s.param_index)].placement.counts_in_norm();
    };
    std::copy_if(segs.begin(), segs.end(), std::back_inserter(copies), copy);
    segs.erase(std::remove_if(segs.begin(), segs.end(), copy), segs.end());
    SX_TRY(wait_grads(u));
    if (!segs.empty()) SX_TRY(state_ops_->sum_of_squares(segs.data(), segs.size(), grad_scale, counted));
    if (!copies.empty()) SX_TRY(state_ops_->sum_of_squares(copies.data(), copies.size(), grad_scale, others));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
