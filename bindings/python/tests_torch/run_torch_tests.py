"""Runs sx.torch's checks: check_single.py, check_optimizers.py, check_muon.py (sx's optimizers
against torch's, ranks as threads) and check_pytorch_optimizer.py (sx.torch with pytorch-optimizer's
Lamb and AdEMAMix, ranks as threads), check_state_dtypes.py (8-bit state against torchao's, bf16
state against torch's), check_state_dtypes_long.py (8-bit AdamW against torchao over 200 steps) and
check_stochastic_round.py (bf16 params without masters against torchao's _AdamW with
bf16_stochastic_round) in one process each, then, under a real torchrun,
check_sx_torch.py and check_fsdp2.py on 2 processes, check_uneven.py on 3 and check_tp.py (tensor parallelism
with placements and a norm domain) on 4, and check_gpt_resume.py (which
starts torchrun itself: the GPT sample saved at 2 processes, resumed at 1 and 3). Run with the Python of a
torch environment, SX_LIBRARY pointing at libsx and PYTHONPATH at the binding (ctest's
bindings_torch does)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    for script in ("check_single.py", "check_optimizers.py", "check_muon.py", "check_pytorch_optimizer.py",
                   "check_state_dtypes.py", "check_state_dtypes_long.py", "check_stochastic_round.py"):
        single = [sys.executable, os.path.join(HERE, script)]
        print("$", " ".join(single), flush=True)
        if subprocess.run(single, timeout=600).returncode != 0:
            sys.exit(f"{script} failed")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    for script, procs in (("check_sx_torch.py", 2), ("check_fsdp2.py", 2), ("check_uneven.py", 3), ("check_tp.py", 4)):
        cmd = [torchrun, "--standalone", f"--nproc-per-node={procs}", os.path.join(HERE, script)]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, timeout=600)
        if done.returncode != 0:
            sys.exit(f"{script} under torchrun failed with exit code {done.returncode}")
    gpt = [sys.executable, os.path.join(HERE, "check_gpt_resume.py")]
    print("$", " ".join(gpt), flush=True)
    if subprocess.run(gpt, timeout=900).returncode != 0:
        sys.exit("check_gpt_resume.py failed")


if __name__ == "__main__":
    main()
