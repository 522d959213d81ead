"""sx.torch under a real torchrun (run by run_torch_tests.py): 2 processes train a small
MLP with AdamW, gradient clipping and an LR scheduler through sx.torch.ShardedOptimizer,
beside the same MLP under DistributedDataParallel + ZeroRedundancyOptimizer, and the
losses and params must agree to 1e-5 relative at every one of 20 steps. Then sx's
consolidated state dict equals ZeroRedundancyOptimizer's, loads into a plain
torch.optim.AdamW that continues exactly as sx does, and the reverse; zero_grad keeps
.grad in sx's memory; with overlap=True (units reduced from autograd hooks during the
backward) the run is the same, and a second backward before a step is refused; sx's
dynamic loss scaling skips a step that overflowed on one rank on every rank; and a torch
class sx has no kernel for (Adadelta, Rprop) runs itself on each rank's shard, matching
DDP and resuming from sx's checkpoint. And: every rank starts from rank 0's params and
BatchNorm buffers (or keeps its own where told to); sx takes torch's thread count and
logs it; opt.no_sync() accumulates two micro-batches with overlap=True as DDP's no_sync
does; opt.clip_grad_norm_ returns the global norm DDP's clipping computes, and
torch.nn.utils.clip_grad_norm_ over sx's params warns. Exits non-zero on the first
difference."""
import logging
import os
import shutil
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import sx.torch

RTOL = 1e-5
LR, WD, MAX_NORM = 1e-2, 0.05, 0.25


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def deep_mlp():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 32), torch.nn.Tanh()]
    for _ in range(6):
        layers += [torch.nn.Linear(32, 32), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(32, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def close(a, b, what):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if not torch.allclose(a, b, rtol=RTOL, atol=1e-7):
        worst = ((a - b).abs() / b.abs().clamp_min(1e-7)).max().item()
        raise AssertionError(f"rank {dist.get_rank()}: {what} differs (worst relative {worst:.3g})")


def ddp_step(ddp, opt, x, y):
    """The peer's step: DDP averages the gradients, torch clips them, `opt` steps; the loss."""
    opt.zero_grad()
    loss = loss_of(ddp, x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), MAX_NORM)
    opt.step()
    return loss


def compare_params(m1, m2, what):
    for (name, p), q in zip(m1.named_parameters(), m2.parameters()):
        close(p.detach(), q.detach(), f"{what}: param {name}")


def check_loss_scaling(rank, world):
    """sx's dynamic loss scaling through sx.torch, with an overflow on rank 0 only: every
    rank skips that step and halves the scale, and the run matches DDP + AdamW fed the
    same (unscaled) batches with that step left out."""
    e, f = mlp(), mlp()
    ddp = DistributedDataParallel(f)
    peer = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=WD)
    opt = sx.torch.ShardedOptimizer(e, torch.optim.AdamW, lr=LR, weight_decay=WD)
    opt.group.set_loss_scaling("dynamic", init_scale=1024.0)
    for step in range(30, 36):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = loss_of(e, x, y) * opt.group.loss_scale
        if step == 32 and rank == 0:
            loss = loss * float("inf")
        loss.backward()
        opt.step()
        if step != 32:
            peer.zero_grad()
            loss_of(ddp, x, y).backward()
            peer.step()
        compare_params(e, f, f"sx with dynamic loss scaling against DDP, step {step}")
    scales = [None] * world
    dist.all_gather_object(scales, opt.group.loss_scale)
    if scales != [512.0] * world:
        raise AssertionError(f"rank {rank}: loss scales after one overflow: {scales}; 512 on every rank expected")
    opt.close()


def check_class_run_on_shards(rank, world):
    """A torch class sx has no kernel for (Adadelta, Rprop) runs itself on each rank's
    shard, with its state kept, sharded and checkpointed by sx: it matches DDP + the
    plain class over 20 steps, with a scheduler; sx's checkpoint resumes it in a fresh
    optimizer, which goes on as the plain class does."""
    for cls, kw in ((torch.optim.Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.01)),
                    (torch.optim.Rprop, dict(lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 1.0)))):
        a, b = mlp(), mlp()
        ddp = DistributedDataParallel(a)
        peer = cls(ddp.parameters(), **kw)
        opt = sx.torch.ShardedOptimizer(b, cls, **kw)
        scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5) for o in (peer, opt)]
        for step in range(20):
            x, y = batch(step, rank)
            for model, o in ((ddp, peer), (b, opt)):
                o.zero_grad()
                loss_of(model, x, y).backward()
                o.step()
            for sched in scheds:
                sched.step()
            compare_params(b, a, f"{cls.__name__} run on the shards, step {step}")
        path = [f"/tmp/sx-torch-class-{cls.__name__}-{os.getpid()}" if rank == 0 else None]
        dist.broadcast_object_list(path, src=0)
        opt.save(path[0]).wait()
        c = mlp()
        resumed = sx.torch.ShardedOptimizer(c, cls, **kw)
        resumed.load(path[0])
        for step in range(20, 24):
            x, y = batch(step, rank)
            for model, o in ((ddp, peer), (c, resumed)):
                o.zero_grad()
                loss_of(model, x, y).backward()
                o.step()
            compare_params(c, a, f"{cls.__name__} resumed from sx's checkpoint, step {step}")
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path[0], ignore_errors=True)
        for o in (opt, resumed):
            o.close()


_dist_ready = sx.torch.dist_ready


def check_module_states_and_threads(rank, world):
    """Ranks seeded differently (and BatchNorm statistics of their own) start from rank
    0's params and buffers; with sync_module_states=False each keeps its own. sx's step
    takes torch's thread count (torchrun's OMP_NUM_THREADS) and says so in its log."""
    def net():
        torch.manual_seed(rank)
        m = torch.nn.Sequential(torch.nn.Linear(8, 300), torch.nn.BatchNorm1d(300), torch.nn.Linear(300, 4))
        m[1].running_mean.uniform_(-1, 1)
        m[1].num_batches_tracked.fill_(rank + 3)
        return m

    def states(m):
        return [t.detach().clone() for t in list(m.parameters()) + list(m.buffers())]

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.INFO)
    logger = logging.getLogger("sx.torch")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        # Buffers through torch.distributed, then through sx's all-reduce (as without it).
        for sync, through_dist in ((True, True), (True, False), (False, True)):
            m = net()
            sx.torch.dist_ready = (lambda: True) if through_dist else (lambda: False)
            try:
                opt = sx.torch.ShardedOptimizer(m, torch.optim.AdamW, lr=LR, sync_module_states=sync)
            finally:
                sx.torch.dist_ready = _dist_ready
            mine = states(m)
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            for r in range(world):
                same = all(torch.equal(a, b) for a, b in zip(everyone[r], everyone[0]))
                if same != (sync or r == 0):
                    raise AssertionError(f"rank {rank}: sync_module_states={sync}: rank {r}'s params and buffers "
                                         f"{'differ from' if sync else 'equal'} rank 0's")
            opt.close()
    finally:
        logger.removeHandler(handler)
    if opt.num_threads != torch.get_num_threads() or opt.num_threads != int(os.environ.get("OMP_NUM_THREADS", "0")):
        raise AssertionError(f"sx took {opt.num_threads} threads; torch has {torch.get_num_threads()}, "
                             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if not any("torch.get_num_threads()" in r and f"rank {rank} of {world}" in r for r in records):
        raise AssertionError(f"no log line names the threads' origin: {records}")


def check_no_sync_and_clipping(rank, world):
    """Two micro-batches per step, the first inside no_sync (DDP's and sx's with
    overlap=True), equal within 1e-5 over 6 steps; the norm opt.clip_grad_norm_ returns is
    the one DDP's clip_grad_norm_ returns; torch.nn.utils.clip_grad_norm_ over sx's params
    warns."""
    a, b = mlp(), mlp()
    ddp = DistributedDataParallel(a)
    peer = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=WD)
    opt = sx.torch.ShardedOptimizer(b, torch.optim.AdamW, lr=LR, weight_decay=WD, bucket_mb=1.0 / 1024,
                                    overlap=True)
    for step in range(40, 46):
        (x1, y1), (x2, y2) = batch(step, rank), batch(step + 100, rank)
        peer.zero_grad()
        with ddp.no_sync():
            loss_of(ddp, x1, y1).backward()
        loss_of(ddp, x2, y2).backward()
        want = torch.nn.utils.clip_grad_norm_(ddp.parameters(), MAX_NORM)
        peer.step()
        opt.zero_grad()
        with opt.no_sync():
            loss_of(b, x1, y1).backward()
        if not opt._waiting or len(opt._waiting) != opt.group.num_units:
            raise AssertionError("a backward inside no_sync signalled units ready")
        loss_of(b, x2, y2).backward()
        if opt._waiting:
            raise AssertionError("the backward after no_sync did not signal every unit")
        got = opt.clip_grad_norm_(MAX_NORM)
        if not torch.isnan(got):
            raise AssertionError("clip_grad_norm_'s norm was filled before the step")
        opt.step()
        close(got, want, f"step {step}: the norm clip_grad_norm_ returned")
        compare_params(b, a, f"no_sync, step {step}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss_of(b, *batch(50, rank)).backward()
        torch.nn.utils.clip_grad_norm_(b.parameters(), MAX_NORM)
    if not any("clips this process's own gradients" in str(w.message) for w in caught):
        raise AssertionError("torch.nn.utils.clip_grad_norm_ over sx's params did not warn")
    opt.zero_grad()
    opt.close()


def check_stage3(rank, world):
    """Stage 3 (each Linear a unit, gathered around its forward and backward from module
    hooks), with and without overlap, against DDP + AdamW with clipping over 50 steps: the
    losses within 1e-5 at every step, the params within 1e-5 normwise every 10 steps
    (elementwise, AdamW's division makes the reduction's order show in near-zero
    elements), and stage 3 the same bits as stage 2. The full params a rank holds at once
    stay within two units, and sx's shards and gathers within 1/world of the model plus
    the units in flight."""
    a = deep_mlp()
    ddp = DistributedDataParallel(a)
    peer = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=WD)
    runs = []
    # The last: stage 3 over an HSDP mesh of shard groups of 1 (each process replicated).
    for stage, overlap, shard_size in ((2, False, 0), (3, False, 0), (3, True, 0), (3, False, 1)):
        m = deep_mlp()
        opt = sx.torch.ShardedOptimizer(m, torch.optim.AdamW, lr=LR, weight_decay=WD, max_grad_norm=MAX_NORM,
                                        stage=stage, bucket_mb=4.5 / 1024, overlap=overlap, shard_size=shard_size)
        if opt.group.num_units < 8:
            raise AssertionError(f"stage {stage}: {opt.group.num_units} units")
        if stage == 3 and any(p.untyped_storage().nbytes() != 0 for p in m.parameters()):
            raise AssertionError("stage 3: params stay whole outside the modules' forward")
        runs.append((m, opt, f"stage {stage}{' overlapped' if overlap else ''}"
                             f"{f' in shard groups of {shard_size}' if shard_size else ''}"))
    for step in range(60, 110):
        x, y = batch(step, rank)
        want = ddp_step(ddp, peer, x, y)
        for m, opt, what in runs:
            opt.zero_grad()
            got = loss_of(m, x, y)
            got.backward()
            opt.step()
            close(got.detach(), want.detach(), f"{what}, step {step}: loss")
        if step == 68:  # sx's most, before full_params() gathers everything
            sx_peaks = [opt.group.memory_stats().peak_param_bytes for _, opt, _ in runs]
        if step % 10 != 9:
            continue
        stage2 = [p.detach().clone() for p in runs[0][0].parameters()]
        for m, opt, what in runs:
            with opt.full_params():
                for (name, p), q, p2 in zip(m.named_parameters(), a.parameters(), stage2):
                    off = ((p - q).norm() / q.norm()).item()
                    if off > RTOL:
                        raise AssertionError(f"rank {rank}: {what}, step {step}: param {name} is {off:.3g} off DDP's")
                    if what == "stage 3" and not torch.equal(p, p2):
                        raise AssertionError(f"rank {rank}: step {step}: param {name} differs at stage 3 and 2")
    model_bytes = sum(p.numel() * p.element_size() for p in a.parameters())
    for (m, opt, what), sx_peak in zip(runs[1:3], sx_peaks[1:3]):
        biggest = max(opt._unit_bytes_of(u) for u in opt._unit_params)
        if opt.peak_param_bytes > 2 * biggest:
            raise AssertionError(f"{what}: {opt.peak_param_bytes} bytes of full params at once; units of at most "
                                 f"{biggest}")
        if sx_peak > model_bytes / world + 3 * biggest:
            raise AssertionError(f"{what}: sx held {sx_peak} param bytes at once; the model has {model_bytes}, "
                                 f"units of at most {biggest}")
        if rank == 0:
            print(f"{what}: full params held at once {opt.peak_param_bytes} bytes, sx's shards and gathers "
                  f"{sx_peak}; the model {model_bytes} bytes, its largest unit {biggest}", flush=True)
    for m, opt, what in runs:
        opt.close()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    check_class_run_on_shards(rank, world)
    check_module_states_and_threads(rank, world)
    check_no_sync_and_clipping(rank, world)
    check_stage3(rank, world)

    # The peer: DDP averages the gradients, clip_grad_norm_ clips them, ZeRO steps.
    a = mlp()
    ddp = DistributedDataParallel(a)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=WD)
    a_sched = torch.optim.lr_scheduler.StepLR(zero, step_size=5, gamma=0.5)
    # sx: the model is not wrapped; the optimizer owns its params' memory.
    b = mlp()
    opt = sx.torch.ShardedOptimizer(b, torch.optim.AdamW, lr=LR, weight_decay=WD, max_grad_norm=MAX_NORM)
    b_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    grad_ptrs = [opt.group.raw_view(i, grad=True).data for i in range(len(list(b.parameters())))]
    # The same with each unit (a 1 KiB bucket: about a layer) reduced during the backward.
    e = mlp()
    overlapped = sx.torch.ShardedOptimizer(e, torch.optim.AdamW, lr=LR, weight_decay=WD, max_grad_norm=MAX_NORM,
                                           bucket_mb=1.0 / 1024, overlap=True)
    e_sched = torch.optim.lr_scheduler.StepLR(overlapped, step_size=5, gamma=0.5)
    if overlapped.group.num_units < 3:
        raise AssertionError(f"the overlapped model has {overlapped.group.num_units} units")
    reductions = 0
    for step in range(20):
        x, y = batch(step, rank)
        la = ddp_step(ddp, zero, x, y)
        a_sched.step()
        opt.zero_grad()  # torch's default set_to_none=True: the grads stay sx's memory
        lb = loss_of(b, x, y)
        lb.backward()
        if [p.grad.data_ptr() for p in b.parameters()] != grad_ptrs:
            raise AssertionError("zero_grad detached .grad from sx's memory")
        opt.step()
        b_sched.step()
        close(lb.detach(), la.detach(), f"step {step}: loss")
        compare_params(b, a, f"step {step}")
        overlapped.zero_grad()
        loss_of(e, x, y).backward()  # the hooks signal every unit ready: reductions start here
        reductions += 0 if overlapped._waiting else 1
        overlapped.step()
        e_sched.step()
        compare_params(e, a, f"step {step} (overlapped)")
    if reductions != 20:
        raise AssertionError(f"the backward signalled every unit in {reductions} of 20 steps")
    overlapped.zero_grad()
    loss_of(e, *batch(0, rank)).backward()
    try:
        loss_of(e, *batch(1, rank)).backward()
        raise AssertionError("a second backward before the step was not refused")
    except RuntimeError as err:
        if "second gradient" not in str(err):
            raise
    if opt.param_groups[0]["lr"] != zero.param_groups[0]["lr"]:
        raise AssertionError("the schedulers disagree on the learning rate")

    # sx's consolidated state equals ZeroRedundancyOptimizer's.
    opt.consolidate_state_dict(to=0)
    zero.consolidate_state_dict(to=0)
    if rank == 0:
        mine, theirs = opt.state_dict(), zero.state_dict()
        for i, entry in theirs["state"].items():
            for key, value in entry.items():
                close(mine["state"][i][key], value, f"state {i} {key}")
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
            if mine["param_groups"][0][key] != theirs["param_groups"][0][key]:
                raise AssertionError(f"param group {key}: {mine['param_groups'][0][key]} vs "
                                     f"{theirs['param_groups'][0][key]}")
    elif opt._consolidated is not None:
        raise AssertionError("a rank that is not the root holds the consolidated state")

    # sx -> torch: a plain AdamW takes sx's state dict and one process over the union of
    # the ranks' batches continues exactly as sx does.
    sd = [opt.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(sd, src=0)
    sd = sd[0]
    c = mlp()
    c.load_state_dict(b.state_dict())
    plain = torch.optim.AdamW(c.parameters(), lr=LR, weight_decay=WD)
    plain.load_state_dict(sd)
    for step in range(20, 24):
        batches = [batch(step, r) for r in range(world)]
        opt.zero_grad()
        loss_of(b, *batches[rank]).backward()
        opt.step()
        plain.zero_grad()
        loss_of(c, torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])).backward()
        torch.nn.utils.clip_grad_norm_(c.parameters(), MAX_NORM)
        plain.step()
        compare_params(b, c, f"sx and torch.optim.AdamW from sx's state, step {step}")

    # torch -> sx: a fresh sx optimizer takes the plain AdamW's state dict (every rank the
    # same, as ZeroRedundancyOptimizer's load_state_dict) and continues as it does.
    d = mlp()
    d.load_state_dict(c.state_dict())
    opt2 = sx.torch.ShardedOptimizer(d, torch.optim.AdamW, lr=0.5, weight_decay=0.0, max_grad_norm=MAX_NORM)
    opt2.load_state_dict(plain.state_dict())
    if opt2.param_groups[0]["lr"] != plain.param_groups[0]["lr"]:
        raise AssertionError("load_state_dict did not take the learning rate")
    for step in range(24, 28):
        batches = [batch(step, r) for r in range(world)]
        opt2.zero_grad()
        loss_of(d, *batches[rank]).backward()
        opt2.step()
        plain.zero_grad()
        loss_of(c, torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])).backward()
        torch.nn.utils.clip_grad_norm_(c.parameters(), MAX_NORM)
        plain.step()
        compare_params(d, c, f"sx from torch.optim.AdamW's state, step {step}")
    check_loss_scaling(rank, world)
    print(f"rank {rank}: sx.torch matches DDP + ZeroRedundancyOptimizer and torch.optim.AdamW", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line that names the rank, then a non-zero exit
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
