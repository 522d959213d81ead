"""Runs env_train (C, and env_train.py through the Python binding) under the launchers
env:// serves: real torchrun, and mpirun and srun as their environments look to a rank
(the processes started here). Every rank of a run must end with the same params, and
runs of the same world size with the same params as each other, whatever launched them
and in whichever language: the launcher only changes how the ranks meet.

usage:
  run_launchers.py environments EXE
      mpirun's variables (3 ranks) and srun's (2), without torchrun's: rank 0 serves
      sx's store on MASTER_PORT
  run_launchers.py torchrun TORCHRUN EXE [SCRIPT]
      torchrun --nproc-per-node=2 (static rendezvous on a free port, and --standalone),
      workers joining the agent's store; with a worker killed in the first attempt and
      restarted by the agent; --standalone with the agent's store not shared (rank 0
      serves); SCRIPT (env_train.py) run as torchrun's Python workers, with SX_LIBRARY
      and PYTHONPATH from the environment
"""
import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 90
STEPS = "5"
# Variables of one launcher must not leak into another's run.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SX_ENV_STORE",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")


_held_ports = []  # the locks of the ports chosen, held until this process exits


def free_port():
    """A port below the kernel's ephemeral range (where another test's connect() never
    draws one), claimed by a lock on /tmp/sx-test-ports/PORT as tests/free_port.h does."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low - 20000 >= 1000:
        os.makedirs("/tmp/sx-test-ports", exist_ok=True)
        rng = random.Random()
        for _ in range(200):
            port = rng.randrange(20000, low)
            lock = open(f"/tmp/sx-test-ports/{port}", "a")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", port))
            except OSError:
                lock.close()
                continue
            _held_ports.append(lock)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(extra)
    return env


def read_params(out_dir, world, label):
    """The params every rank wrote; fails unless all ranks wrote the same, trained ones."""
    blobs = []
    for r in range(world):
        path = os.path.join(out_dir, f"params.{r}")
        if not os.path.exists(path):
            raise SystemExit(f"{label}: rank {r} wrote no params ({path})")
        with open(path, "rb") as f:
            blobs.append(f.read())
    if len(blobs[0]) != 4 * (37 + 5):
        raise SystemExit(f"{label}: rank 0 wrote {len(blobs[0])} bytes, expected {4 * 42}")
    for r in range(1, world):
        if blobs[r] != blobs[0]:
            raise SystemExit(f"{label}: rank {r}'s params differ from rank 0's")
    if blobs[0] == bytes(len(blobs[0])):
        raise SystemExit(f"{label}: the params are still zero")
    print(f"{label}: {world} ranks, equal params", flush=True)
    return blobs[0]


def run(label, argv, env):
    """Runs a launcher command (or returns a failure) within TIMEOUT_S."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, timeout=TIMEOUT_S, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except subprocess.TimeoutExpired as e:
        sys.stdout.write((e.output or b"").decode(errors="replace"))
        raise SystemExit(f"{label}: still running after {TIMEOUT_S} s")
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        sys.stdout.write(output)
        raise SystemExit(f"{label}: exit status {done.returncode}")
    print(f"{label}: took {time.monotonic() - start:.1f} s", flush=True)
    return output


def run_ranks(label, exe, world, variables, out_dir):
    """Starts `world` processes of exe with the launcher's variables for each rank."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **variables(r, world))
        procs.append(subprocess.Popen([exe, out_dir, STEPS], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_S
    failed = []
    for r, p in enumerate(procs):
        try:
            output, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            output, _ = p.communicate()
        if p.returncode != 0:
            failed.append(r)
            sys.stdout.write(output.decode(errors="replace"))
    if failed:
        raise SystemExit(f"{label}: ranks {failed} failed")
    return read_params(out_dir, world, label)


def environments(exe, scratch):
    def mpirun(r, world):
        return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(world),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}

    def srun(r, world):
        return {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(world), "SLURM_LOCALID": str(r)}

    run_ranks("mpirun", exe, 3, mpirun, new_dir(scratch, "mpirun"))
    run_ranks("srun", exe, 2, srun, new_dir(scratch, "srun"))


def torchrun(launcher, exe, script, scratch):
    base = [launcher, "--nproc-per-node=2", "--max-restarts=0", "--monitor-interval=0.1"]
    results = {}

    out = new_dir(scratch, "torchrun-c")
    run("torchrun, C workers", base + [f"--master-port={free_port()}", "--no-python", exe, out, STEPS], clean_env())
    results["torchrun, C workers"] = read_params(out, 2, "torchrun, C workers")

    out = new_dir(scratch, "standalone")
    run("torchrun --standalone", base + ["--standalone", "--no-python", exe, out, STEPS], clean_env())
    results["torchrun --standalone"] = read_params(out, 2, "torchrun --standalone")

    # An agent that keeps its store to itself sets TORCHELASTIC_USE_AGENT_STORE=False and
    # a free MASTER_PORT: rank 0 serves sx's store there.
    label = "torchrun --standalone, the agent's store not shared"
    out = new_dir(scratch, "not-shared")
    run(label, base + ["--standalone", "--no-python", exe, out, STEPS],
        clean_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"))
    results[label] = read_params(out, 2, label)

    # Rank 1 fails after its first step in the first attempt; the agent restarts both
    # workers, whose groups must not meet the keys the first attempt left in its store.
    out = new_dir(scratch, "restarted")
    restart = [launcher, "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.1",
               f"--master-port={free_port()}", "--no-python", exe, out, STEPS]
    output = run("torchrun, a worker restarted", restart, clean_env(ENV_TRAIN_FAIL_FIRST_ATTEMPT="1"))
    if "fails its first attempt on purpose" not in output:
        sys.stdout.write(output)
        raise SystemExit("torchrun, a worker restarted: no worker failed in the first attempt")
    results["torchrun, a worker restarted"] = read_params(out, 2, "torchrun, a worker restarted")

    if script:
        out = new_dir(scratch, "torchrun-python")
        run("torchrun, Python workers", base + [f"--master-port={free_port()}", script, out, STEPS], clean_env())
        results["torchrun, Python workers"] = read_params(out, 2, "torchrun, Python workers")

    def srun(r, world):
        return {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(world)}

    reference = run_ranks("srun (reference)", exe, 2, srun, new_dir(scratch, "srun"))
    for label, params in results.items():
        if params != reference:
            raise SystemExit(f"{label}: the params differ from those of the same 2 ranks under srun")
    print("every run of 2 ranks ended with the same params", flush=True)


def new_dir(scratch, name):
    path = os.path.join(scratch, name)
    os.mkdir(path)
    return path


def main(argv):
    scratch = tempfile.mkdtemp(prefix="sx-launch-")
    try:
        if len(argv) == 3 and argv[1] == "environments":
            environments(argv[2], scratch)
        elif len(argv) in (4, 5) and argv[1] == "torchrun":
            torchrun(argv[2], argv[3], argv[4] if len(argv) == 5 else None, scratch)
        else:
            raise SystemExit(__doc__)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
