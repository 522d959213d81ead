#!/usr/bin/env python3
"""A PEFT adapter out of and into sx against peft's own, in one run: export
(sx.torch's save_adapter, sx_export_peft) against PeftModel.save_pretrained (which does
not fsync; and against it followed by an fsync of its files and directory, which sx's
atomic export does), and import
(sx.torch's load_adapter, sx_import_hf) against PeftModel.load_adapter and against
set_peft_model_state_dict of safetensors' load_file (peft's load without its module
injection).

The model is a Llama built locally from a config (nothing is downloaded) with LoRA of
rank --rank on every linear layer, sized so that the adapter holds about --mib MiB of
fp32 values; its params live in sx (sx.torch.ShardedOptimizer, one rank). Each
repetition times every contender once into a fresh directory (which goes first
alternating); a ratio is the peer's time over sx's (> 1: sx is faster), the median of
the per-repetition ratios. The files stay in the page cache (warm): what is compared is
the libraries' work, not the disk's. Exits 0 with a message where peft, transformers or
sx is missing.

usage: SX_LIBRARY=build/release/src/libsx.so.1 PYTHONPATH=bindings/python \\
       bench/hf_adapters.py [--mib M] [--reps R] [--dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def build(mib, rank):
    import peft
    import torch
    import transformers
    torch.manual_seed(0)
    hidden, inter = 1024, 2816
    per_layer = rank * (4 * 2 * hidden + 3 * (hidden + inter))  # q, k, v, o; gate, up, down
    layers = max(1, round(mib * 2**20 / 4 / per_layer))
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    base = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, init_lora_weights=False,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(base, lora), lora


def fsync_tree(path):
    """What sx's export does and peft's save_pretrained does not: every file and the
    directory made durable."""
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    try:
        import peft
        import safetensors.torch
        import torch
        import sx.torch
    except (ImportError, OSError) as e:
        print(f"hf_adapters: skipped: {e}")
        return
    model, lora = build(args.mib, args.rank)
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3, rendezvous=f"local://hfa-{os.getpid()}",
                                    rank=0, world_size=1)
    adapter_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if "lora_" in n)
    root = tempfile.mkdtemp(prefix="sx-hf-adapters-", dir=args.dir)
    peer_dir = os.path.join(root, "peft")
    model.save_pretrained(peer_dir)  # the file the imports read
    times = {k: [] for k in ("sx export", "peft save_pretrained", "peft save_pretrained+fsync", "sx import",
                             "peft load_adapter", "peft set_state_dict")}
    try:
        for rep in range(args.reps):
            out_sx, out_peft = os.path.join(root, f"sx-{rep}"), os.path.join(root, f"peft-{rep}")
            out_durable = os.path.join(root, f"peft-fsync-{rep}")
            exports = [("sx export", lambda: opt.save_adapter(out_sx, lora)),
                       ("peft save_pretrained", lambda: model.save_pretrained(out_peft)),
                       ("peft save_pretrained+fsync", lambda: (model.save_pretrained(out_durable),
                                                               fsync_tree(out_durable)))]
            imports = [("sx import", lambda: opt.load_adapter(peer_dir)),
                       ("peft load_adapter", lambda: model.load_adapter(peer_dir, adapter_name=f"extra{rep}")),
                       ("peft set_state_dict", lambda: peft.set_peft_model_state_dict(
                           model, safetensors.torch.load_file(os.path.join(peer_dir, "adapter_model.safetensors"))))]
            for group in (exports, imports):
                for name, fn in (group if rep % 2 == 0 else group[::-1]):
                    times[name].append(timed(fn))
            model.delete_adapter(f"extra{rep}")
            model.set_adapter("default")
            for d in (out_sx, out_peft, out_durable):
                shutil.rmtree(d)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"hf_adapters: a LoRA adapter of {adapter_bytes / 2**20:.1f} MiB (fp32, rank {args.rank}), "
          f"one process; medians of {args.reps} repetitions, files in the page cache")
    print(f"{'figure':<32} {'sx':>10} {'peer':>10} {'ratio':>8}")
    for figure, ours, peer in (("export / save_pretrained", "sx export", "peft save_pretrained"),
                               ("export / save_pretrained+fsync", "sx export", "peft save_pretrained+fsync"),
                               ("import / load_adapter", "sx import", "peft load_adapter"),
                               ("import / set_state_dict", "sx import", "peft set_state_dict")):
        ratios = [p / s for p, s in zip(times[peer], times[ours])]
        s, p, r = statistics.median(times[ours]), statistics.median(times[peer]), statistics.median(ratios)
        print(f"{figure:<32} {s * 1e3:7.1f} ms {p * 1e3:7.1f} ms {r:8.2f}")
        print(json.dumps({"bench": "hf_adapters", "figure": figure, "adapter_mib": round(adapter_bytes / 2**20, 1),
                          "sx_ms": round(s * 1e3, 2), "peer_ms": round(p * 1e3, 2), "ratio": round(r, 3)}))


if __name__ == "__main__":
    sys.exit(main())
