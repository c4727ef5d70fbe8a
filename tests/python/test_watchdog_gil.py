# Issue 14, test 4: a hang while the training thread holds the GIL. The watchdog is a C++ thread
# that needs no GIL: in a one-rank job without a store it still declares the hang, writes the
# `hang` event and dumps the flight recorder and every thread's stack, and once the training
# thread lets go, the step ends, the Runtime closes and the process exits: nothing deadlocks.
#
# The hang runs in a child process (so that a deadlock could not hang pytest): its training thread,
# inside a phase that stops ticking, blocks in read(2) on a pipe through ctypes.PyDLL, whose calls
# keep the GIL for their whole duration (time.sleep, or a plain ctypes.CDLL call, would release it).
# The test opens the pipe only once the dump and the event are there, so nothing depends on timing:
# every wait is bounded polling.
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

DEADLINE_S = 120  # a bound on each poll, not a measured threshold
# The watchdog's `hang` event (`trainguard events`), naming the step and the phase that stopped.
HANG_EVENT = re.compile(r'rank 0 gen 0 step 5 hang +hang \(phase\) at step 5 in phase '
                        r'"step/generate"')

CHILD = textwrap.dedent("""
    import ctypes
    import sys

    import trainguard

    run_dir, job_id, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: a call keeps the GIL until it returns
    rt = trainguard.Runtime(job_id=job_id, run_dir=run_dir, watchdog_poll_ms=20,
                            watchdog_warmup_samples=3, watchdog_floor_ms=1000)
    for step in range(5):  # teach the "generate" phase its bound (the 1 s floor)
        with rt.step(step) as s:
            with rt.phase("generate"):
                for _ in range(3):
                    rt.tick(1)
        assert s.result.ok, s.result.message
    print("hanging holding the GIL", flush=True)
    interrupted = 0
    with rt.step(5) as s:
        with rt.phase("generate"):
            buf = ctypes.create_string_buffer(1)
            while True:
                n = libc.read(fd, buf, 1)
                if n >= 0:
                    break
                interrupted += 1  # EINTR (the watchdog's stack capture signals every thread)
    r = s.result
    print(f"released read {n} interrupted {interrupted}", flush=True)
    print(f"step 5 ok {r.ok} fault {r.fault} action {r.action}: {r.message}", flush=True)
    rt.close()
    print("closed", flush=True)
""")


def _cli():
    cli = os.environ.get("TG_CLI")
    if not cli:
        pytest.skip("TG_CLI (the trainguard binary) is not set; ctest sets it")
    return cli


def _events(cli, run_dir):
    done = subprocess.run([cli, "events", str(run_dir)], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    return done.stdout + done.stderr


def _dumps(run_dir):
    folder = run_dir / "flight_recorder"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith("rank-00000.") and
                  p.name.endswith(".pb"))


def test_a_hang_holding_the_gil_is_declared_and_dumped_by_the_watchdog_and_nothing_deadlocks(
        tmp_path):
    cli = _cli()
    run_dir = tmp_path / "run"
    job_id = "py-gil-" + uuid.uuid4().hex[:8]
    script = tmp_path / "hang_holding_the_gil.py"
    script.write_text(CHILD)
    out_path = tmp_path / "child.out"
    read_end, write_end = os.pipe()
    with open(out_path, "wb") as out:
        child = subprocess.Popen([sys.executable, str(script), str(run_dir), job_id,
                                  str(read_end)], stdout=out, stderr=subprocess.STDOUT,
                                 pass_fds=(read_end,))
    os.close(read_end)
    output = lambda: out_path.read_text(errors="replace")  # noqa: E731
    try:
        deadline = time.monotonic() + DEADLINE_S
        events = ""
        while True:  # bounded polling until the watchdog has dumped and written its event
            assert child.poll() is None, f"the child ended while hanging:\n{output()}"
            assert time.monotonic() < deadline, \
                f"no hang dump/event in {DEADLINE_S} s:\n{output()}\n{events}"
            if "hanging holding the GIL" in output() and _dumps(run_dir):
                events = _events(cli, run_dir)
                if HANG_EVENT.search(events):
                    break
            time.sleep(0.05)
        os.write(write_end, b"x")  # let the training thread go
        code = child.wait(timeout=DEADLINE_S)
    finally:
        os.close(write_end)
        if child.poll() is None:
            child.kill()
            child.wait()
        for name in os.listdir("/dev/shm"):
            if job_id in name:
                os.unlink(os.path.join("/dev/shm", name))
    out = output()
    assert code == 0, out
    assert "released read 1" in out and "closed" in out, out
    # The step that hung returns the watchdog's verdict (no store, no communicators to abort: the
    # guard reports it once the training thread comes back).
    assert re.search(r"step 5 ok False fault communication_failure action re_rendezvous: .*the "
                     r'watchdog declared a hang: hang \(phase\) at step 5 in phase "step/generate"',
                     out), out
    # The dump: the ring ends with the hang record, and the stacks show the training thread (the
    # child's main thread, tid == pid) still inside the GIL-holding read(2) through ctypes.
    dumps = _dumps(run_dir)
    assert len(dumps) == 1, dumps
    shown = subprocess.run([cli, "flight-recorder", "show", str(dumps[0])], capture_output=True,
                           text=True, timeout=DEADLINE_S)
    text = shown.stdout + shown.stderr
    assert shown.returncode == 0, text
    assert re.search(r"^ +\d+ +\S+ +5 +hang +step/generate", text, re.MULTILINE), text
    assert f"step_thread: {child.pid}" in text, text
    m = re.search(rf'thread {child.pid} "[^"]*":\n((?: +#\d+ .*\n)+)', text)
    assert m, f"no stack of the training thread {child.pid}:\n{text}"
    assert "read" in m.group(1) and "ffi_call" in m.group(1), m.group(1)
