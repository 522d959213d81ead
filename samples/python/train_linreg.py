#!/usr/bin/env python3
"""The bindings' sample in Python: a linear regression trained by 4 ranks (threads of
this process) with ZeRO-2 AdamW. samples/LINREG.md specifies every number; the
arithmetic is plain Python floats (IEEE double), so the losses match the C reference
(samples/c/train_linreg.c) to the last bit and checkpoints can be exchanged with the
other languages' samples.

usage: train_linreg.py [--steps N] [--save DIR] [--load DIR]
"""
import argparse
import os
import struct
import sys
import threading

import sx

RANKS, OUT, IN, BATCH = 4, 8, 16, 4
MASK64 = (1 << 64) - 1


class Rng:
    """The 64-bit LCG of LINREG.md."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & MASK64
        return float(self.state >> 11) * 2.0 ** -53 * 2.0 - 1.0


def teacher():
    rng = Rng(7)
    w = [[rng.next() for _ in range(IN)] for _ in range(OUT)]
    b = [rng.next() for _ in range(OUT)]
    return w, b


def run_rank(rank, args, rendezvous, print_lock):
    tw, tb = teacher()
    with sx.ShardGroup(rendezvous, rank, RANKS, stage=2, backend="cpu", num_threads=1) as g:
        g.add_param_group("adamw", lr=0.05)
        g.add_param("w", [OUT, IN], unit=0)
        g.add_param("b", [OUT], unit=1)
        g.finalize()
        w, b = g.param_view("w"), g.param_view("b")      # zero-copy, shaped [8, 16] and [8]
        dw, db = g.grad_view("w"), g.grad_view("b")

        step = 0
        if args.load:
            g.load(args.load)
            blob = sx.read_user_blob(args.load)
            if len(blob) != 8:
                raise SystemExit(f"{args.load}: user blob is {len(blob)} bytes, expected 8")
            step = struct.unpack("<Q", blob)[0]
        else:
            init = Rng(1)
            for i in range(OUT):
                for j in range(IN):
                    w[i, j] = 0.1 * init.next()           # rounded to fp32 by the view
            for i in range(OUT):
                b[i] = 0.1 * init.next()

        for _ in range(args.steps):
            wl, bl = w.tolist(), b.tolist()               # fp32 widened to double
            gw = [[0.0] * IN for _ in range(OUT)]
            gb = [0.0] * OUT
            loss = 0.0
            data = Rng(step * 4096 + rank * 64 + 1)
            for _n in range(BATCH):
                x = [data.next() for _ in range(IN)]
                for i in range(OUT):
                    y, t = bl[i], tb[i]
                    wi, twi = wl[i], tw[i]
                    for j in range(IN):
                        y += wi[j] * x[j]
                        t += twi[j] * x[j]
                    diff = y - t
                    loss += diff * diff / (OUT * BATCH)
                    d = 2.0 * diff / (OUT * BATCH)
                    gwi = gw[i]
                    for j in range(IN):
                        gwi[j] += d * x[j]
                    gb[i] += d
            for i in range(OUT):
                for j in range(IN):
                    dw[i, j] = gw[i][j]
                db[i] = gb[i]
            if rank == 0:
                bits = struct.unpack("<Q", struct.pack("<d", loss))[0]
                with print_lock:
                    print(f"step {step} loss {loss:.6f} bits {bits:016x}", flush=True)
            g.step()
            step += 1

        if args.save:
            with g.save(args.save, user_blob=struct.pack("<Q", step)) as future:
                future.wait()
            if rank == 0:
                print(f"saved {args.save}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps to run (default 20)")
    parser.add_argument("--save", metavar="DIR", help="save a checkpoint to DIR after training")
    parser.add_argument("--load", metavar="DIR", help="load the checkpoint DIR before training")
    args = parser.parse_args()
    rendezvous = f"local://linreg-{os.getpid()}"
    print_lock = threading.Lock()
    failures = []

    def rank_main(rank):
        try:
            run_rank(rank, args, rendezvous, print_lock)
        except (Exception, SystemExit) as e:  # report every failure, keep the other ranks going
            print(f"rank {rank}: {e}", file=sys.stderr)
            failures.append(rank)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
