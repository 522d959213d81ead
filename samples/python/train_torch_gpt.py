"""A small GPT (character level) trained by sx.torch at ZeRO stage 3 under torchrun, saved,
and resumed at another number of processes on the same loss curve.

    torchrun --standalone --nproc-per-node=2 samples/python/train_torch_gpt.py \
        --steps 40 --save-at 20 /tmp/gpt-ckpt
    torchrun --standalone --nproc-per-node=1 samples/python/train_torch_gpt.py \
        --steps 40 --resume /tmp/gpt-ckpt/step-20

The text is a file on this machine (--text, by default the GPL's text, which Debian puts
in every system); its characters are the vocabulary. The model: token and position
embeddings, --layers blocks of causal self-attention and an MLP (pre-LayerNorm), a final
LayerNorm and a head. Each block is a unit of its own (auto_wrap_policy), gathered
around its forward and backward: a process holds its 1/N shard of the params and the
blocks in use.

Every step takes one global batch of --batch sequences, the same whatever the number of
processes: each process takes its share of the rows, and the gradients averaged over the
processes are those of the whole batch. So a run resumed at another world size goes on
as the uninterrupted run does (to the rounding of the sums' order). Each step prints the
global batch's loss; --losses FILE also writes them, one per line, "step loss".
"""
import argparse
import math
import os
import pickle
import sys

import torch
import torch.nn.functional as F

import sx
import sx.torch


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, context, d, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step, over every process")
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--save-at", type=int, default=0, help="save after this step (with a checkpoint dir)")
    ap.add_argument("--resume", default=None, help="a checkpoint this sample saved, at any world size")
    ap.add_argument("--losses", default=None, help="also write 'step loss' lines here (rank 0)")
    ap.add_argument("ckpt", nargs="?", default=None, help="where --save-at saves")
    args = ap.parse_args()

    with open(args.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)

    torch.manual_seed(0)
    model = GPT(len(chars), args.context, args.dim, args.layers, heads=4)
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=3e-3, weight_decay=0.01, max_grad_norm=1.0,
                                    stage=3, auto_wrap_policy=lambda m: isinstance(m, Block))
    rank, world = opt.group.rank, opt.group.world_size
    if args.batch % world:
        sys.exit(f"--batch {args.batch} must divide among {world} processes")
    first = 0
    if args.resume:
        opt.load(args.resume)  # params and AdamW state, resharded to this many processes
        first = int(pickle.loads(sx.read_user_blob(args.resume))["step"])
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    share = args.batch // world
    out = open(args.losses, "a") if args.losses and rank == 0 else None
    for step in range(first, args.steps):
        # The global batch of this step, whatever the world size; this process's rows.
        g = torch.Generator().manual_seed(step)
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=g)
        rows = starts[rank * share:(rank + 1) * share]
        x = torch.stack([data[s:s + args.context] for s in rows])
        y = torch.stack([data[s + 1:s + 1 + args.context] for s in rows])
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        loss.backward()
        opt.step()
        total = opt.group.all_reduce(loss.item(), "mean")  # the global batch's loss
        if rank == 0:
            print(f"step {step + 1} loss {total:.6f}", flush=True)
            if out:
                out.write(f"{step + 1} {total:.9g}\n")
        if args.ckpt and step + 1 == args.save_at:
            path = os.path.join(args.ckpt, f"step-{step + 1}")
            os.makedirs(args.ckpt, exist_ok=True)
            opt.save(path, pickle.dumps({"step": step + 1}), synchronous=True).wait()
            if rank == 0:
                print(f"saved {path}", flush=True)
    if out:
        out.close()
    print(f"rank {rank} of {world}: param bytes held at once: {opt.group.memory_stats().peak_param_bytes} by sx "
          f"(its shards and the units gathered), {opt.peak_param_bytes} in the modules; the model has "
          f"{model_bytes} in {opt.group.num_units} units", flush=True)
    if not math.isfinite(total):
        sys.exit("the loss is not finite")


if __name__ == "__main__":
    main()
