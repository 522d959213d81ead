#!/usr/bin/env python3
"""torch.optim.AdamW(fused=True) on the CPU, step by step, on command: the peer of
bench_sx's cache_step section, which starts this script once and drives it in turns
with its own steps, so that both are timed in the same run on the same threads.

Reads lines "N K" from stdin: for a new N, one fp32 parameter of N elements with a
gradient (a fixed seed, lr 1e-3, weight_decay 0.01) and 5 warm-up steps; then K steps,
each timed alone with time.perf_counter around opt.step() (the gradient is not zeroed:
torch's step does not). Answers one line of K times in seconds. torch's intra-op threads
are --threads (2). A first line "ready <torch version>" or "skipped: <why>".

usage: bench/torch_cache_step.py [--threads T]
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"skipped: PyTorch is not installed ({e})", flush=True)
        return 0
    torch.set_num_threads(args.threads)
    print(f"ready {torch.__version__}", flush=True)
    n_now, opt = None, None
    for line in sys.stdin:
        n, k = (int(x) for x in line.split())
        if n != n_now:
            gen = torch.Generator().manual_seed(12345)
            p = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
            p.grad = torch.rand(n, generator=gen) * 2 - 1
            opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
            for _ in range(5):
                opt.step()
            n_now = n
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        print(" ".join("%.9f" % t for t in times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
