# trainguard's Store from Python, the torch.distributed.Store over it, and (issue 14, test 5) the
# GIL being released while a call waits.
import datetime
import os
import subprocess
import sys
import threading

import pytest
import torch.distributed as dist

import trainguard
import trainguard.torch as tgt

from conftest import STORE_TOKEN as TOKEN, join_generation_0_as_coordinator


def test_store_verbs(store):
    store.set("a", b"1", 10)
    assert store.get("a", 10) == b"1"
    assert store.add("n", 5, 10) == 5
    assert store.compare_set("c", None, b"x", 10) == (True, b"x")
    assert store.compare_set("c", b"y", b"z", 10) == (False, b"x")
    assert store.multi_get(["a", "missing"], 10) == [b"1", None]
    assert store.list_keys("", 10) == ["a", "c", "n"]
    assert store.delete("a", 10)
    with pytest.raises(KeyError, match="a"):
        store.get("a", 10)


def test_a_wait_past_its_deadline_names_the_missing_key(store):
    with pytest.raises(TimeoutError, match="never-set"):
        store.wait(["never-set"], 0.2)


def test_a_python_thread_runs_while_the_main_thread_waits_in_the_store(store):
    # The helper thread can only set the key if it gets the GIL while the main thread is blocked
    # in wait(); if wait() held the GIL, the wait would run out its deadline instead.
    counted = []

    def helper():
        for i in range(1000):
            counted.append(i)
        store.set("ready", b"yes", 10)

    t = threading.Thread(target=helper)
    t.start()
    store.wait(["ready"], 60)
    t.join()
    assert len(counted) == 1000


def test_a_python_thread_runs_while_the_main_thread_waits_for_checkpoints(make_runtime):
    # wait_for_checkpoints and restore_checkpoint release the GIL as well: a thread that needs
    # the GIL to finish makes progress while they run.
    import numpy as np

    rt = make_runtime()
    rt.register("w", np.arange(1 << 20, dtype=np.float32))
    counted = []
    stop = threading.Event()

    def helper():
        while not stop.is_set():
            counted.append(1)

    t = threading.Thread(target=helper)
    t.start()
    try:
        rt.checkpoint(1)
        rt.wait_for_checkpoints()
        assert rt.restore_checkpoint() == 1
    finally:
        stop.set()
        t.join()
    assert counted


def test_torch_store_adapter_verbs(store):
    s = tgt.Store(store, prefix="pg", timeout=datetime.timedelta(seconds=10))
    s.set("k", "v")
    assert s.get("k") == b"v"
    assert s.add("ctr", 2) == 2
    assert s.add("ctr", 3) == 5
    assert s.check(["k", "ctr"])
    assert not s.check(["nope"])
    assert s.num_keys() == 2
    assert s.compare_set("cas", "", "first") == b"first"
    assert s.compare_set("cas", "other", "second") == b"first"
    assert s.delete_key("k")
    assert not s.check(["k"])
    with pytest.raises(Exception, match="nope"):
        s.wait(["nope"], datetime.timedelta(milliseconds=100))


def test_a_torch_store_wait_gives_up_once_its_generation_is_superseded(store):
    # The adapter process_group_store builds: its waits poll `superseded` between slices. The
    # wait is long (600 s) and the key never comes; the generation is superseded once the wait
    # has polled three times: the wait raises CommunicationError then, not at its deadline.
    polls = []

    def superseded():
        polls.append(1)
        return len(polls) > 3

    s = tgt.Store(store, prefix="torch/gen1", timeout=datetime.timedelta(seconds=600),
                  superseded=superseded)
    with pytest.raises(trainguard.CommunicationError, match="superseded"):
        s.wait(["never"])
    assert len(polls) == 4
    s.set("here", "v")  # a key that is there is read whatever the generation
    assert tgt.Store(store, prefix="torch/gen1", superseded=lambda: False).get("here") == b"v"


def test_the_abort_thread_is_woken_as_soon_as_the_generation_is_superseded(server, store, tmp_path,
                                                                           job_id):
    # trainguard.torch's abort thread waits in wait_communicator_abort (GIL released). Here the
    # test is the coordinator: it publishes generation 0 (one rank), then generation 1's table.
    # The Runtime's generation watcher sees it and its superseded handler ends the wait, long
    # before the wait's 600 s: the thread then aborts the superseded generation's process group.
    rt = join_generation_0_as_coordinator(server, store, tmp_path, job_id)
    try:
        assert rt._c.superseded_generation == -1
        woken = []
        waiter = threading.Thread(
            target=lambda: woken.append(rt._c.wait_communicator_abort(600.0)))
        waiter.start()
        store.set("rdzv/gen/1/changes", b"1\n1\n0 host:standby0", 10)
        store.set("rdzv/gen/1/table", b"1\n1\nhost:standby0", 10)
        waiter.join(timeout=120)  # bounds the test if the wake never comes
        assert not waiter.is_alive(), "the wait was not woken by the new generation"
        assert woken == [None]  # no communicator to abort: a wake, not a hang's request
        assert rt._c.superseded_generation == 0
    finally:
        rt.close()


_WORKER = r"""
import sys, datetime, torch, torch.distributed as dist
import trainguard, trainguard.torch as tgt
address, job, token, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = tgt.Store(trainguard.open_store("tcp://" + address, job, token), prefix="torch/gen0",
                  timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
print("sum", t.item())
dist.destroy_process_group()
"""


def test_init_process_group_on_two_processes_through_the_trainguard_store(server, job_id):
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, server.address, job_id, TOKEN,
                               str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for rank in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert "sum 3.0" in out
