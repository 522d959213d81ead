#!/usr/bin/env python3
"""sx_load_optim_state against torch.load of the same state as one file, in one run:
the peer of bench_sx's load section (sx's goal: at least as fast, cold and warm).

The state is one AdamW param of E fp32 elements: its values and two optimizer states
(12 bytes an element; --mib sets 12*E). It is saved by sx with F ranks (threads of this
process over local://) and loaded by F/2, for F = 2 and 4; the peer is each loading
rank's torch.load of its part (values, exp_avg, exp_avg_sq of its shard), saved by
torch.save as one file of its own. Each repetition times both, which goes first
alternating; a time is the slowest rank's. "cold": every file's pages are dropped from
the page cache before each run (posix_fadvise DONTNEED on fsynced files); "warm": they
stay cached. The ratio is torch.load's time over sx's (> 1: sx is faster), the median
of the per-repetition ratios. Exits 0 with a message where PyTorch or sx is missing.

usage: SX_LIBRARY=build/release/src/libsx.so.1 PYTHONPATH=bindings/python \\
       bench/torch_load.py [--mib M] [--reps R] [--dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time


def drop(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d))]


def on_ranks(n, fn):
    """fn(rank) on n threads at once; returns their results, re-raising the first error."""
    out, errors = [None] * n, []

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return out


def make_group(sx, url, rank, world, n, step):
    g = sx.ShardGroup(url, rank, world, num_threads=2 if world == 1 else 1, timeout_ms=600000)
    g.add_param_group("adamw")
    g.add_param("w", (n,))
    g.finalize()
    p, gr = g.param_view("w"), g.grad_view("w")
    import numpy  # torch and sx's views need it: imported where main() checked them
    i = numpy.arange(n, dtype="int64")
    p[:] = (i % 1000) * 1e-3
    gr[:] = ((i * 7) % 1000 - 500) * 1e-4
    if step:
        g.step(keep_grads=True)
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=384)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    try:
        import numpy  # noqa: F401 - checked here, used by make_group
        import sx
        import torch
    except ImportError as e:
        print(f"torch_load: skipped: {e}")
        return 0
    n = (args.mib << 20) // 12 // 4096 * 4096
    root = tempfile.mkdtemp(prefix="sx-torchload-", dir=args.dir)
    rows = []
    try:
        for frm in (2, 4):
            to = frm // 2
            saved = os.path.join(root, f"saved-by-{frm}")
            url = f"local://torch-load-{os.getpid()}-{frm}"

            def save_rank(r):
                g = make_group(sx, url + "-save", r, frm, n, True)
                g.save(saved, synchronous=True).wait()
                g.close()

            on_ranks(frm, save_rank)
            # Loading rank r's part, as torch.save writes it: elements [r*n/to, (r+1)*n/to)
            # of the values and of each state.
            loaders = on_ranks(to, lambda r: make_group(sx, url + "-load", r, to, n, False))
            on_ranks(to, lambda r: loaders[r].load(saved))
            torch_files = []
            for r in range(to):
                lo, hi = r * n // to, (r + 1) * n // to
                g = loaders[r]
                part = {"w": torch.from_numpy(g.param_view("w")[lo:hi].copy()),
                        "exp_avg": torch.from_numpy(g.state_view("w", "exp_avg").copy()),
                        "exp_avg_sq": torch.from_numpy(g.state_view("w", "exp_avg_sq").copy())}
                path = os.path.join(root, f"torch-{frm}-{r}.pt")
                torch.save(part, path)
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                torch_files.append(path)
            everything = files_under(saved) + torch_files
            for cold in (True, False):
                sx_t, torch_t = [], []
                for it in range(args.reps + 1):
                    for side in ((0, 1) if it % 2 == 0 else (1, 0)):
                        if cold:
                            drop(everything)
                        if side == 0:
                            times = on_ranks(to, lambda r: timed(lambda: loaders[r].load(saved)))
                        else:
                            times = on_ranks(to, lambda r: timed(lambda: torch.load(torch_files[r])))
                        if it:
                            (sx_t if side == 0 else torch_t).append(max(times))
                ratio = statistics.median(t / s for s, t in zip(sx_t, torch_t))
                rows.append((f"load_{frm}to{to}_{'cold' if cold else 'warm'}", frm, to, cold,
                             statistics.median(sx_t), statistics.median(torch_t), ratio))
            for g in loaders:
                g.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"torch_load: {args.mib} MiB of values + 2 AdamW states; the slower loading rank; medians of "
          f"{args.reps} repetitions; torch {torch.__version__}; under {args.dir}")
    print(f"{'figure':<16} {'sx_load_optim_state':>20} {'torch.load':>12} {'ratio':>8} {'goal':>6}")
    for name, frm, to, cold, s, t, ratio in rows:
        print(f"{name:<16} {s * 1e3:17.1f} ms {t * 1e3:9.1f} ms {ratio:8.3f} {'>= 1.0':>6}")
    for name, frm, to, cold, s, t, ratio in rows:
        print(json.dumps({"bench": "torch_load", "figure": name, "from_ranks": frm, "to_ranks": to,
                          "page_cache": "cold" if cold else "warm", "reps": args.reps,
                          "sx_load_ms": round(s * 1e3, 3), "torch_load_ms": round(t * 1e3, 3),
                          "ratio": round(ratio, 4), "goal_min": 1.0}))
    return 0


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
