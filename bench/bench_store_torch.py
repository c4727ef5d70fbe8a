"""bench_store_torch: torch's TCPStore and trainguard's TcpStore, side by side in one run.

The same `ops` workload as bench_store (bench/bench_store.cc): for each client count C and each
operation (set, get, add), C clients each issue --ops operations back to back; reported: the total
operations per second and the p50 and p99 latency of one operation. `add` hits one shared counter;
`set` and `get` use a key per client; values are --value-bytes bytes. torch's clients are
processes (one TCPStore client each, so the GIL serializes nothing), its server the libuv one in a
process of its own; trainguard's figures are bench_store's, run by this script right after, so
both see the same machine.

    PYTHONPATH=build/default/python .venv/bin/python bench/bench_store_torch.py \
        --bench-store build/default/bench/bench_store --clients 1,16,64 --ops 2000

Prints one table with both backends, and, with --json FILE, writes the rows.
"""
import argparse
import json
import multiprocessing as mp
import re
import subprocess
import sys
import time
from datetime import timedelta


def _client(port, op, index, ops, value_bytes, ready, start, out):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60),
                          use_libuv=True)
    key, value = f"k{index}", b"x" * value_bytes
    store.set(key, value)
    latencies = []
    ready.put(index)
    if not start.wait(timeout=600):
        return
    for _ in range(ops):
        t = time.perf_counter_ns()
        if op == "set":
            store.set(key, value)
        elif op == "get":
            store.get(key)
        else:
            store.add("counter", 1)
        latencies.append(time.perf_counter_ns() - t)
    out.put(latencies)


def _server(port_out, stop):
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60),
                           wait_for_workers=False, use_libuv=True)
    port_out.put(server.port)
    stop.wait()


def torch_ops(clients, ops, value_bytes):
    """Rows (backend, op, clients, ops/s, p50 us, p99 us) for torch's TCPStore."""
    ctx = mp.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(port_out, stop))
    server.start()
    port = port_out.get(timeout=60)
    rows = []
    try:
        for c in clients:
            for op in ("set", "get", "add"):
                ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
                procs = [ctx.Process(target=_client,
                                     args=(port, op, i, ops, value_bytes, ready, start, out))
                         for i in range(c)]
                for p in procs:
                    p.start()
                for _ in procs:  # each connected and set its key: the clock starts at the signal
                    ready.get(timeout=120)
                t0 = time.perf_counter()
                start.set()
                latencies = []
                for _ in procs:
                    latencies += out.get(timeout=600)
                elapsed = time.perf_counter() - t0
                for p in procs:
                    p.join(timeout=60)
                latencies.sort()
                n = len(latencies)
                rows.append(("torch", op, c, n / elapsed, latencies[n // 2] / 1e3,
                             latencies[min(n - 1, int(n * 0.99))] / 1e3))
    finally:
        stop.set()
        server.join(timeout=60)
    return rows


def trainguard_ops(bench_store, clients, ops, value_bytes):
    """The same rows from bench_store's tcp backend."""
    out = subprocess.run([bench_store, "--backends=tcp", "--workloads=ops",
                          f"--clients={','.join(map(str, clients))}", f"--ops={ops}",
                          f"--value_bytes={value_bytes}"],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    rows = []
    for m in re.finditer(r"^tcp\s+(set|get|add)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out,
                         re.MULTILINE):
        rows.append(("trainguard", m.group(1), int(m.group(2)), float(m.group(3)),
                     float(m.group(4)), float(m.group(5))))
    if not rows:
        sys.exit(f"bench_store printed no tcp rows:\n{out}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-store", required=True, help="path of the bench_store binary")
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    rows = torch_ops(clients, args.ops, args.value_bytes)
    rows += trainguard_ops(args.bench_store, clients, args.ops, args.value_bytes)
    print(f"{'backend':<11} {'op':<4} {'clients':>7} {'ops/s':>10} {'p50_us':>8} {'p99_us':>8}")
    for c in clients:
        for op in ("set", "get", "add"):
            for backend, o, n, rate, p50, p99 in rows:
                if o == op and n == c:
                    print(f"{backend:<11} {o:<4} {n:>7} {rate:>10.0f} {p50:>8.1f} {p99:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("backend", "op", "clients", "ops_per_s", "p50_us", "p99_us"), r))
                       for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
