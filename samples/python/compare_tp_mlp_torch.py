"""The MLP of samples/c/train_tp_mlp.c trained by torch's own tensor and data parallelism
(DTensor's ColwiseParallel and RowwiseParallel over a 2 x 2 device mesh, FSDP2's
fully_shard over its data-parallel dimension, gloo on the CPU), compared with the run
train_tp_mlp recorded.

    build/release/samples/c/train_tp_mlp --dir DIR
    torchrun --standalone --nproc-per-node=4 samples/python/compare_tp_mlp_torch.py DIR/uninterrupted

The same model, initial values, data, AdamW and clipping as the C sample (its constants
are repeated here). torch's clip_grad_norm_ refuses these params: the layer norm's live on
the data-parallel mesh and fc1's and fc2's on the 2-D mesh, and it stacks their norms
("All operands in aten.stack.default must have the same mesh"; torchtune#2420). The norm
is therefore taken by hand, each param's made whole (full_tensor) before the sum, and
the coefficient clip_grad_norm_'s, max_norm / (norm + 1e-6) capped at 1.

torch computes the forward and backward in float32 where the C sample computes them in
double and rounds the gradients once, so the two agree to float32's rounding, not to
the bit (here: 2.2e-7 for the losses, 1.7e-7 for the norms, 3.0e-7 for the params). The
script prints the largest relative differences (losses and norms each against its own
value, params against each tensor's largest magnitude, as train_tp_mlp compares) and
fails where one is above TOLERANCE, the sample's own bound.
"""
import math
import struct
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

D_IN, HIDDEN, D_OUT, GLOBAL_BATCH, STEPS = 8, 16, 4, 8, 20
MAX_GRAD_NORM, LR, WEIGHT_DECAY, LN_EPS = 0.05, 1e-2, 0.1, 1e-5
TOLERANCE = 1e-6
NAMES = ["ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
SHAPES = [(D_IN,), (D_IN,), (HIDDEN, D_IN), (HIDDEN,), (D_OUT, HIDDEN), (D_OUT,)]


def inp(step, e, k):
    return math.sin(1.3 * (step + 1) + 0.7 * e + 1.1 * k) * (1.0 + 0.25 * k)


def target(step, e, o):
    a = sum(math.cos(0.8 * o + 0.3 * k) * inp(step, e, k) for k in range(D_IN))
    return math.tanh(0.3 * a) + 0.5 * math.cos(2.3 * step + 1.7 * e + 0.9 * o)


def init_value(name, i, j):
    return {
        "ln.weight": lambda: 1.0 + 0.1 * math.sin(1.0 * i),
        "ln.bias": lambda: 0.05 * math.cos(1.0 * i),
        "fc1.weight": lambda: 0.35 * math.sin(0.9 * i + 0.5 * j + 0.1),
        "fc1.bias": lambda: 0.02 * math.sin(2.0 * i),
        "fc2.weight": lambda: 0.25 * math.cos(0.7 * i + 0.3 * j + 0.2),
        "fc2.bias": lambda: 0.1 * (i + 1) - 0.2,
    }[name]()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D_IN, eps=LN_EPS)
        self.fc1 = nn.Linear(D_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, D_OUT)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(self.ln(x)), approximate="tanh"))


def read_summary(path):
    """train_tp_mlp's record: STEPS losses and STEPS norms (doubles), then the model's
    params in NAMES' order, row-major (floats), in the machine's byte order."""
    with open(path, "rb") as f:
        data = f.read()
    n = sum(math.prod(s) for s in SHAPES)
    losses = struct.unpack_from(f"={STEPS}d", data, 0)
    norms = struct.unpack_from(f"={STEPS}d", data, 8 * STEPS)
    flat = struct.unpack_from(f"={n}f", data, 16 * STEPS)
    params, at = {}, 0
    for name, shape in zip(NAMES, SHAPES):
        size = math.prod(shape)
        params[name] = torch.tensor(flat[at:at + size], dtype=torch.float64).reshape(shape)
        at += size
    return losses, norms, params


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    d = mesh.get_local_rank("dp")
    model = MLP()
    with torch.no_grad():
        for name, p in model.named_parameters():
            for idx in range(p.numel()):
                i, j = divmod(idx, p.shape[1]) if p.dim() == 2 else (idx, 0)
                p.view(-1)[idx] = init_value(name, i, j)
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    decay = [p for n, p in model.named_parameters() if n in ("fc1.weight", "fc2.weight")]
    no_decay = [p for n, p in model.named_parameters() if n not in ("fc1.weight", "fc2.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    half = GLOBAL_BATCH // 2
    losses, norms = [], []
    for step in range(STEPS):
        x = torch.tensor([[inp(step, e, k) for k in range(D_IN)] for e in range(d * half, (d + 1) * half)])
        t = torch.tensor([[target(step, e, o) for o in range(D_OUT)] for e in range(d * half, (d + 1) * half)])
        loss = 0.5 * ((model(x) - t) ** 2).sum(-1).mean()
        loss.backward()
        squares = [p.grad.norm() ** 2 for p in model.parameters()]
        norm = torch.stack([s.full_tensor() if isinstance(s, DTensor) else s for s in squares]).sum().sqrt()
        coef = torch.clamp(MAX_GRAD_NORM / (norm + 1e-6), max=1.0)
        for p in model.parameters():
            p.grad.mul_(coef)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())  # each data-parallel rank's loss on both slices
        norms.append(norm.item())
    params = {n: p.full_tensor().detach().double() for n, p in model.named_parameters()}
    if dist.get_rank() == 0:
        want_losses, want_norms, want_params = read_summary(sys.argv[1])
        rel = lambda a, b: abs(a - b) / abs(b)
        dl = max(rel(a, b) for a, b in zip(losses, want_losses))
        dn = max(rel(a, b) for a, b in zip(norms, want_norms))
        dp = max(((params[n] - want_params[n]).abs().max() / want_params[n].abs().max()).item() for n in NAMES)
        equal = max(dl, dn, dp) <= TOLERANCE
        print(f"torch DTensor TP=2 x FSDP2 DP=2 (gloo, CPU) against train_tp_mlp: max relative difference of the "
              f"losses {dl:.2e}, of the gradient norms {dn:.2e}, of the params {dp:.2e} "
              f"(<= {TOLERANCE:.0e}: {'equal' if equal else 'DIFFERENT'})", flush=True)
    else:
        equal = True
    flag = torch.tensor([0 if equal else 1])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    sys.exit(int(flag.item()))


if __name__ == "__main__":
    main()
