// Muon (Jordan et al. 2024; torch.optim.Muon): SGD momentum (Nesterov by default), then
// each 2-D param's whole update matrix replaced by an approximate orthogonalisation of it
// (quintic Newton-Schulz iterations), scaled by an lr that depends on the param's shape.
//
// As torch.optim.Muon's _single_tensor_muon, per param with gradient g:
//   buf = buf.lerp(g, 1 - momentum)
//   u = nesterov ? g.lerp(buf, momentum) : buf
//   O = NS(u): X = bf16(u) (transposed if it has more rows than columns); X /= max(|X|, eps);
//       ns_steps times: G = X X^T; U = b G + c G G; X = a X + U X  (every product a bf16
//       matrix product: fp32 sums of exact products, each result rounded to bf16)
//   p = p * (1 - lr * wd) - adjusted_lr * O
// with adjusted_lr from adjust_lr (SX_MUON_ADJUST_LR_*) and the param's shape [A, B].
//
// A param's pieces lie on several ranks: the step (core/whole_params.cc) runs
// muon_momentum over this rank's pieces, assembles each param's u on one rank, which runs
// newton_schulz, returns each rank its piece of O, and muon_apply finishes the pieces. The
// products are gemm.h's: OpenBLAS's where libsx was built with it, else sx's own ordered
// one. Either gives an element the same sums whatever the pool's size and whichever rank
// runs it, so on one kind of CPU O, and the params, are the same bits at any world size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/gemm.h"
#include "optim/optimizer.h"

namespace sx {
namespace optim {

class ThreadPool;

// The first pass over every segment (hyper->kind == kMuon): the momentum buffer (state
// slot 0) updated, and u written to updates[s][0, n) for segment s. *grad_sumsq (if not
// null): the sum of (grad*grad_scale)^2.
void muon_momentum(const Segment *segs, size_t num_segs, float grad_scale, float *const *updates,
                   double *grad_sumsq);

// O of the rows x cols matrix u (row-major fp32) into out (the same shape, each value a
// bf16 value), with h's ns_a, ns_b, ns_c, ns_steps and eps. out may not alias u. pool
// (or null) splits each product's rows; flavour: whose products (gemm.h).
void newton_schulz(const float *u, int64_t rows, int64_t cols, const Hyper &h, ThreadPool *pool, float *out,
                   Gemm flavour = default_gemm());

// torch's _adjust_lr: the lr a param of shape [rows, cols] is updated with.
double muon_adjusted_lr(const Hyper &h, int64_t rows, int64_t cols);

// The second pass: p = p * (1 - lr * wd) + (-adjusted_lr[s]) * orth[s][i] over segment s;
// 16-bit params (compute_out) rounded from the result.
void muon_apply(const Segment *segs, size_t num_segs, const float *const *orth, const double *adjusted_lr);

}  // namespace optim
}  // namespace sx
