#!/usr/bin/env python3
"""Issue 14's measurements of the Python bindings against PyTorch's own checkpointing, in one run,
on one disk, with the same tensors.

For every size (a state dict of float32 tensors totalling --sizes MiB) it measures how long the
training loop is blocked, and the throughput to disk, of
  - torch.save to a file + flush + os.fsync (blocks for the whole write);
  - torch.distributed.checkpoint.async_save (a gloo group of 1): the call's blocking time, and
    the time until its future completes (persist throughput);
  - trainguard's snapshot, rt.checkpoint(step) on tensors registered with rt.register(): the
    call's blocking time, what the training thread pays entering the next `with rt.step()` (the
    fence), and the time until rt.wait_for_checkpoints() returns (persist throughput).
Then the per-step overhead of `with rt.step(n)` (empty body) against a bare loop, and of
trainguard.torch.wrap_ddp against plain DDP (same small model, same gloo group of 1).

Single-threaded CPU timings (time.perf_counter); no thresholds: it prints a table (and --json).
Run from the repository root after building with -DTRAINGUARD_PYTHON=ON:
    PYTHONPATH=build/default/python .venv/bin/python bench/bench_python_checkpoint.py
"""
import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import sys
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import trainguard
import trainguard.torch as tgt

MiB = 1 << 20
TENSOR_MIB = 64  # each tensor of the state dict is at most this large


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="256,1024", help="state dict sizes in MiB, comma-separated")
    p.add_argument("--steps", type=int, default=20000,
                   help="iterations of the empty-body step loop (median per step)")
    p.add_argument("--ddp-steps", type=int, default=200, help="iterations of the DDP loops")
    p.add_argument("--dir", default=os.path.join(here, "..", "build", "default", "bench_python_ckpt"),
                   help="scratch directory on the disk to measure (not a tmpfs); removed after")
    p.add_argument("--work-ms", type=float, default=200.0,
                   help="training work (matrix multiplies) between a checkpoint and the next "
                        "step, for the fence a real loop pays")
    p.add_argument("--json", help="also write the results to this file")
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_state(mib):
    g = torch.Generator().manual_seed(mib)
    state, left = {}, mib
    while left > 0:
        n = min(TENSOR_MIB, left)
        state[f"t{len(state)}"] = torch.rand(n * MiB // 4, generator=g, dtype=torch.float32)
        left -= n
    return state


def mb_per_s(nbytes, seconds):
    return nbytes / seconds / 1e6


def bench_torch_save(state, nbytes, d):
    path = os.path.join(d, "torch_save.pt")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    os.unlink(path)
    return {"blocked_ms": elapsed * 1e3, "persist_s": elapsed, "persist_MBps": mb_per_s(nbytes, elapsed)}


def bench_dcp_async(state, nbytes, d):
    path = os.path.join(d, "dcp")
    dcp.async_save(state, checkpoint_id=path + "-warmup").result()  # first-call setup untimed
    shutil.rmtree(path + "-warmup")
    t0 = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=path)
    t1 = time.perf_counter()
    future.result()
    t2 = time.perf_counter()
    shutil.rmtree(path)
    return {"blocked_ms": (t1 - t0) * 1e3, "persist_s": t2 - t0,
            "persist_MBps": mb_per_s(nbytes, t2 - t0)}


def train_for(ms):
    """Real work for `ms` milliseconds (float32 matrix multiplies), as a step's compute."""
    a = torch.randn(256, 256)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
    return a


def bench_trainguard(state, nbytes, d, mib, work_ms):
    job = f"pybench-{mib}-{uuid.uuid4().hex[:8]}"
    rt = trainguard.Runtime(job_id=job, run_dir=os.path.join(d, "run" + str(mib)),
                            checkpoint_dir=os.path.join(d, "tg" + str(mib)),
                            checkpoint_every_steps=0, checkpoint_persist_every=1,
                            checkpoint_keep_last=1)
    try:
        for name, t in state.items():
            rt.register(name, t)
        step = rt.start()
        with rt.step(step):
            pass
        # The first snapshot also maps the arena: timed apart, then a second one is measured.
        w0 = time.perf_counter()
        rt.checkpoint(step)
        first_blocked = time.perf_counter() - w0
        rt.wait_for_checkpoints()
        t0 = time.perf_counter()
        rt.checkpoint(step + 1)
        t1 = time.perf_counter()
        # The next step's fence: what the training thread pays on entering it right away.
        s = rt.step(step + 1)
        t2 = time.perf_counter()
        s.__enter__()
        t3 = time.perf_counter()
        s.__exit__(None, None, None)
        rt.wait_for_checkpoints()
        t4 = time.perf_counter()
        # A real loop computes between the checkpoint and the step that changes the state: the
        # copy runs meanwhile, and the fence waits only for what is left of it.
        w0 = time.perf_counter()
        rt.checkpoint(step + 2)
        w1 = time.perf_counter()
        train_for(work_ms)
        s = rt.step(step + 2)
        w2 = time.perf_counter()
        s.__enter__()
        w3 = time.perf_counter()
        s.__exit__(None, None, None)
        rt.wait_for_checkpoints()
        return {"blocked_ms": (t1 - t0) * 1e3, "first_blocked_ms": first_blocked * 1e3,
                "fence_ms": (t3 - t2) * 1e3,
                "work_ms": work_ms, "blocked_with_work_ms": (w1 - w0 + w3 - w2) * 1e3,
                "fence_after_work_ms": (w3 - w2) * 1e3,
                "persist_s": t4 - t0, "persist_MBps": mb_per_s(nbytes, t4 - t0)}
    finally:
        rt.close()
        for name in os.listdir("/dev/shm"):
            if job in name:
                os.unlink(os.path.join("/dev/shm", name))


def median_ns(fn, iterations):
    """Median per-iteration time of fn over `iterations` calls, in ns (one timing per call)."""
    samples = []
    clock = time.perf_counter_ns
    for i in range(iterations):
        t0 = clock()
        fn(i)
        samples.append(clock() - t0)
    return statistics.median(samples)


def bench_step_overhead(rt, iterations):
    def bare(i):
        pass

    def guarded(i):
        with rt.step(i):
            pass

    start = rt.resume_step()
    bare_ns = median_ns(bare, iterations)
    guarded_ns = median_ns(lambda i: guarded(start + i), iterations)
    return {"bare_ns": bare_ns, "step_ns": guarded_ns, "added_us": (guarded_ns - bare_ns) / 1e3}


def bench_ddp(rt, iterations):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def loop(ddp, guarded):
        step0 = [rt.resume_step()]

        def one(i):
            if guarded:
                with rt.step(step0[0] + i):
                    loss_fn(ddp(x), y).backward()
            else:
                loss_fn(ddp(x), y).backward()
        for i in range(10):  # warm-up (DDP's first iterations rebuild buckets)
            one(i)
        step0[0] += 10
        return median_ns(one, iterations)

    plain = loop(DistributedDataParallel(model), False)
    plain_unused = loop(DistributedDataParallel(model, find_unused_parameters=True), False)
    wrapped = loop(tgt.wrap_ddp(rt, model), True)
    return {"plain_ddp_us": plain / 1e3, "plain_ddp_find_unused_us": plain_unused / 1e3,
            "wrap_ddp_in_step_us": wrapped / 1e3, "added_us": (wrapped - plain) / 1e3}


def main():
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    results = {"date": time.strftime("%Y-%m-%d"), "dir": d, "torch": torch.__version__,
               "sizes": {}}
    # A one-rank static job: its process group (gloo, env://) serves async_save and the DDPs.
    job = f"pybench-loop-{uuid.uuid4().hex[:8]}"
    rt = trainguard.Runtime(job_id=job, run_dir=os.path.join(d, "run-loop"))
    try:
        rt.start()
        tgt.init_process_group(rt, backend="gloo")
        for mib in sizes:
            state = make_state(mib)
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            row = {}
            for name, fn in (("torch.save+fsync", lambda: bench_torch_save(state, nbytes, d)),
                             ("dcp.async_save", lambda: bench_dcp_async(state, nbytes, d)),
                             ("trainguard", lambda: bench_trainguard(state, nbytes, d, mib, args.work_ms))):
                gc.collect()
                os.sync()
                row[name] = fn()
            results["sizes"][str(mib)] = row
            del state
        results["step"] = bench_step_overhead(rt, args.steps)
        results["ddp"] = bench_ddp(rt, args.ddp_steps)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        rt.close()
        for name in os.listdir("/dev/shm"):
            if job in name:
                os.unlink(os.path.join("/dev/shm", name))
        shutil.rmtree(d, ignore_errors=True)

    print(f"bench_python_checkpoint: {results['date']}, torch {results['torch']}, dir {d}")
    print(f"| {'MiB':>5} | {'method':<34} | {'blocked ms':>10} | {'next fence ms':>13} | "
          f"{'persist s':>9} | {'persist MB/s':>12} |")
    for mib, row in results["sizes"].items():
        for name, r in row.items():
            fence = f"{r['fence_ms']:.3f}" if "fence_ms" in r else "-"
            if "first_blocked_ms" in r:
                name += f" (1st call {r['first_blocked_ms']:.1f} ms)"
            print(f"| {mib:>5} | {name:<34} | {r['blocked_ms']:>10.3f} | {fence:>13} | "
                  f"{r['persist_s']:>9.3f} | {r['persist_MBps']:>12.0f} |")
    for mib, row in results["sizes"].items():
        r = row["trainguard"]
        print(f"trainguard {mib} MiB with {r['work_ms']:.0f} ms of training work before the next "
              f"step: fence {r['fence_after_work_ms']:.3f} ms, loop blocked "
              f"{r['blocked_with_work_ms']:.3f} ms in all (checkpoint call + fence)")
    s = results["step"]
    print(f"step overhead: bare loop {s['bare_ns']:.0f} ns, with rt.step(n) {s['step_ns']:.0f} ns, "
          f"added {s['added_us']:.2f} us/step (median of {args.steps})")
    q = results["ddp"]
    print(f"ddp: plain {q['plain_ddp_us']:.0f} us, plain find_unused_parameters "
          f"{q['plain_ddp_find_unused_us']:.0f} us, wrap_ddp inside rt.step {q['wrap_ddp_in_step_us']:.0f} us, "
          f"added {q['added_us']:.0f} us/step (median of {args.ddp_steps})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
