"""bench_store_torch: torch's TCPStore and trainguard's TcpStore, side by side in one run.

The same `ops` workload as bench_store (bench/bench_store.cc): for each client count C and each
operation (set, get, add), C clients each issue --ops operations back to back; reported: the total
operations per second and the p50 and p99 latency of one operation. `add` hits one shared counter;
`set` and `get` use a key per client; values are --value-bytes bytes.

    .venv/bin/python bench/bench_store_torch.py --bench-store build/default/bench/bench_store \\
        --clients 1,16,64 --ops 2000 --repeat 3 --baseline

or `cmake --build build/default --target bench_store_torch` (the same flags).

How the two sides are driven, and why that is a fair match:
- torch: its libuv server in a process of its own, and each client a process of its own with one
  TCPStore connection, forked from this script after `import torch.distributed` (so the clients
  start in milliseconds and share torch's pages). Processes, not threads: a Python client holds
  the GIL between calls, so threads would measure the GIL rather than the store. The clients are
  Python, as torch's users' are; the Python call and the clock reads add about a microsecond.
- trainguard: bench_store, whose clients are threads of one process, each with its own TcpStore
  (one connection), and whose server is a thread of that process: C++, as trainguard's users'
  clients are (the Runtime, the launcher's agents). A fresh server per row.
- Both use loopback TCP, one connection per client, 64-byte values by default, and the same cores.
- The two sides alternate: each repeat measures torch then trainguard at each client count, so a
  change of the machine's load during the run falls on both; the table gives each row's median
  over the repeats.
- What one operation is differs where torch's protocol does. torch's `set` is not answered: its
  client returns once the request is written, so its latency is one send (marked "sent" below);
  its ops/s counts a final round trip (`check`) after the last set, so it does count what the
  server applied. trainguard's `Set` waits for the server's answer, which carries a refusal when
  the writer is fenced. torch's `get` is two round trips (a WAIT for the key, then the GET), as its
  client does it; `add` is one round trip on both.

--baseline adds trainguard with busy polling off (bench_store --busy_poll_us=0, every wait sleeps
at once) to show what TcpStoreOptions::busy_poll buys on this machine, in the same run.

Prints one table (the ratio columns: trainguard's ops/s over torch's, torch's p50 over
trainguard's; above 1 means trainguard is faster) and, with --json FILE, writes every measurement.
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import timedelta

OPS = ("set", "get", "add")


def _client(port, op, index, ops, value_bytes, ready, start, out):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60),
                          use_libuv=True)
    key, value = f"k{index}", b"x" * value_bytes
    store.set(key, value)
    store.check([key])  # the set above is applied before the clock starts
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
    if op == "set":
        store.check([key])  # one round trip: the server has applied every set before it answers
    out.put((latencies, time.perf_counter()))


def _server(port_out, stop):
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60),
                           wait_for_workers=False, use_libuv=True)
    port_out.put(server.port)
    stop.wait()


class TorchStore:
    """torch's TCPStore server in a process of its own, measured by client processes."""

    def __init__(self):
        import torch.distributed  # noqa: F401  (imported once here; the forks inherit it)
        self.ctx = mp.get_context("fork")
        port_out, self.stop = self.ctx.Queue(), self.ctx.Event()
        self.server = self.ctx.Process(target=_server, args=(port_out, self.stop))
        self.server.start()
        self.port = port_out.get(timeout=60)

    def close(self):
        self.stop.set()
        self.server.join(timeout=60)

    def ops(self, op, clients, ops, value_bytes):
        """(ops/s, p50 us, p99 us) of `clients` processes issuing `op`."""
        ctx = self.ctx
        ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_client,
                             args=(self.port, op, i, ops, value_bytes, ready, start, out))
                 for i in range(clients)]
        for p in procs:
            p.start()
        for _ in procs:  # each connected and set its key: the clock starts at the signal
            ready.get(timeout=120)
        t0 = time.perf_counter()
        start.set()
        latencies, last_end = [], t0
        for _ in procs:
            mine, end = out.get(timeout=600)
            latencies += mine
            last_end = max(last_end, end)
        for p in procs:
            p.join(timeout=60)
        latencies.sort()
        n = len(latencies)
        return (n / (last_end - t0), latencies[n // 2] / 1e3,
                latencies[min(n - 1, int(n * 0.99))] / 1e3)


def trainguard_ops(bench_store, clients, ops, value_bytes, busy_poll_us=None):
    """{op: (ops/s, p50 us, p99 us)} from bench_store's tcp backend at `clients` clients."""
    command = [bench_store, "--backends=tcp", "--workloads=ops", f"--clients={clients}",
               f"--ops={ops}", f"--value_bytes={value_bytes}"]
    if busy_poll_us is not None:
        command.append(f"--busy_poll_us={busy_poll_us}")
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {run.returncode}):\n{run.stderr}")
    out = run.stdout
    rows = {}
    for m in re.finditer(r"^tcp\s+(set|get|add)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out,
                         re.MULTILINE):
        rows[m.group(1)] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
    if set(rows) != set(OPS):
        sys.exit(f"bench_store printed no complete tcp rows:\n{out}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-store", required=True, help="path of the bench_store binary")
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3,
                        help="measurements of each row, alternating the backends; the median shown")
    parser.add_argument("--baseline", action="store_true",
                        help="also measure trainguard with busy polling off (--busy_poll_us=0)")
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    backends = ["torch", "trainguard"] + (["trainguard busy_poll=0"] if args.baseline else [])

    load_before = os.getloadavg()
    # runs[(backend, op, clients)] = [(ops/s, p50, p99), ...], one per repeat
    runs = {}
    torch_store = TorchStore()
    try:
        for _ in range(args.repeat):
            for c in clients:
                for op in OPS:
                    runs.setdefault(("torch", op, c), []).append(
                        torch_store.ops(op, c, args.ops, args.value_bytes))
                for backend, poll in (("trainguard", None), ("trainguard busy_poll=0", 0)):
                    if backend not in backends:
                        continue
                    for op, row in trainguard_ops(args.bench_store, c, args.ops,
                                                  args.value_bytes, poll).items():
                        runs.setdefault((backend, op, c), []).append(row)
    finally:
        torch_store.close()
    load_after = os.getloadavg()

    def median(key, field):
        return statistics.median(r[field] for r in runs[key])

    print(f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}; median of {args.repeat} runs per row")
    print(f"{'op':<4} {'clients':>7} {'backend':<23} {'ops/s':>9} {'p50_us':>8} {'p99_us':>8}"
          f" {'x ops/s':>8} {'x p50':>6}")
    for c in clients:
        for op in OPS:
            torch_rate, torch_p50 = median(("torch", op, c), 0), median(("torch", op, c), 1)
            for backend in backends:
                key = (backend, op, c)
                rate, p50, p99 = median(key, 0), median(key, 1), median(key, 2)
                ratio = ""
                if backend != "torch":
                    ratio = f" {rate / torch_rate:>8.2f} {torch_p50 / p50:>6.2f}"
                sent = " (sent)" if backend == "torch" and op == "set" else ""
                print(f"{op:<4} {c:>7} {backend + sent:<23} {rate:>9.0f} {p50:>8.1f} {p99:>8.1f}"
                      f"{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after,
                       "runs": [{"backend": b, "op": o, "clients": c,
                                 "ops_per_s": [r[0] for r in rows],
                                 "p50_us": [r[1] for r in rows], "p99_us": [r[2] for r in rows]}
                                for (b, o, c), rows in runs.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
