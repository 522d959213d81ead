// The element work of LAMB's and Adafactor's device passes (device_passes.h), one body for
// the CUDA kernels and the host's launcher: O supplies the fp32 operations, each rounded
// once (the host's operators under -ffp-contract=off, the device's __fmul_rn and kin),
// so from the same inputs both give lamb.cc's, adafactor.cc's and muon.cc's element values
// bit for bit.
#pragma once

#include <cstdint>

#include "optim/device_passes.h"

namespace sx {
namespace optim {
namespace pass_body {

// --- LAMB (lamb.cc's first_range and second_range) ---

template <class O>
SX_PASS_BODY float lamb_direction(const PassSegment &s, float m, float v, float p) {
    float u = O::div(m, O::add(O::sqrt(v), s.eps));
    if (s.l2) u = O::add(u, O::mul(s.weight_decay, p));
    return u;
}

template <class O>
SX_PASS_BODY void lamb_first_at(const PassSegment &s, uint64_t i, double *acc) {
    const float g = O::mul(s.grad[i], s.grad_scale);
    const float m = O::add(O::mul(s.state0[i], s.beta1), O::mul(s.one_minus_beta1, g));
    const float v = O::add(O::mul(s.state1[i], s.beta2), O::mul(O::mul(s.one_minus_beta2, g), g));
    const float p = O::mul(s.param[i], s.decay);
    s.state0[i] = m;
    s.state1[i] = v;
    s.param[i] = p;
    const float u = lamb_direction<O>(s, m, v, p);
    acc[0] += static_cast<double>(p) * p;
    acc[1] += static_cast<double>(u) * u;
    acc[2] += static_cast<double>(g) * g;
}

template <class O>
SX_PASS_BODY void write_compute(const PassSegment &s, uint64_t i, float p) {
    if (s.compute_out) s.compute_out[i] = O::to16(s.compute_dtype, p);
}

template <class O>
SX_PASS_BODY void lamb_apply_at(const PassSegment &s, uint64_t i) {
    const float p = O::add(s.param[i], O::mul(s.factor, lamb_direction<O>(s, s.state0[i], s.state1[i], s.param[i])));
    s.param[i] = p;
    write_compute<O>(s, i, p);
}

// --- Adafactor (adafactor.cc's run_sums, add_column_squares, unfactored_range, factored_run) ---

template <class O>
SX_PASS_BODY void adafactor_sums_at(const PassSegment &s, uint64_t i, double *acc) {
    const float x = O::mul(s.grad[i], s.grad_scale);
    acc[0] += static_cast<double>(s.param[i]) * s.param[i];
    acc[1] += static_cast<double>(x) * x;
}

// Column item `item` of segment s: the squared gradients down one column of one matrix,
// over one block of kColumnRows rows, in row order (the elements s holds).
template <class O>
SX_PASS_BODY double adafactor_column_item(const PassSegment &s, uint64_t item) {
    const uint64_t blocks = (s.rows + kColumnRows - 1) / kColumnRows;
    const uint64_t matrix = s.offset / s.cols / s.rows + item / (blocks * s.cols);
    const uint64_t rest = item % (blocks * s.cols), block = rest / s.cols, col = rest % s.cols;
    const uint64_t r_end = (block + 1) * kColumnRows < s.rows ? (block + 1) * kColumnRows : s.rows;
    double acc = 0.0;
    for (uint64_t r = block * kColumnRows; r < r_end; ++r) {
        const uint64_t e = (matrix * s.rows + r) * s.cols + col;
        if (e < s.offset || e >= s.offset + s.n) continue;
        const float x = O::mul(s.grad[e - s.offset], s.grad_scale);
        acc += static_cast<double>(x) * x;
    }
    return acc;
}

// u = g * rsqrt(max(v, eps1^2)) (torch's clamp_ then rsqrt_: two roundings).
template <class O>
SX_PASS_BODY float adafactor_direction(const PassSegment &s, float g, float v) {
    return O::mul(g, O::div(1.0f, O::sqrt(v < s.eps1_sq ? s.eps1_sq : v)));
}

// Element i's u: a factored param's v from its moments in aux; a 1-D param's variance,
// lerped towards g^2 first where `lerp` (the second pass), else as stored (the third).
template <class O>
SX_PASS_BODY float adafactor_u(const PassSegment &s, const float *aux, uint64_t i, bool lerp) {
    const float g = O::mul(s.grad[i], s.grad_scale);
    float v;
    if (s.cols) {
        const uint64_t e = s.offset + i, row = e / s.cols, col = e % s.cols, matrix = row / s.rows;
        const float *row_var = aux + s.aux, *col_var = row_var + s.row_count, *means = col_var + s.col_count;
        v = O::div(O::mul(row_var[row], col_var[matrix * s.cols + col]), means[matrix]);
    } else if (lerp) {
        const float self = s.state0[i], end = O::mul(g, g);
        v = O::add(s.lerp_from_end ? end : self, O::mul(s.lerp_coeff, O::sub(end, self)));
        s.state0[i] = v;
    } else {
        v = s.state0[i];
    }
    return adafactor_direction<O>(s, g, v);
}

template <class O>
SX_PASS_BODY void adafactor_apply_at(const PassSegment &s, const float *aux, uint64_t i) {
    const float p = O::add(O::mul(s.param[i], s.decay), O::mul(s.factor, adafactor_u<O>(s, aux, i, false)));
    s.param[i] = p;
    write_compute<O>(s, i, p);
}

// --- Muon (muon.cc's muon_momentum and muon_apply) ---

template <class O>
SX_PASS_BODY void muon_momentum_at(const PassSegment &s, uint64_t i, double *acc) {
    const float g = O::mul(s.grad[i], s.grad_scale);
    acc[0] += static_cast<double>(g) * g;
    const float self = s.state0[i];  // buf.lerp_(grad, 1 - momentum)
    const float b = O::add(s.lerp_from_end ? g : self, O::mul(s.lerp_coeff, O::sub(g, self)));
    s.state0[i] = b;
    // grad.lerp(buf, momentum) with Nesterov, else buf
    s.pieces[i] = s.nesterov ? O::add(s.nesterov_from_end ? b : g, O::mul(s.nesterov_coeff, O::sub(b, g))) : b;
}

template <class O>
SX_PASS_BODY void muon_apply_at(const PassSegment &s, uint64_t i) {
    const float p = O::add(O::mul(s.param[i], s.decay), O::mul(s.factor, s.pieces[i]));
    s.param[i] = p;
    write_compute<O>(s, i, p);
}

// Element i of a run of `kernel` (all but kAdafactorColumns), its sums added into acc.
template <class O>
SX_PASS_BODY void element_at(PassKernel kernel, const PassSegment &s, const float *aux, uint64_t i, double *acc) {
    switch (kernel) {
        case PassKernel::kLambFirst: lamb_first_at<O>(s, i, acc); break;
        case PassKernel::kLambApply: lamb_apply_at<O>(s, i); break;
        case PassKernel::kAdafactorSums: adafactor_sums_at<O>(s, i, acc); break;
        case PassKernel::kAdafactorSecond: {
            const float u = adafactor_u<O>(s, aux, i, true);
            acc[0] += static_cast<double>(u) * u;
            break;
        }
        case PassKernel::kAdafactorApply: adafactor_apply_at<O>(s, aux, i); break;
        case PassKernel::kMuonMomentum: muon_momentum_at<O>(s, i, acc); break;
        case PassKernel::kMuonApply: muon_apply_at<O>(s, i); break;
        case PassKernel::kAdafactorColumns: break;
    }
}

}  // namespace pass_body
}  // namespace optim
}  // namespace sx
