"""What trainguard's Python guard costs per step, against an empty `with` block in the same run.

Part 1: `with rt.step(n): pass` on a Runtime that checkpoints (every --every steps, to a scratch
dir) with a model and AdamW registered through trainguard.torch.register, for models of 0, about
60 and about 200 registered tensors. The baseline is `with contextlib.nullcontext(): pass`. The
step that starts a snapshot is counted like any other (the median hides it; the mean shows it).

Part 2: where a DDP step's cost goes on a tiny CPU model (one gloo rank): plain DDP, DDP with
find_unused_parameters=True (torch's own way to keep the bucket layout fixed, with a graph walk per
forward; wrap_ddp fixes it at construction instead), wrap_ddp (the guarded allreduce hook: finite
checks and the flight recorder, on the fixed layout), and wrap_ddp inside `with rt.step()`; each
as a ratio to plain DDP.

Single-threaded CPU timings (time.perf_counter_ns); no thresholds. From the repository root:
    PYTHONPATH=build/default/python .venv/bin/python bench/bench_python_guard.py
"""
import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid

import torch
import torch.distributed as dist

import trainguard
import trainguard.torch as tgt


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20000, help="iterations of each step loop")
    p.add_argument("--ddp-steps", type=int, default=300, help="iterations of each DDP loop")
    p.add_argument("--every", type=int, default=50, help="checkpoint_every_steps")
    p.add_argument("--layers", default="0,30,100",
                   help="Linear layers of the registered model (2 tensors each, +2 AdamW state "
                        "tensors each, +1 step counter each)")
    p.add_argument("--json", default="", help="also write the results here")
    return p.parse_args()


def median_ns(fn, iterations):
    samples = []
    clock = time.perf_counter_ns
    for i in range(iterations):
        t0 = clock()
        fn(i)
        samples.append(clock() - t0)
    return statistics.median(samples), statistics.fmean(samples)


def guard_overhead(layers, steps, every, scratch):
    job = f"bench-guard-{uuid.uuid4().hex[:8]}"
    rt = trainguard.Runtime(job_id=job, run_dir=os.path.join(scratch, job), world_size=1, rank=0,
                            checkpoint_every_steps=every, watchdog_poll_ms=0)
    try:
        registered = 0
        if layers > 0:
            model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(layers)])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            registered = len(tgt.register(rt, model=model, optimizer=opt, rng=True,
                                          extra={"pos": 0}, materialize=True))
        start = rt.start()

        def empty(i):
            with contextlib.nullcontext():
                pass

        def guarded(i):
            with rt.step(start + i):
                pass

        guarded(-1 - start)  # warm-up outside the measured steps (a negative step is not due)
        base, base_mean = median_ns(empty, steps)
        step, step_mean = median_ns(lambda i: guarded(i), steps)
        rt.wait_for_checkpoints(600.0)
        return {"layers": layers, "registered_tensors": registered, "empty_ns": base,
                "step_ns": step, "added_us": (step - base) / 1e3,
                "added_mean_us": (step_mean - base_mean) / 1e3}
    finally:
        rt.close()
        for name in os.listdir("/dev/shm"):
            if job in name:
                os.unlink(os.path.join("/dev/shm", name))


def ddp_breakdown(iterations, scratch):
    from torch.nn.parallel import DistributedDataParallel

    job = f"bench-guard-ddp-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rt = trainguard.Runtime(job_id=job, run_dir=os.path.join(scratch, job), world_size=1, rank=0,
                            checkpoint_every_steps=50)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        tgt.register(rt, model=model, optimizer=opt, rng=True, materialize=True)
        step0 = [rt.start()]
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss_fn = torch.nn.MSELoss()

        def loop(ddp, guarded):
            def body():
                opt.zero_grad(set_to_none=True)
                loss_fn(ddp(x), y).backward()
                opt.step()

            def one(i):
                if guarded:
                    with rt.step(step0[0] + i):
                        body()
                else:
                    body()

            for i in range(10):  # warm-up: DDP lays its buckets out again after iteration 1
                one(i)
            step0[0] += 10
            median, _ = median_ns(one, iterations)
            step0[0] += iterations
            return median

        rows = {"plain DDP": loop(DistributedDataParallel(model), False),
                "DDP find_unused_parameters=True": loop(
                    DistributedDataParallel(model, find_unused_parameters=True), False)}
        # wrap_ddp needs the process group trainguard.torch built; one rank: a plain group.
        rt._torch_group = tgt._GroupRecord(rt.generation, tgt._COMM_ID_BASE,
                                           dist.group.WORLD, set())
        rt._c.register_communicator(tgt._COMM_ID_BASE, "torch/gloo/bench")
        rows["wrap_ddp (hook)"] = loop(tgt.wrap_ddp(rt, model), False)
        rows["wrap_ddp in rt.step()"] = loop(tgt.wrap_ddp(rt, model), True)
        rows["wrap_ddp(fixed_bucket_layout=False) in rt.step()"] = loop(
            tgt.wrap_ddp(rt, model, fixed_bucket_layout=False), True)
        plain = rows["plain DDP"]
        return {name: {"us": ns / 1e3, "ratio": ns / plain} for name, ns in rows.items()}
    finally:
        rt.close()
        dist.destroy_process_group()
        for name in os.listdir("/dev/shm"):
            if job in name:
                os.unlink(os.path.join("/dev/shm", name))


def main():
    args = parse_args()
    torch.set_num_threads(1)
    scratch = tempfile.mkdtemp(prefix="bench-python-guard-")
    try:
        results = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                   "guard": [guard_overhead(int(n), args.steps, args.every, scratch)
                             for n in args.layers.split(",")],
                   "ddp": ddp_breakdown(args.ddp_steps, scratch)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"bench_python_guard: {results['date']}, torch {results['torch']}, "
          f"checkpoint every {args.every} steps")
    print(f"| {'registered tensors':>18} | {'empty with ns':>13} | {'rt.step ns':>10} | "
          f"{'added us (median)':>17} | {'added us (mean)':>15} |")
    for r in results["guard"]:
        print(f"| {r['registered_tensors']:>18} | {r['empty_ns']:>13.0f} | {r['step_ns']:>10.0f} | "
              f"{r['added_us']:>17.2f} | {r['added_mean_us']:>15.2f} |")
    print(f"| {'tiny DDP step (1 gloo rank)':<50} | {'us':>8} | {'x plain':>7} |")
    for name, r in results["ddp"].items():
        print(f"| {name:<50} | {r['us']:>8.1f} | {r['ratio']:>7.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
