"""A trainer as a launcher starts it (torchrun, mpirun, srun), through the Python
binding: one rank per process, a group formed over env:// with rank and world size from
the environment, a few ZeRO-2 AdamW steps, and this rank's params written to
OUT_DIR/params.<rank> for run_launchers.py to compare.

The model, which env_train.c follows to the bit: params w[37] (unit 0) and b[5]
(unit 1) start at 0; rank r's gradient at step s is p[i] - target(r, s, i), with
target = (r + 1) / 4 + i / 64 + s / 8 in double, rounded to fp32 by the view. Ranks
differ in their gradients, so equal params at the end mean the ranks reduced and
gathered together.

usage: env_train.py OUT_DIR [STEPS]
"""
import os
import sys

import sx

SIZES = {"w": 37, "b": 5}


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__.strip().splitlines()[-1])
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) == 3 else 5
    with sx.ShardGroup("env://", 0, 0, stage=2, backend="cpu", num_threads=1, timeout_ms=60000) as g:
        g.add_param_group("adamw", lr=0.1)
        for unit, (name, size) in enumerate(SIZES.items()):
            g.add_param(name, [size], unit=unit)
        g.finalize()
        params = [g.param_view(name) for name in SIZES]
        grads = [g.grad_view(name) for name in SIZES]
        rank = g.rank
        for s in range(steps):
            for p, d in zip(params, grads):
                values = p.tolist()  # fp32 widened to double
                for i, v in enumerate(values):
                    d[i] = v - ((rank + 1) / 4 + i / 64 + s / 8)
            g.step()
        with open(os.path.join(out_dir, f"params.{rank}"), "wb") as f:
            for p in params:
                f.write(p.tobytes())
        print(f"rank {rank} of {g.world_size}: {steps} steps, w[0] = {params[0][0]:.9g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
