#!/usr/bin/env python3
"""torch.optim.AdamW(fused=True) on 2^28 fp32 elements on a CUDA device: the peer of
bench_sx's gpu_adamw section (sx's goal: at least 1.2x torch's elements/s).

One parameter of N elements with a gradient, lr 1e-3 and weight_decay 0.01 (the
section's hyperparameters); each step timed with CUDA events after warm-up; the
median is reported as a readable line and one JSON line. Exits 0 with a message
where PyTorch or a CUDA device is missing.

usage: bench/torch_adamw.py [--elements N] [--reps R]
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 28)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_adamw: skipped: PyTorch is not installed ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"torch_adamw: skipped: torch {torch.__version__} sees no CUDA device")
        return 0

    n = args.elements
    gen = torch.Generator(device="cuda").manual_seed(12345)
    p = torch.nn.Parameter(torch.rand(n, device="cuda", generator=gen) * 2 - 1)
    p.grad = torch.rand(n, device="cuda", generator=gen) * 2 - 1
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    for _ in range(3):  # creates the state, compiles nothing, warms the allocator
        opt.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        opt.step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    ms = statistics.median(times)
    moved = n * 7 * 4  # p, g, exp_avg, exp_avg_sq read; p, exp_avg, exp_avg_sq written
    name = torch.cuda.get_device_name()
    print(f"torch_adamw: torch {torch.__version__} AdamW(fused=True) on {n} elements on {name}: "
          f"{ms:.3f} ms median of {args.reps}, {n / ms * 1e-6:.2f} Gelements/s, "
          f"{moved / ms * 1e-9:.3f} TB/s")
    print(json.dumps({"bench": "torch_adamw", "device": name, "torch": torch.__version__, "elements": n,
                      "reps": args.reps, "step_ms": round(ms, 4), "elements_per_s": n / (ms * 1e-3),
                      "tbps": moved / (ms * 1e-3) * 1e-12}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
