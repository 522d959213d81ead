#!/usr/bin/env python3
"""sx_step and torch.optim.AdamW(fused=True) in one Python process, as sx.torch runs
them: one fp32 parameter of N elements each (lr 1e-3, weight_decay 0.01), sx on one rank
with 2 threads and keep_grads (torch's step does not zero its gradients either), torch
with 2 intra-op threads. sx runs twice over: a group on its own pool, and a group with
openmp_threads (SX_GROUP_OPENMP_THREADS: its work on torch's OpenMP team, as sx.torch
makes it by default). In each of 21 rounds they take turns step by step (--order
alternate: torch, sx on its pool, torch, sx on torch's team, ...; the case of a training
loop, where a torch operation comes just before every sx_step) or 30 steps each (--order
turns); every step is timed alone with time.perf_counter. Prints each one's median, and
each sx median / torch's. The environment decides how torch's OpenMP threads wait between
regions (OMP_WAIT_POLICY, read once when torch loads).

usage: SX_LIBRARY=build/release/src/libsx.so.1 PYTHONPATH=bindings/python \\
       python3 bench/torch_inprocess_step.py [--elements N] [--order alternate|turns]
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--order", choices=("alternate", "turns"), default="alternate")
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"torch_inprocess_step: skipped: {e}")
        return 0
    import sx

    n = args.elements
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(12345)
    p = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
    p.grad = torch.rand(n, generator=gen) * 2 - 1
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    groups = []
    for openmp in (False, True):
        group = sx.ShardGroup("local://bench-inprocess-%d-%d" % (os.getpid(), openmp), 0, 1, stage=1,
                              backend="cpu", num_threads=2, openmp_threads=openmp)
        group.add_param_group("adamw", lr=1e-3, weight_decay=0.01)
        group.add_param("w", [n], unit=0)
        group.finalize()
        np.asarray(group.grad_view("w"))[:] = 0.5
        groups.append(group)
    for _ in range(5):
        for group in groups:
            opt.step()
            group.step(keep_grads=True)

    def timed(step, out):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)

    sx_times, torch_times = ([], []), []
    steps = [lambda g=g: g.step(keep_grads=True) for g in groups]
    for _ in range(21):
        for k in (0, 1):
            if args.order == "alternate":
                for _ in range(30):
                    timed(opt.step, torch_times)
                    timed(steps[k], sx_times[k])
            else:
                for _ in range(30):
                    timed(opt.step, torch_times)
                for _ in range(30):
                    timed(steps[k], sx_times[k])
    for group in groups:
        group.close()
    pool, team = (statistics.median(x) for x in sx_times)
    t = statistics.median(torch_times)
    policy = os.environ.get("OMP_WAIT_POLICY", "(unset)")
    print(f"torch_inprocess_step: {n} elements, {args.order}, OMP_WAIT_POLICY {policy}: sx_step median "
          f"{pool * 1e6:.1f} us on sx's pool, {team * 1e6:.1f} us on torch's OpenMP team; torch {t * 1e6:.1f} us; "
          f"sx / torch {pool / t:.3f} (pool), {team / t:.3f} (OpenMP team)")
    print(json.dumps({"bench": "torch_inprocess_step", "elements": n, "order": args.order,
                      "omp_wait_policy": policy, "sx_pool_median_us": round(pool * 1e6, 2),
                      "sx_openmp_median_us": round(team * 1e6, 2), "torch_median_us": round(t * 1e6, 2),
                      "sx_pool_over_torch": round(pool / t, 4), "sx_openmp_over_torch": round(team / t, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
