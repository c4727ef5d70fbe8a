"""python_ddp: a small model trained with PyTorch DistributedDataParallel on gloo (CPU), every step
guarded by trainguard, and the reference integration of trainguard in a Python training loop.

Run it under the launcher, which gives each rank torchrun's environment and trainguard's store:

    trainguard run --nproc 3 --standby 1 -- python examples/python_ddp/train.py --steps 60

Each rank holds a replica of a small MLP initialised from the same seed and trains on its shard of
a synthetic regression task (each batch a function of the step and the rank only, so a replay of
a step sees the same data); DDP averages the gradients with one gloo allreduce per bucket through
trainguard.torch.guarded_allreduce_hook, which checks each bucket for NaN/Inf before and after the
reduction and records it in the flight recorder. The model, the SGD momentum buffers and the RNG
states are registered with the Runtime (trainguard.torch.register); with TRAINGUARD_CHECKPOINT_*
set they are snapshotted into the shared-memory arena and to disk. A failed step goes to
rt.recover(); after a re-rendezvous (a rank replaced) every rank rebuilds the process group and
DDP for the new generation (trainguard.torch.init_process_group, wrap_ddp).

Output, one line each, line-buffered, as examples/cpp_trainer prints it (tests compare runs):

    rank R start world W generation G resume_step S steps N
    rank R step S loss L                 every --print-every'th step and the last (L: the mean
                                         over the ranks of the step's loss, %.6f)
    rank R step S fault KIND action ACTION: MESSAGE
    rank R recover step S next N
    rank R restored step S from SOURCE   start()/recover() restored a checkpoint (SOURCE: the
                                         arena, a peer's memory or disk); S is the step resumed at
    rank R generation G resume_step S    a process group was built for generation G
    rank R final_loss L params_checksum H
                                         H: sha256 of the parameters' bytes (16 hex digits),
                                         equal on every rank

Fault injection: --inject-nan-grad R:S[:COUNT] puts a NaN into rank R's gradients at steps S to
S+COUNT-1 (each once per process, so a replay after a rollback is clean).

--check-loss 1 judges every step's loss with s.check_loss before backward() (a non-finite loss or
a spike fails the step, and the DDP hook fails it on every rank). --inject-loss-spike R:S (with
--check-loss 1) multiplies rank R's loss at step S by 1000, once per process (R -1: every rank).

--raise-before-backward R:S makes rank R's step S body raise trainguard.RecoverableError after
the forward pass, before backward(), once per process (R -1: every rank): the guard records it and
trainguard.torch runs that rank's part of the step's DDP reduction with a NaN, so every rank skips
the step, as after a loss spike.

--stop-in-allreduce R:S stops rank R at step S right after it has issued the step's loss
allreduce (a SIGSTOP to itself, in generation 0 only, so that its replacement replays the step),
so its peers wait in that collective for a rank that neither progresses nor dies: only the
launcher's heartbeat check (or a hang diagnosis) can find it. It prints "rank R stopping in
allreduce at step S" first.

For `trainguard chaos` (docs/GUIDE.md section 12), as examples/cpp_trainer does it:
--progress-events 1 makes rank 0 write an event (kind step_done, its pid) after every step
that succeeded, the progress `trainguard report` measures ETTR from; --nan-on-sigusr1 1 turns a
SIGUSR1 into a NaN in this rank's gradients at its next step; --step-time-ms N makes every step
last at least N ms (a sleep after the update), so a run's step time does not depend on how fast
this small model computes.

--flip-bit R:S makes rank R flip one mantissa bit of one weight in its own memory after step S's
update (generation 0 only): silent data corruption, found at the next snapshot by comparing the
replicas' snapshots (the parameters and optimizer state are registered as replicated).

--check-reduced-grad 1 compares the gradients DDP reduced across the ranks every step
(s.check_replicated); --corrupt-reduced-grad R:S flips a bit of rank R's reduced gradients at step S
(generation 0 only), after the reduction and before the update.

--die-in-rebuild R:G makes rank R SIGKILL itself inside the rebuild of generation G's process group
(before DDP's collective construction), so the others' rebuild fails on a dead peer.

--zero-grad-at-end 1 clears the gradients at the end of each step, after the update, as nanoGPT's
train.py does, instead of at its start, and runs the loss allreduce in a failed step too: a step
whose peer died then raises out of that allreduce and skips the clearing, and trainguard.torch
drops that step's gradients itself (the replay must not add onto them).

Test hook: --gate S:PATH (repeatable) makes every rank print "rank R waiting at step S" and wait
(bounded polling, --gate-timeout-s) until PATH exists before it runs step S, so a test can kill a
rank at a known step without racing the training loop.

Exit status: 0 trained every step; 1 trainguard stopped this process (JobMustExit).
"""

import argparse
import datetime
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trainguard
import trainguard.torch as tgt

IN_FEATURES = 16
HIDDEN = 64


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--comm-timeout-s", type=float, default=60.0)
    p.add_argument("--inject-nan-grad", default="", metavar="R:S[:COUNT]")
    p.add_argument("--check-loss", type=int, choices=(0, 1), default=0)
    p.add_argument("--inject-loss-spike", default="-2:-1", metavar="R:S")
    p.add_argument("--raise-before-backward", default="-2:-1", metavar="R:S")
    p.add_argument("--stop-in-allreduce", default="", metavar="R:S")
    p.add_argument("--gate", action="append", default=[], metavar="S:PATH")
    p.add_argument("--gate-timeout-s", type=float, default=300.0)
    p.add_argument("--progress-events", type=int, choices=(0, 1), default=0)
    p.add_argument("--nan-on-sigusr1", type=int, choices=(0, 1), default=0)
    p.add_argument("--step-time-ms", type=float, default=0.0)
    p.add_argument("--die-in-rebuild", default="-1:-1", metavar="R:G")
    p.add_argument("--zero-grad-at-end", type=int, choices=(0, 1), default=0)
    p.add_argument("--flip-bit", default="-1:-1", metavar="R:S")
    p.add_argument("--check-reduced-grad", type=int, choices=(0, 1), default=0)
    p.add_argument("--corrupt-reduced-grad", default="-1:-1", metavar="R:S")
    args = p.parse_args(argv)
    args.gates = {}
    for gate in args.gate:
        at, path = gate.split(":", 1)
        args.gates[int(at)] = path
    args.stop_rank, args.stop_step = -1, -1
    if args.stop_in_allreduce:
        args.stop_rank, args.stop_step = (int(x) for x in args.stop_in_allreduce.split(":"))
    args.die_in_rebuild = tuple(int(x) for x in args.die_in_rebuild.split(":"))
    args.flip_bit = tuple(int(x) for x in args.flip_bit.split(":"))
    args.corrupt_grad = tuple(int(x) for x in args.corrupt_reduced_grad.split(":"))
    args.spike_rank, args.spike_step = (int(x) for x in args.inject_loss_spike.split(":"))
    args.raise_rank, args.raise_step = (int(x) for x in args.raise_before_backward.split(":"))
    args.nan_rank, args.nan_steps = -1, set()
    if args.inject_nan_grad:
        parts = [int(x) for x in args.inject_nan_grad.split(":")]
        count = parts[2] if len(parts) > 2 else 1
        args.nan_rank = parts[0]
        args.nan_steps = set(range(parts[1], parts[1] + count))
    return args


def build_model():
    torch.manual_seed(1234)  # the same initial replica on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1))


def batch(step, rank, size):
    """The batch of (step, rank): a function of them only, so a replay sees the same data."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(size, IN_FEATURES, generator=g)
    w = torch.linspace(-1.0, 1.0, IN_FEATURES)
    y = torch.sin(x @ w).unsqueeze(1) + 0.01 * torch.randn(size, 1, generator=g)
    return x, y


def wait_at_gate(rank, step, path, timeout_s):
    print(f"rank {rank} waiting at step {step}")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank} error: gate {path} of step {step} did not open in "
                             f"{timeout_s} s")
        time.sleep(0.01)


def print_restore(rt, step):
    source = (rt.last_recovery or {}).get("restored_from")
    if source:
        print(f"rank {rt.rank} restored step {step} from {source}")


def params_checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)  # deterministic CPU kernels; ranks share the machine
    # Everything that does not depend on the rank comes before Runtime.from_env(): a warm standby
    # waits inside from_env() until it is given a rank, so what runs before it is paid before the
    # fault, not after. Here that is the model and the optimizer: the first optimizer a process
    # builds imports torch._dynamo, 5-6 s on this machine (measured), which a standby that built
    # it after its takeover added to every replacement.
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Before from_env() too: a SIGUSR1 that reaches a standby just given a rank must not kill it.
    nan_requested = [False]  # set by SIGUSR1 (--nan-on-sigusr1), taken by the next step
    if args.nan_on_sigusr1:
        signal.signal(signal.SIGUSR1, lambda signum, frame: nan_requested.__setitem__(0, True))
    rt = trainguard.Runtime.from_env()
    rank = rt.rank
    extra = {"last_loss": float("nan")}
    # The parameters and SGD's momentum are the same on every rank after each step (DDP): their
    # snapshots are compared across the ranks (silent data corruption).
    tgt.register(rt, model=model, optimizer=optimizer, rng=True, extra=extra, materialize=True,
                 replicated=True)
    injected = set()
    timeout = datetime.timedelta(seconds=args.comm_timeout_s)

    try:
        step = rt.start()
    except trainguard.JobMustExit as e:
        print(f"rank {rank} error: cannot start: {e}", file=sys.stderr)
        return 1
    print_restore(rt, step)
    print(f"rank {rank} start world {rt.world_size} generation {rt.generation} "
          f"resume_step {step} steps {args.steps}")
    ddp, ddp_generation = None, None
    while step < args.steps:
        if step in args.gates:
            wait_at_gate(rank, step, args.gates[step], args.gate_timeout_s)
        started = time.monotonic()
        with rt.step(step) as s:
            # The process group and DDP of this generation, built inside the step: building them
            # is collective (DDP broadcasts the parameters), so a peer that dies meanwhile fails
            # this step as a communication failure, and recover() takes the ranks to the next
            # generation, instead of an exception out of main(). A nested phase: the rebuild has
            # its own learned bound, not the step's.
            if ddp is None or ddp_generation != rt.generation:
                with rt.phase("rebuild_process_group"):
                    if rank == args.die_in_rebuild[0] and rt.generation == args.die_in_rebuild[1]:
                        print(f"rank {rank} dying in the rebuild of generation {rt.generation}")
                        sys.stdout.flush()
                        os.kill(os.getpid(), signal.SIGKILL)  # this process
                    tgt.init_process_group(rt, backend="gloo", timeout=timeout)
                    ddp = tgt.wrap_ddp(rt, model)
                    ddp_generation = rt.generation
                print(f"rank {rank} generation {rt.generation} resume_step {step}")
            x, y = batch(step, rank, args.batch)
            if not args.zero_grad_at_end:
                optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(ddp(x), y)
            signalled = nan_requested[0]
            nan_requested[0] = False
            if signalled or (rank == args.nan_rank and step in args.nan_steps
                             and step not in injected):
                injected.add(step)
                # A corrupted gradient: the hook sees it in the first bucket it reduces.
                loss = loss + 0.0 * model[0].bias.sum() * float("nan")
            if (rank == args.spike_rank or args.spike_rank == -1) and step == args.spike_step \
                    and "spike" not in injected:
                injected.add("spike")
                loss = loss * 1000.0
            if args.check_loss:
                s.check_loss(loss.item())  # before backward: a failure here fails every rank
            if (rank == args.raise_rank or args.raise_rank == -1) and step == args.raise_step \
                    and "raise" not in injected:
                injected.add("raise")
                raise trainguard.RecoverableError(f"rank {rank}: a bad batch at step {step}")
            loss.backward()
            # After backward() every rank agrees on s.failed (the DDP hook spreads a failure of any
            # rank to all), so the step's other collectives run only in a step that goes on. With
            # --zero-grad-at-end, always, as in a loop that never looks at s.failed: on a dead peer
            # this allreduce raises out of the body, and the clearing at the end is skipped.
            if not s.failed or args.zero_grad_at_end:
                mean = loss.detach().clone()
                if rank == args.stop_rank and step == args.stop_step and rt.generation == 0:
                    print(f"rank {rank} stopping in allreduce at step {step}")
                    work = dist.all_reduce(mean, async_op=True)
                    os.kill(os.getpid(), signal.SIGSTOP)  # this process; the launcher kills it
                    work.wait()
                else:
                    dist.all_reduce(mean)
                mean /= rt.world_size
            if not s.failed and (args.check_reduced_grad or args.corrupt_grad[0] >= 0):
                if (rank, step) == args.corrupt_grad and rt.generation == 0:
                    # A bit of one reduced gradient, as a faulty reduction would leave it.
                    bits = model[0].weight.grad.view(-1).view(torch.int32)
                    bits[bits.numel() // 3] ^= 1 << 5
                if args.check_reduced_grad:
                    # DDP reduced them in backward(): every replica holds the same gradients now.
                    s.check_replicated("model.gradients", torch.cat(
                        [p.grad.reshape(-1) for p in model.parameters()]))
            if not s.failed:  # a NaN on any rank fails the step on every rank: skip the update
                optimizer.step()
                if (rank, step) == args.flip_bit and rt.generation == 0:
                    # Silent data corruption: one mantissa bit of one weight, in this process's
                    # memory; nothing fails, and the replicas no longer agree.
                    bits = model[0].weight.data.view(-1).view(torch.int32)
                    bits[bits.numel() // 2] ^= 1 << 3
                    print(f"rank {rank} flipped a bit of model.0.weight at step {step}")
                extra["last_loss"] = float(mean)
                if step % args.print_every == 0 or step == args.steps - 1:
                    print(f"rank {rank} step {step} loss {float(mean):.6f}")
                pad = args.step_time_ms / 1000.0 - (time.monotonic() - started)
                if pad > 0:
                    time.sleep(pad)
            if args.zero_grad_at_end:  # nanoGPT's order: an exception above skips it
                optimizer.zero_grad(set_to_none=True)
        r = s.result
        if r.ok:
            if args.progress_events and rank == 0:
                try:
                    rt.emit_event("step done", step=step, kind=trainguard.EventKind.STEP_DONE,
                                  pid=os.getpid())
                except trainguard.Error as e:  # best effort: a full disk must not stop training
                    print(f"rank {rank} step {step} progress event not written: {e}",
                          file=sys.stderr)
            step += 1
            continue
        print(f"rank {rank} step {step} fault {r.fault} action {r.action}: {r.message}")
        try:
            nxt = rt.recover(r)
        except trainguard.JobMustExit as e:
            print(f"rank {rank} error: cannot recover from step {step}: {e}", file=sys.stderr)
            return 1
        print(f"rank {rank} recover step {step} next {nxt}")
        print_restore(rt, nxt)
        step = nxt
    rt.wait_for_checkpoints(600.0)
    print(f"rank {rank} final_loss {extra['last_loss']:.6f} params_checksum "
          f"{params_checksum(model)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    rt.close()
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
