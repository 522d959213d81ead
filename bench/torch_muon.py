"""torch's side of bench_sx's param_sums section: torch.optim.Muon's Newton-Schulz
iterations (bf16, as torch.optim.Muon runs them) and an fp32 n x n x n torch.matmul on
the CPU, the fastest of --reps each (of one where a call takes seconds), printed as one
JSON line."""
import argparse
import json
import time

import torch
from torch.optim._muon import _zeropower_via_newtonschulz, DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS


def fastest_ms(reps, fn):
    """The fastest of reps calls after a warm-up one; where the warm-up took more than 2 s
    (bf16 products on a CPU without bf16 instructions: seconds each), of one call."""
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 > 2.0:
        reps = 1
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    a = torch.rand(args.n, args.n, generator=g) * 2 - 1
    b = a * 0.5
    ns = fastest_ms(args.reps, lambda: _zeropower_via_newtonschulz(a, (DEFAULT_A, DEFAULT_B, DEFAULT_C), 5, EPS))
    mm = fastest_ms(args.reps, lambda: torch.matmul(a, b))
    print(json.dumps({"ns_ms": round(ns, 4), "matmul_ms": round(mm, 4)}))


if __name__ == "__main__":
    main()
