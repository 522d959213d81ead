"""The fine-tune service over real HTTP (ctest sample_go_finetune), against transformers and
peft themselves.

A tiny LlamaForCausalLM is built from a local config (random init, fixed seed; nothing is
downloaded) and saved with save_pretrained. The service (the Go binary) starts on a free
loopback port; three jobs are posted at once, with bad descriptions beside them (each
refused with 400 naming what was wrong); one job is cancelled mid-run. Then:

- every job was a group of the service's one context (GET /stats), over 2 ranks;
- the finished jobs ran every step, the cancelled one stopped at a step boundary with its
  checkpoint and adapter written;
- each job's losses, as its progress stream printed them, equal those of the same job run
  alone (sx-finetune -run-one; the cancelled one's, of a run of as many steps), and its
  adapter's tensors equal the lone run's;
- each job's adapter, fetched over HTTP as a tar, loads with PeftModel.from_pretrained onto
  the base, and gives the logits the Go model gave with the trained params (max abs diff
  <= 1e-4), which differ from the base model's.

usage: test_service.py SX_FINETUNE_BINARY
"""
import http.client
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import torch
import peft
import safetensors.torch
import transformers

TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
    "single step. To be or not to be, that is the question. All that glitters is not gold. "
    "Where there is a will there is a way. Knowledge is power, and time is money. "
)


def make_base(path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, initializer_range=0.1)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


class Client:
    def __init__(self, port):
        self.port = port

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    def json(self, method, path, obj=None, raw=None):
        body = raw if raw is not None else (json.dumps(obj).encode() if obj is not None else None)
        status, data = self.request(method, path, body)
        return status, json.loads(data)

    def follow(self, job_id, on_line):
        """Reads the job's progress stream line by line until it ends; returns the lines."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request("GET", f"/jobs/{job_id}/progress")
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        assert resp.getheader("Content-Type") == "application/x-ndjson", resp.getheader("Content-Type")
        lines = []
        while True:
            line = resp.readline()
            if not line:
                break
            lines.append(json.loads(line))
            on_line(lines[-1])
        conn.close()
        return lines


def start_service(binary, workdir):
    proc = subprocess.Popen([binary, "-addr", "127.0.0.1:0", "-workdir", workdir], stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert line.startswith("sx-finetune: serving http://127.0.0.1:"), line
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    return proc, Client(port)


def check_bad_configs(client, base, data):
    """Each bad description is refused with 400, its message naming what was wrong."""
    good = {"base": base, "data": data, "steps": 5}
    cases = [
        ({**good, "lora_rank": 0}, "lora_rank"),
        ({**good, "lr": -0.1}, "lr"),
        ({**good, "base": base + "-missing"}, "base"),
        ({k: v for k, v in good.items() if k != "base"}, "base"),
        ({**good, "data": data + ".missing"}, "data"),
        ({**good, "learning_rate": 0.1}, "unknown field \"learning_rate\""),
        ({**good, "batch": 3}, "batch"),
        ({**good, "steps": "ten"}, "steps"),
    ]
    for body, named in cases:
        status, answer = client.json("POST", "/jobs", body)
        assert status == 400, (body, status, answer)
        assert answer["error"].startswith(named) or named in answer["error"], (named, answer)
    status, answer = client.json("POST", "/jobs", raw=b'{"base": ')
    assert status == 400 and "malformed JSON" in answer["error"], (status, answer)


def run_jobs(client, jobs, cancel_name, cancel_after):
    """Posts the jobs and a bad one at once, follows every stream, cancels one mid-run."""
    ids, streams, errors = {}, {}, []
    posted = threading.Barrier(len(jobs) + 1)

    def post(name, body):
        try:
            posted.wait()
            status, answer = client.json("POST", "/jobs", body)
            if body.get("lora_rank") == -2:
                assert status == 400 and answer["error"].startswith("lora_rank:"), (status, answer)
                return
            assert status == 201, (status, answer)
            ids[name] = answer["id"]

            def on_line(line):
                if name == cancel_name and line.get("step") == cancel_after:
                    status, answer = client.json("POST", f"/jobs/{ids[name]}/cancel")
                    assert status == 202, (status, answer)
            streams[name] = client.follow(answer["id"], on_line)
        except BaseException as e:  # reported by the main thread
            errors.append((name, e))

    bad = dict(jobs[cancel_name], lora_rank=-2)
    threads = [threading.Thread(target=post, args=item) for item in list(jobs.items()) + [("bad", bad)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return ids, streams


def check_stream(name, lines, cfg, cancelled):
    *progress, final = lines
    steps = [p["step"] for p in progress]
    assert steps == list(range(1, len(steps) + 1)), (name, steps)
    assert all(p["loss"] > 0 and p["tokens_per_second"] > 0 for p in progress), (name, progress[:3])
    if cancelled:
        assert final["state"] == "cancelled" and 0 < final["step"] < cfg["steps"], (name, final)
    else:
        assert final["state"] == "finished" and final["step"] == cfg["steps"], (name, final)
        assert progress[-1]["loss"] < progress[0]["loss"], (name, progress[0], progress[-1])
    assert final["step"] == len(progress), (name, final)
    ckpt, adapter = final["checkpoint"], final["adapter"]
    assert os.path.isdir(ckpt) and os.listdir(ckpt), (name, ckpt)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.path.isfile(os.path.join(adapter, f)), (name, adapter)
    return [p["loss"] for p in progress], final


def run_alone(binary, tmp, name, cfg):
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, f"alone-{name}")
    subprocess.run([binary, "-run-one", path, "-out", out], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "losses.json")) as f:
        return json.load(f), os.path.join(out, "adapter")


def check_adapter(client, job_id, base, base_state, tmp):
    """The adapter, fetched as a tar, loads in peft and gives the Go model's logits."""
    status, data = client.request("GET", f"/jobs/{job_id}/adapter")
    assert status == 200, (status, data[:200])
    target = os.path.join(tmp, f"fetched-{job_id}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == ["adapter_config.json", "adapter_model.safetensors"], tar.getnames()
        tar.extractall(target)
    status, probe = client.json("GET", f"/jobs/{job_id}/logits")
    assert status == 200, status
    ids = torch.tensor([probe["input_ids"]])
    want = torch.tensor(probe["logits"])
    with torch.no_grad():
        plain = base(input_ids=ids).logits[0]
        fresh = transformers.LlamaForCausalLM(base.config).eval()
        fresh.load_state_dict(base_state)
        model = peft.PeftModel.from_pretrained(fresh, target).eval()
        got = model(input_ids=ids).logits[0]
    diff = (got - want).abs().max().item()
    moved = (got - plain).abs().max().item()
    assert diff <= 1e-4, f"{job_id}: peft's logits differ from the Go model's by {diff}"
    assert moved > 1e-3, f"{job_id}: the adapter changes the logits by only {moved}"
    return target, diff, moved


def main():
    binary = os.path.abspath(sys.argv[1])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sx-finetune-test-") as tmp:
        base_dir, data = os.path.join(tmp, "base"), os.path.join(tmp, "data.txt")
        base = make_base(base_dir)
        base_state = {k: v.clone() for k, v in base.state_dict().items()}
        with open(data, "w") as f:
            f.write(TEXT * 20)
        jobs = {
            "a": {"base": base_dir, "data": data, "steps": 30, "lr": 5e-3, "lora_rank": 4, "lora_alpha": 8, "seed": 1},
            "b": {"base": base_dir, "data": data, "steps": 30, "lr": 1e-2, "lora_rank": 8, "lora_alpha": 16,
                  "batch": 4, "seq_len": 24, "seed": 2, "weight_decay": 0.0, "max_grad_norm": 1.0},
            "c": {"base": base_dir, "data": data, "steps": 100000, "lr": 5e-3, "lora_rank": 2, "seed": 3},
        }
        proc, client = start_service(binary, os.path.join(tmp, "work"))
        try:
            check_bad_configs(client, base_dir, data)
            ids, streams = run_jobs(client, jobs, "c", cancel_after=5)
            status, answer = client.json("GET", "/jobs/job-999")
            assert status == 404 and "job-999" in answer["error"], (status, answer)
            status, answer = client.json("POST", f"/jobs/{ids['a']}/cancel")
            assert status == 409 and "finished" in answer["error"], (status, answer)
            status, stats = client.json("GET", "/stats")
            # Every job was a group of the one context; all are gone now, their channels with them.
            assert status == 200 and stats["ranks"] == 2 and stats["groups_created"] == 3, stats
            assert stats["groups"] == 0 and stats["channels"] == 0 and stats["shared_memory"], stats
            for name, cfg in jobs.items():
                losses, final = check_stream(name, streams[name], cfg, cancelled=(name == "c"))
                alone_cfg = dict(cfg, steps=final["step"])
                alone, alone_adapter = run_alone(binary, tmp, name, alone_cfg)
                assert losses == alone, f"job {name}: losses {losses} alone {alone}"
                mine = safetensors.torch.load_file(os.path.join(final["adapter"], "adapter_model.safetensors"))
                theirs = safetensors.torch.load_file(os.path.join(alone_adapter, "adapter_model.safetensors"))
                assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), name
                _, diff, moved = check_adapter(client, ids[name], base, base_state, tmp)
                print(f"job {name} ({ids[name]}): {final['state']} after {final['step']} steps, loss "
                      f"{losses[0]:.4f} -> {losses[-1]:.4f}, equal to the job alone; peft's logits within "
                      f"{diff:.2e} of the Go model's (the adapter moves them by {moved:.3f})")
        finally:
            proc.kill()
            proc.wait()
    print(f"sample_go_finetune: passed in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
