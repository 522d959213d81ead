"""sx's Hugging Face checkpoints and PEFT adapters against the real libraries (peft,
transformers, safetensors), with a tiny Llama built locally from a config (nothing is
downloaded):

- a LoRA model's params live in sx (sx.torch.ShardedOptimizer), train a few steps there,
  and sx writes the adapter (save_adapter); peft's PeftModel.from_pretrained loads it onto
  a fresh copy of the base model and gives the same outputs as the model with sx's params;
- transformers' save_pretrained(max_shard_size=...) in fp32, bf16 and fp16 (sharded, with
  its index) loads into sx's params by name (load_pretrained), equal to the model's
  params in the file's dtype; and sx's own save_pretrained in each dtype loads with
  transformers' from_pretrained, equal to sx's params;
- sx reads peft's own save_pretrained of an adapter back (load_adapter), and the plain
  binding (sx.import_hf) names missing and unexpected keys and changes nothing;
- the same with 2 ranks as threads at stage 3 (the plain binding's export and import).

Run with the Python of a torch environment that has peft, transformers and safetensors
(scripts/test.sh installs them), SX_LIBRARY pointing at libsx and PYTHONPATH at the
binding (ctest's test_hf_interop_torch does)."""
import itertools
import json
import os
import shutil
import tempfile
import threading

import torch
import peft
import safetensors.torch
import transformers

import sx
import sx.torch

_names = itertools.count()


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


def optimizer(model, **kw):
    return sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, rendezvous=f"local://hf-{next(_names)}",
                                     rank=0, world_size=1, **kw)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def check_adapter_out(tmp):
    """sx writes a LoRA adapter that peft loads onto its base, giving sx's outputs."""
    base = tiny_llama(1)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, lora)
    opt = optimizer(model)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    model.train()
    for _ in range(3):  # lora_B starts at zero: training makes the adapter matter
        opt.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
    model.eval()
    want = logits(model, ids)
    path = os.path.join(tmp, "adapter")
    opt.save_adapter(path, model.peft_config["default"])
    with open(os.path.join(path, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["r"] == 4 and config["peft_type"] == "LORA", config
    keys = safetensors.torch.load_file(os.path.join(path, "adapter_model.safetensors")).keys()
    assert keys and all("lora_" in k and ".default." not in k for k in keys), sorted(keys)
    fresh = tiny_llama(1)
    fresh.load_state_dict(base_state)
    loaded = peft.PeftModel.from_pretrained(fresh, path).eval()
    got = logits(loaded, ids)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    # The base alone gives other outputs: the adapter's values are what made them equal.
    plain = tiny_llama(1)
    plain.load_state_dict(base_state)
    assert (logits(plain, ids) - want).abs().max() > 1e-3
    print("adapter: peft loads sx's adapter onto the base, same outputs (max diff "
          f"{(got - want).abs().max().item():.2e})")

    # peft's own save of the adapter reads back into sx (load_adapter), after sx's params changed.
    peft_dir = os.path.join(tmp, "peft-own")
    model.save_pretrained(peft_dir)
    lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
    saved = [p.detach().clone() for p in lora_params]
    with torch.no_grad():
        for p in lora_params:
            p.add_(1.0)
    result = opt.load_adapter(peft_dir)
    assert result.missing_keys == [] and result.unexpected_keys == [], result
    for p, s in zip(lora_params, saved):
        assert torch.equal(p.detach(), s)
    print("adapter: peft's save_pretrained loads back into sx's params, exactly")


def check_checkpoints_in(tmp):
    """transformers' sharded checkpoints in fp32, bf16 and fp16 load into sx by name."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        source = tiny_llama(2)
        path = os.path.join(tmp, f"hf-{dtype}")
        source.to(dtype).save_pretrained(path, max_shard_size="20KB")
        index = os.path.join(path, "model.safetensors.index.json")
        assert os.path.exists(index), os.listdir(path)
        with open(index) as f:
            shards = set(json.load(f)["weight_map"].values())
        assert len(shards) > 1, shards
        target = tiny_llama(5)
        opt = optimizer(target)
        result = opt.load_pretrained(path)
        assert result.missing_keys == [] and result.unexpected_keys == [], result
        for (name, p), (_, q) in zip(target.named_parameters(), source.named_parameters()):
            assert torch.equal(p.detach(), q.detach().float()), name
        print(f"checkpoint in: transformers' {dtype} save in {len(shards)} shards loads into sx's params exactly")

        # And out: sx's save_pretrained in this dtype loads with transformers' from_pretrained.
        out = os.path.join(tmp, f"sx-{dtype}")
        opt.save_pretrained(out, dtype=dtype, max_shard_size="20KB")
        # sx writes the weights; the architecture (config.json) is the model's own to write.
        target.config.save_pretrained(out)
        target.generation_config.save_pretrained(out)
        back = transformers.LlamaForCausalLM.from_pretrained(out, dtype=dtype)
        for (name, p), (_, q) in zip(back.named_parameters(), target.named_parameters()):
            assert p.dtype == dtype and torch.equal(p.detach(), q.detach().to(dtype)), name
        print(f"checkpoint out: sx's {dtype} save loads with transformers' from_pretrained, equal")


def check_bad_input(tmp):
    """Missing and unexpected keys are named, and nothing changes."""
    model = tiny_llama(6)
    opt = optimizer(model)
    path = os.path.join(tmp, "partial.safetensors")
    state = {k: v.clone() for k, v in tiny_llama(7).state_dict().items() if "layers.1." not in k}
    state["lm_head.extra"] = torch.zeros(3)
    safetensors.torch.save_file(state, path, metadata={"format": "pt"})
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt.load_pretrained(path)
    except sx.NotFoundError as e:
        assert "model.layers.1.self_attn.q_proj.weight" in str(e) and "lm_head.extra" in str(e), str(e)
        assert "lm_head.extra" in e.report.unexpected_keys, e.report
    else:
        raise AssertionError("a checkpoint without layer 1 loaded")
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    result = opt.load_pretrained(path, strict=False)
    assert "model.layers.1.mlp.up_proj.weight" in result.missing_keys and result.unexpected_keys == ["lm_head.extra"]
    print("bad input: missing and unexpected keys are named; a refused load changes nothing")


def check_two_ranks_at_stage_3(tmp):
    """2 ranks (threads) at stage 3 import a transformers checkpoint and export it again."""
    source = tiny_llama(8)
    path = os.path.join(tmp, "hf-w2")
    source.save_pretrained(path, max_shard_size="20KB")
    shapes = [(n, tuple(p.shape)) for n, p in source.named_parameters()]
    out = os.path.join(tmp, "sx-w2")
    errors = []
    rv = f"local://hf-w2-{os.getpid()}"

    def rank(r):
        try:
            g = sx.ShardGroup(rendezvous=rv, rank=r, world_size=2, stage=3, backend="cpu", num_threads=1)
            g.add_param_group("adamw")
            for i, (n, shape) in enumerate(shapes):
                g.add_param(n, shape, unit=i % 3)
            g.finalize()
            report = sx.import_hf(g, path)
            assert report.loaded == len(shapes) and not report.missing and not report.unexpected, report
            sx.export_hf(g, out, names={n: "renamed." + n for n, _ in shapes}, dtype="bf16")
            g.close()
        except Exception as e:  # noqa: BLE001  reported by the main thread
            errors.append(f"rank {r}: {e!r}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    back = safetensors.torch.load_file(os.path.join(out, "model.safetensors"))
    for n, p in source.named_parameters():
        assert torch.equal(back["renamed." + n], p.detach().to(torch.bfloat16)), n
    print("2 ranks at stage 3: a transformers checkpoint in, and out again in bf16 under a name map, equal")


def main():
    tmp = tempfile.mkdtemp(prefix="sx-hf-interop-")
    try:
        check_adapter_out(tmp)
        check_checkpoints_in(tmp)
        check_bad_input(tmp)
        check_two_ranks_at_stage_3(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
