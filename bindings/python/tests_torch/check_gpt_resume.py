"""samples/python/train_torch_gpt.py as a user runs it (run by run_torch_tests.py): a
character-level GPT trained by 2 processes under torchrun at stage 3 for 30 steps, saved
after step 15, then resumed from that checkpoint by 1 process and by 3 (at 3, the global
batch of 6 sequences splits 2 by 2) to step 30: the resumed runs' losses equal the
uninterrupted run's within 1e-4 relative at every step (the sums' order differs with
the world size), and the loss fell."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, os.pardir, os.pardir, os.pardir, "samples", "python", "train_torch_gpt.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def run(procs, losses, *args):
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={procs}", SAMPLE, "--steps", "30", "--batch", "6",
           "--losses", losses, *args]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, timeout=600, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the sample failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(done.stdout.strip().splitlines()[-1], flush=True)


def read(path):
    with open(path) as f:
        return {int(step): float(loss) for step, loss in (line.split() for line in f)}


def main():
    work = tempfile.mkdtemp(prefix="sx-gpt-")
    ckpt = os.path.join(work, "ckpt")
    run(2, os.path.join(work, "whole"), "--save-at", "15", ckpt)
    whole = read(os.path.join(work, "whole"))
    if sorted(whole) != list(range(1, 31)):
        sys.exit(f"the uninterrupted run logged steps {sorted(whole)}")
    if not whole[30] < 0.8 * whole[1]:
        sys.exit(f"the loss did not fall: {whole[1]} -> {whole[30]}")
    for procs in (1, 3):
        path = os.path.join(work, f"resumed-{procs}")
        run(procs, path, "--resume", os.path.join(ckpt, "step-15"))
        resumed = read(path)
        if sorted(resumed) != list(range(16, 31)):
            sys.exit(f"the run resumed at {procs} logged steps {sorted(resumed)}")
        for step, loss in resumed.items():
            if abs(loss - whole[step]) > 1e-4 * abs(whole[step]):
                sys.exit(f"step {step}: resumed at {procs} processes the loss is {loss}, uninterrupted "
                         f"{whole[step]}")
    print(f"the GPT resumed at 1 and 3 processes follows the 2-process run: loss {whole[1]:.4f} -> "
          f"{whole[30]:.4f}", flush=True)


if __name__ == "__main__":
    main()
