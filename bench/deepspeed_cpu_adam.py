#!/usr/bin/env python3
"""sx's host AdamW step against DeepSpeed's DeepSpeedCPUAdam (ZeRO-Offload's CPU optimizer),
on this host, the same elements and threads, timed in alternation.

sx: a one-rank CPU group with one fp32 param of N elements, AdamW (lr 1e-3, weight_decay
0.01), sx_step with keep_grads (the kernel an offloaded CUDA group runs on its host
state, plus the step's own work). DeepSpeed: DeepSpeedCPUAdam(adamw_mode=True) with the
same hyperparameters on an fp32 torch param of N elements with its gradient, torch's
threads set to the same count. Each rep times one step of each, the order alternating;
the figure is the median over reps of DeepSpeed's time / sx's. Exits 0 with a message
where torch, deepspeed or the sx binding is missing.

usage: bench/deepspeed_cpu_adam.py [--elements N] [--reps R] [--threads T]
   (SX_LIBRARY=build/release/src/libsx.so PYTHONPATH=bindings/python)
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=64 << 20)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        import sx
    except ImportError as e:
        print(f"deepspeed_cpu_adam: skipped: {e}")
        return 0
    n, threads = args.elements, args.threads
    torch.set_num_threads(threads)
    rng = np.random.default_rng(12345)
    grad = rng.uniform(-1, 1, n).astype(np.float32)
    start = (0.5 * grad + 0.25).astype(np.float32)

    g = sx.ShardGroup(f"local://bench-ds-cpu-adam-{os.getpid()}", backend="cpu", num_threads=threads)
    g.add_param_group("adamw", lr=1e-3, weight_decay=0.01)
    g.add_param("w", (n,))
    g.finalize()
    g.param_view(0)[:] = start
    g.grad_view(0)[:] = grad

    p = torch.nn.Parameter(torch.from_numpy(start.copy()))
    p.grad = torch.from_numpy(grad.copy())
    ds = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01, adamw_mode=True)

    def time_sx():
        t0 = time.perf_counter()
        g.step(keep_grads=True)
        return time.perf_counter() - t0

    def time_ds():
        t0 = time.perf_counter()
        ds.step()
        return time.perf_counter() - t0

    time_sx(), time_ds()  # the state is allocated at the first step
    t_sx, t_ds, ratio = [], [], []
    for r in range(args.reps):
        if r % 2 == 0:
            a, b = time_sx(), time_ds()
        else:
            b, a = time_ds(), time_sx()
        t_sx.append(a)
        t_ds.append(b)
        ratio.append(b / a)
    # The same update: after as many steps, the params agree to fp32 rounding.
    diff = float(np.max(np.abs(g.param_view(0) - p.detach().numpy())))
    g.close()
    moved = n * 7 * 4  # p, g, exp_avg, exp_avg_sq read; p, exp_avg, exp_avg_sq written
    ms_sx, ms_ds = statistics.median(t_sx) * 1e3, statistics.median(t_ds) * 1e3
    print(f"deepspeed_cpu_adam: {n} fp32 elements, {threads} threads, {args.reps} reps in alternation; "
          f"deepspeed {__import__('deepspeed').__version__}, torch {torch.__version__}")
    print(f"{'optimizer':<18} {'step_ms':>9} {'GB/s':>8}")
    print(f"{'sx (sx_step)':<18} {ms_sx:9.2f} {moved / ms_sx * 1e-6:8.2f}")
    print(f"{'DeepSpeedCPUAdam':<18} {ms_ds:9.2f} {moved / ms_ds * 1e-6:8.2f}")
    print(f"DeepSpeedCPUAdam's time / sx's: {statistics.median(ratio):.3f} (median of per-rep ratios); "
          f"largest param difference after {args.reps + 1} steps: {diff:.3g}")
    print(json.dumps({"bench": "deepspeed_cpu_adam", "elements": n, "threads": threads, "reps": args.reps,
                      "sx_step_ms": round(ms_sx, 3), "deepspeed_step_ms": round(ms_ds, 3),
                      "ratio_deepspeed_vs_sx": round(statistics.median(ratio), 4),
                      "max_param_difference": diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
