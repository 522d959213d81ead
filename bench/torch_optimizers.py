#!/usr/bin/env python3
"""torch's optimizers on the CPU, each in its fastest implementation on this machine:
the peer of bench_sx's optimizers section, which runs this script in the same run.

For each class (torch.optim's AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam, and
lion-pytorch's Lion where installed) one fp32 parameter of N elements with a gradient,
each class's default hyperparameters; each implementation torch has for it on the CPU
(the single-tensor loop, foreach=True, fused=True where the class takes it) is timed
over R steps after 2 warm-up steps, and its fastest step kept. One JSON line per class:
the fastest implementation and its time. Exits 0 with a message where torch is missing.

With --torchao it times torchao's AdamW8bit instead (its step compiled by torch.compile
on the first call; weight decay 0.01): the peer of bench_sx's state_dtype section.

usage: bench/torch_optimizers.py [--elements N] [--reps R] [--threads T] [--torchao]
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: torch's default)")
    ap.add_argument("--torchao", action="store_true", help="time torchao's AdamW8bit alone")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_optimizers: skipped: PyTorch is not installed ({e})")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    classes = [torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop, torch.optim.Adamax,
               torch.optim.NAdam, torch.optim.RAdam]
    try:
        from lion_pytorch import Lion
        classes.append(Lion)
    except ImportError:
        pass
    if args.torchao:
        try:
            from torchao.optim import AdamW8bit
        except ImportError as e:
            print(f"torch_optimizers: skipped: torchao is not installed ({e})")
            return 0
        classes = [AdamW8bit]
    n = args.elements
    gen = torch.Generator().manual_seed(12345)
    for cls in classes:
        times = {}
        impls = (("single_tensor", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True}))
        if cls.__module__.startswith("torchao"):
            impls = (("compiled", {"weight_decay": 0.01}),)  # torchao's one implementation
        if cls.__module__.startswith("lion_pytorch"):
            impls = (("update_fn", {}),)  # lion-pytorch's one CPU implementation
        for impl, kw in impls:
            p = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
            p.grad = torch.rand(n, generator=gen) * 2 - 1
            try:
                opt = cls([p], **kw)
                opt.step()
            except (TypeError, RuntimeError, ValueError):  # the class has no such implementation
                continue
            opt.step()
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                opt.step()
                best = min(best, time.perf_counter() - t0)
            times[impl] = best * 1e3
            del opt, p
        fastest = min(times, key=times.get)
        print(json.dumps({"bench": "torch_optimizers", "class": cls.__name__, "torch": torch.__version__,
                          "threads": torch.get_num_threads(), "elements": n, "reps": args.reps,
                          "fastest": fastest, "ms": round(times[fastest], 4),
                          "implementations_ms": {k: round(v, 4) for k, v in times.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
