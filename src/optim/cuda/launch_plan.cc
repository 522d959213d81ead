// Builds the segment table and the blocks' starting points (see launch_plan.h).
#include "optim/cuda/launch_plan.h"

#include "optim/stochastic_round.h"
#include "sx/sx.h"

namespace sx {
namespace optim {
namespace cuda {
namespace internal {

namespace {

// Element index within a 16-byte group of floats, or -1 if not float-aligned.
int lead_of(const void *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (a % sizeof(float) != 0) return -1;
    return static_cast<int>((a / sizeof(float)) % 4);
}
// The same for 16-bit values within an 8-byte group (4 of them per float4 of the others).
int lead16_of(const void *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (a % 2 != 0) return -1;
    return static_cast<int>((a / 2) % 4);
}

// The 16-bit dtype of a segment's gradients as the kernel takes it (kNone: fp32).
ComputeDtype grad_dtype_of(const Segment &s) {
    if (s.grad16 == nullptr) return ComputeDtype::kNone;
    return s.grad_dtype == SX_DTYPE_BF16  ? ComputeDtype::kBf16
           : s.grad_dtype == SX_DTYPE_F16 ? ComputeDtype::kFp16
                                          : ComputeDtype(-1);
}

// Segment i's gradients into t, and *lead: where its positions start within 16 bytes.
// 16-bit gradients: the positions follow the param's alignment (the stats' pass has no
// param: their own), and the gradients must agree to be read 4 at a time.
Status gradients_of(const Segment &s, size_t i, TableSegment *t, int *lead) {
    const ComputeDtype gd = grad_dtype_of(s);
    SX_CHECK_ARG(gd != ComputeDtype(-1), "segment %zu: grad_dtype %d is not SX_DTYPE_BF16 or SX_DTYPE_F16", i,
                 s.grad_dtype);
    SX_CHECK_ARG((s.grad == nullptr) != (s.grad16 == nullptr), "segment %zu: exactly one of grad and grad16 must be set",
                 i);
    *lead = s.grad ? lead_of(s.grad) : lead16_of(s.grad16);
    SX_CHECK_ARG(*lead >= 0, "segment %zu: grad must be a device address aligned to its element size (got %p)", i,
                 s.grad ? static_cast<const void *>(s.grad) : static_cast<const void *>(s.grad16));
    t->grad = s.grad;
    t->grad16 = s.grad16;
    t->grad_dtype = static_cast<int32_t>(gd);
    return Status::Ok();
}

// Segment i's state slots into t (fp32, bf16, or 8-bit codes and scales: Segment's
// state_dtype), and whether they allow float4 access at `lead` (fp32 slots alone do).
Status slots_of(const Segment &s, size_t i, int lead, TableSegment *t, bool *vector) {
    const int32_t dtype = s.state_dtype;
    SX_CHECK_ARG(dtype == SX_STATE_FP32 || dtype == SX_STATE_BF16 || dtype == SX_STATE_8BIT,
                 "segment %zu: state_dtype %d is not SX_STATE_FP32, SX_STATE_BF16 or SX_STATE_8BIT", i, dtype);
    SX_CHECK_ARG(dtype != SX_STATE_8BIT || s.n % kQuantBlock == 0,
                 "segment %zu: 8-bit state needs whole blocks of %zu elements (n is %zu)", i, kQuantBlock, s.n);
    const int slots = state_slots(*s.hyper);
    t->state_dtype = dtype;
    t->slots = slots;
    for (int k = 0; k < slots; ++k) {
        if (dtype == SX_STATE_FP32) {
            SX_CHECK_ARG(s.state[k] != nullptr && lead_of(s.state[k]) >= 0,
                         "segment %zu: state[%d] must be a device address aligned to 4 bytes "
                         "(this optimizer keeps %d state slots; got %p)",
                         i, k, slots, static_cast<void *>(s.state[k]));
            *vector = *vector && lead_of(s.state[k]) == lead;
            t->state[k] = s.state[k];
        } else if (dtype == SX_STATE_BF16) {
            SX_CHECK_ARG(s.state16[k] != nullptr && lead16_of(s.state16[k]) >= 0,
                         "segment %zu: state16[%d] must be a device address aligned to 2 bytes (bf16 state, "
                         "%d slots; got %p)", i, k, slots, static_cast<void *>(s.state16[k]));
            t->state16[k] = s.state16[k];
        } else {
            SX_CHECK_ARG(s.codes[k] != nullptr && s.scales[k] != nullptr && lead_of(s.scales[k]) >= 0,
                         "segment %zu: codes[%d] and scales[%d] must be device addresses, the scales aligned to 4 "
                         "bytes (8-bit state, %d slots; got %p and %p)",
                         i, k, k, slots, static_cast<void *>(s.codes[k]), static_cast<void *>(s.scales[k]));
            t->codes[k] = s.codes[k];
            t->scales[k] = s.scales[k];
            if (state_slot_nonnegative(*s.hyper, k)) t->unsigned_maps |= 1 << k;
        }
    }
    *vector = *vector && dtype == SX_STATE_FP32;
    return Status::Ok();
}

// Segment i's params and their compute copy into t (bf16_stochastic_round: the bf16
// params alone, in compute_out), and whether they allow float4 access at `lead`.
Status params_of(const CudaSegment &cs, size_t i, Mode mode, int lead, TableSegment *t, bool *vector) {
    const Segment &s = cs.seg;
    SX_CHECK_ARG(cs.compute_dtype == ComputeDtype::kNone || cs.compute_dtype == ComputeDtype::kBf16 ||
                     cs.compute_dtype == ComputeDtype::kFp16,
                 "segment %zu: compute_dtype %d is not kNone, kBf16 or kFp16", i, static_cast<int>(cs.compute_dtype));
    if (s.stochastic_round) {
        // One element at a time: the random bits are a hash per element anyway.
        SX_CHECK_ARG(mode != Mode::kTrafficOnly, "segment %zu: the traffic-only pass moves fp32 params alone", i);
        SX_CHECK_ARG(s.param == nullptr && cs.compute_dtype == ComputeDtype::kBf16 && cs.compute_out != nullptr &&
                         reinterpret_cast<uintptr_t>(cs.compute_out) % 2 == 0,
                     "segment %zu: a stochastically rounded segment takes no fp32 param and its bf16 params in "
                     "compute_out, a device address aligned to 2 bytes (got param %p, compute_out %p, "
                     "compute_dtype %d)",
                     i, static_cast<void *>(s.param), cs.compute_out, static_cast<int>(cs.compute_dtype));
        t->stochastic_round = 1;
        t->sr_key = stochastic_round_key(s.param_index, s.step);
        t->param_offset = s.param_offset;
        t->out = cs.compute_out;
        t->out_dtype = static_cast<int32_t>(ComputeDtype::kBf16);
        *vector = false;
        return Status::Ok();
    }
    SX_CHECK_ARG(s.param != nullptr && lead_of(s.param) >= 0,
                 "segment %zu: param must be a device address aligned to 4 bytes (got %p)", i,
                 static_cast<void *>(s.param));
    *vector = lead_of(s.param) == lead;
    t->param = s.param;
    if (cs.compute_dtype == ComputeDtype::kNone) return Status::Ok();
    const uintptr_t a = reinterpret_cast<uintptr_t>(cs.compute_out);
    SX_CHECK_ARG(cs.compute_out != nullptr && a % 2 == 0,
                 "segment %zu: compute_out must be a device address aligned to 2 bytes (got %p)", i, cs.compute_out);
    // 4 outputs (8 bytes) per float4: the same lead within 8-byte groups.
    *vector = *vector && static_cast<int>((a / 2) % 4) == lead;
    t->out = cs.compute_out;
    t->out_dtype = static_cast<int32_t>(cs.compute_dtype);
    return Status::Ok();
}

}  // namespace

Status build_plan(const CudaSegment *segs, size_t num_segs, float grad_scale, Mode mode,
                  uint32_t max_grid, LaunchPlan *plan) {
    SX_CHECK_ARG(segs != nullptr || num_segs == 0, "segments is null but num_segs is %zu", num_segs);
    SX_CHECK_ARG(max_grid >= 1, "max_grid must be at least 1");
    plan->segments.clear();
    plan->first_segment.clear();
    plan->total_chunks = 0;
    plan->grid = 0;
    plan->packed = false;
    const bool stats_only = mode == Mode::kStats;
    uint64_t chunks = 0;
    for (size_t i = 0; i < num_segs; ++i) {
        const CudaSegment &cs = segs[i];
        const Segment &s = cs.seg;
        if (s.n == 0) continue;
        TableSegment t{};
        int lead = 0;
        SX_TRY(gradients_of(s, i, &t, &lead));
        t.n = s.n;
        t.out_dtype = static_cast<int32_t>(ComputeDtype::kNone);
        bool vector = true;
        if (!stats_only) {
            SX_CHECK_ARG(s.hyper != nullptr, "segment %zu: hyper is null", i);
            SX_CHECK_ARG(s.step >= 1, "segment %zu: step must be at least 1 (got %lld)", i,
                         static_cast<long long>(s.step));
            SX_TRY(params_of(cs, i, mode, lead, &t, &vector));
            SX_TRY(slots_of(s, i, lead, &t, &vector));
            SX_CHECK_ARG(mode != Mode::kTrafficOnly || t.state_dtype == SX_STATE_FP32,
                         "segment %zu: the traffic-only pass moves fp32 state alone", i);
            plan->packed = plan->packed || t.state_dtype != SX_STATE_FP32;
            t.c = optim::internal::make_consts(s, grad_scale);
        } else {
            t.c.grad_scale = grad_scale;
        }
        t.vector = vector ? 1 : 0;
        t.lead = vector ? static_cast<uint32_t>(lead) : 0;
        t.chunk_begin = chunks;
        chunks += (t.lead + t.n + kChunk - 1) / kChunk;
        t.chunk_end = chunks;
        plan->segments.push_back(t);
    }
    plan->total_chunks = chunks;
    if (chunks == 0) return Status::Ok();
    plan->grid = chunks < max_grid ? static_cast<uint32_t>(chunks) : max_grid;
    plan->first_segment.resize(plan->grid);
    uint32_t s = 0;
    for (uint32_t b = 0; b < plan->grid; ++b) {
        const uint64_t c = block_chunk_begin(b, chunks, plan->grid);
        while (plan->segments[s].chunk_end <= c) ++s;  // chunk begins are non-decreasing
        plan->first_segment[b] = s;
    }
    return Status::Ok();
}

}  // namespace internal
}  // namespace cuda
}  // namespace optim
}  // namespace sx
