# Issue 40: what a PyTorch user hits first. A step entered after the rank's generation was
# superseded, a registration after the first snapshot, gradients left by a failed step, a script
# that never closes its Runtime, torchrun's variables, a guard whose cost does not grow with the
# registered state.
import os
import subprocess
import sys
import time

import pytest
import torch

import trainguard
import trainguard.torch as tgt

from conftest import join_generation_0_as_coordinator, run_job, trainguard_cli

DEADLINE_S = 120  # a bound on each poll, not a measured threshold


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


# Issue 40, 4: the test is the coordinator. It publishes generation 0 with this rank, then
# generation 1 in which a standby holds rank 0: this rank was replaced while it ran. Its loop runs
# no collective, so no collective can fail to tell it; the guard does: the next step fails before
# its body as a communication failure, and recover() says that this process was replaced.
def test_a_replaced_rank_whose_steps_run_no_collective_stops_at_its_next_step(
        server, store, tmp_path, job_id):
    rt = join_generation_0_as_coordinator(server, store, tmp_path, job_id, watchdog_poll_ms=0)
    try:
        ran = []
        with rt.step(0) as s:
            ran.append(0)
        assert s.result.ok
        store.set("rdzv/gen/1/changes", b"1\n1\n0 host:standby0", 10)
        store.set("rdzv/gen/1/table", b"1\n1\nhost:standby0", 10)
        store.set("rdzv/current", b"1", 10)
        deadline = time.monotonic() + DEADLINE_S
        while rt._c.superseded_generation != 0:  # bounded polling: the watcher thread tells it
            assert time.monotonic() < deadline, "the rank never learnt of generation 1"
            time.sleep(0.01)
        with rt.step(1) as s:
            assert s.failed  # failed before the body ran
        r = s.result
        assert not r.ok
        assert r.fault == "communication_failure" and r.action == "re_rendezvous", r
        assert "generation 0 was superseded before step 1 began" in r.message, r
        with pytest.raises(trainguard.JobMustExit):
            rt.recover(r)
    finally:
        rt.close()


# Issue 40, 5: a snapshot of the old layout could not be restored into the new one.
def test_a_buffer_registered_after_the_first_checkpoint_is_refused(make_runtime):
    rt = make_runtime(checkpoint_every_steps=1)
    model, opt = _model()
    tgt.register(rt, model=model, optimizer=opt, materialize=True)
    step = rt.start()
    with rt.step(step) as s:
        pass
    assert s.result.ok
    rt.wait_for_checkpoints()
    late = torch.zeros(8)
    with pytest.raises(trainguard.Error, match=r"state buffer \"late\": registered after the "
                                               r"first checkpoint or restore"):
        rt.register("late", late)
    assert "late" not in rt.buffer_names()


# Issue 40, 1: gradients of a failed step are dropped whatever the loop does.
def test_a_failed_step_drops_the_registered_models_gradients(make_runtime):
    rt = make_runtime(checkpoint_every_steps=100)
    model, opt = _model()
    tgt.register(rt, model=model, optimizer=opt, materialize=True)
    step = rt.start()
    with rt.step(step) as s:
        model(torch.ones(2, 4)).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
        raise trainguard.RecoverableError("the rest of the step (and its zero_grad) is skipped")
    assert s.result.action == "skip"
    assert all(p.grad is None for p in model.parameters())
    # A step that succeeds keeps its gradients: accumulating across steps stays the loop's choice.
    with rt.step(step + 1) as s:
        model(torch.ones(2, 4)).sum().backward()
    assert s.result.ok
    assert all(p.grad is not None for p in model.parameters())
    # recover() (a rollback, a re-rendezvous, a skip) drops them too.
    with rt.step(step + 2) as s:
        raise trainguard.RecoverableError("again")
    model(torch.ones(2, 4)).sum().backward()  # made between the failure and recover()
    rt.recover(s.result)
    assert all(p.grad is None for p in model.parameters())


_NO_CLOSE = r"""
import sys, trainguard
rt = trainguard.Runtime.from_env(checkpoint_every_steps=2)
step = rt.start()
while step < 6:
    with rt.step(step) as s:
        pass
    step = step + 1 if s.result.ok else rt.recover(s.result)
print(f"rank {rt.rank} done", flush=True)
# no rt.close(): interpreter exit closes it
"""


# Issue 40, 7: every rank of a job whose script never calls close() ended with SIGABRT
# ("terminate called without an active exception") and the launcher replaced them.
def test_a_script_that_never_closes_its_runtime_ends_cleanly_under_trainguard_run(tmp_path):
    script = tmp_path / "no_close.py"
    script.write_text(_NO_CLOSE)
    done = run_job(tmp_path, "noclose", ["--nproc", "2"], [sys.executable, str(script)],
                   DEADLINE_S)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert "terminate called" not in out and "SIGABRT" not in out, out
    assert "takes rank" not in out, out


# A Runtime dropped without close() is closed when it is garbage-collected: its arena lock is
# released, so a new Runtime of the same job and rank can take it.
def test_a_runtime_dropped_without_close_is_closed(tmp_path, job_id):
    options = dict(job_id=job_id, run_dir=str(tmp_path / "run"), checkpoint_every_steps=1,
                   watchdog_poll_ms=0)

    def run_one_step_and_drop_the_runtime():
        rt = trainguard.Runtime(**options)
        rt.register("w", torch.ones(4))
        with rt.step(rt.start()) as s:
            pass
        assert s.result.ok

    try:
        run_one_step_and_drop_the_runtime()
        again = trainguard.Runtime(**options)
        again.register("w", torch.zeros(4))
        assert again.start() == 1
        again.close()
    finally:
        for name in os.listdir("/dev/shm"):
            if job_id in name:
                os.unlink(os.path.join("/dev/shm", name))


# Issue 40, 9: scripts pick their device from LOCAL_RANK once from_env() returns.
def test_from_env_sets_torchrun_variables_and_local_rank(monkeypatch, tmp_path, job_id):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "ROLE_RANK", "TRAINGUARD_RANK", "TRAINGUARD_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINGUARD_RANK", "3")
    monkeypatch.setenv("TRAINGUARD_WORLD_SIZE", "4")
    monkeypatch.setenv("TRAINGUARD_LOCAL_RANK", "1")
    monkeypatch.setenv("TRAINGUARD_LOCAL_WORLD_SIZE", "2")
    with trainguard.Runtime.from_env(job_id=job_id, run_dir=str(tmp_path)) as rt:
        assert rt.local_rank == 1
        assert os.environ["RANK"] == "3" and os.environ["LOCAL_RANK"] == "1"
        assert os.environ["WORLD_SIZE"] == "4" and os.environ["LOCAL_WORLD_SIZE"] == "2"
        assert os.environ["GROUP_RANK"] == "1"


# Issue 40, 9: `trainguard run` sets OMP_NUM_THREADS=1 for ranks that share a host, as torchrun
# does (each rank's intra-op threads would otherwise oversubscribe the cores), and keeps a value the
# user set.
def test_trainguard_run_sets_omp_num_threads_for_ranks_sharing_a_host(monkeypatch, tmp_path):
    probe = [sys.executable, "-c",
             "import os; print('rank', os.environ['RANK'], 'omp', os.environ.get('OMP_NUM_THREADS'))"]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    unset = run_job(tmp_path / "unset", "omp", ["--nproc", "2"], probe, 120)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    kept = run_job(tmp_path / "kept", "omp", ["--nproc", "2"], probe, 120)
    for done, value in ((unset, "1"), (kept, "3")):
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        for rank in (0, 1):
            assert f"rank {rank} omp {value}" in out, out


# Issue 40, 8: the per-step check of registered storage runs only before a snapshot, so a step's
# work does not grow with the number of registered tensors; a replaced tensor is still caught then.
def test_moved_storage_is_caught_at_the_next_snapshot_not_walked_every_step(make_runtime):
    rt = make_runtime(checkpoint_every_steps=3)
    model, opt = _model()
    tgt.register(rt, model=model, optimizer=opt, materialize=True)
    step = rt.start()
    walks = []
    real = rt._stale
    rt._stale = lambda: walks.append(1) or real()
    for n in range(step, step + 6):
        with rt.step(n) as s:
            pass
        assert s.result.ok
    assert len(walks) == 2  # after steps 2 and 5, which start a snapshot
    rt.wait_for_checkpoints()
    with torch.no_grad():
        model[0].weight = torch.nn.Parameter(torch.zeros(4, 4))
    for n in (step + 6, step + 7):  # no snapshot after them: not checked
        with rt.step(n) as s:
            pass
        assert s.result.ok
    with pytest.raises(trainguard.StaleStateError, match="model.0.weight"):
        with rt.step(step + 8):
            pass


# numpy, not torch, holds the state: the segments are the same, and the process is ready in a
# fraction of torch's import.
_HOLDS_ITS_ARENA = r"""
import sys, numpy, trainguard
rt = trainguard.Runtime(job_id=sys.argv[1], run_dir=sys.argv[2], checkpoint_every_steps=1)
rt.register("w", numpy.ones(1024, dtype=numpy.float32))
with rt.step(rt.start()) as s:
    pass
rt.wait_for_checkpoints()
print("ready", flush=True)
sys.stdin.read()  # until the test kills it
"""


# Issue 40, 3: the segments a run outside `trainguard run` leaves behind when it is killed are
# listed with the process that holds them, kept while it lives, and removed once it is dead.
def test_trainguard_shm_lists_and_removes_what_a_killed_run_left(tmp_path, job_id):
    cli = trainguard_cli()

    def shm(*args):
        return subprocess.run([cli, "shm", *args], capture_output=True, text=True, timeout=60)

    proc = subprocess.Popen([sys.executable, "-c", _HOLDS_ITS_ARENA, job_id, str(tmp_path / "r")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        listed = shm("list", "--job", job_id)
        assert listed.returncode == 0, listed.stderr
        assert f"trainguard.{job_id}.rank0" in listed.stdout, listed.stdout
        assert f"trainguard.{job_id}.fr.rank0" in listed.stdout, listed.stdout
        assert f"pid {proc.pid}" in listed.stdout, listed.stdout
        kept = shm("remove", "--job", job_id)
        assert kept.returncode == 1, kept.stdout + kept.stderr
        assert f"held by pid {proc.pid}: kept" in kept.stderr, kept.stderr
        assert os.path.exists(f"/dev/shm/trainguard.{job_id}.rank0")
        assert proc.pid > 1
        proc.kill()  # our own child, alive until now: SIGKILL, as a crash
        proc.wait(timeout=60)
        listed = shm("list", "--job", job_id)
        assert f"pid {proc.pid}" not in listed.stdout, listed.stdout
        removed = shm("remove", "--job", job_id)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert f"removed /dev/shm/trainguard.{job_id}.rank0 (snapshot arena" in removed.stdout
        assert not [n for n in os.listdir("/dev/shm") if job_id in n]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for name in os.listdir("/dev/shm"):
            if job_id in name:
                os.unlink(os.path.join("/dev/shm", name))


# Issue 40, 3: two unrelated runs of a script that names no job would share the default id, and
# the second would resume (or replace) the first's state.
def test_a_runtime_that_checkpoints_needs_a_job_id(monkeypatch, tmp_path):
    for name in ("TRAINGUARD_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(trainguard.Error, match="job_id is not set"):
        trainguard.Runtime.from_env(checkpoint_every_steps=10, run_dir=str(tmp_path))


# Issue 40, 3: a rerun under the same job id with a model of another size fails naming both
# layouts, and the first run's state is still there for it.
def test_a_rerun_with_another_model_fails_naming_both_layouts(tmp_path, job_id):
    options = dict(job_id=job_id, run_dir=str(tmp_path / "run"), checkpoint_every_steps=1,
                   watchdog_poll_ms=0)
    try:
        with trainguard.Runtime(**options) as rt:
            rt.register("w", torch.ones(8))
            with rt.step(rt.start()) as s:
                pass
            assert s.result.ok
        with trainguard.Runtime(**options) as rt:
            rt.register("w", torch.ones(16))
            with pytest.raises(trainguard.JobMustExit,
                               match=r"holds the state of layout hash [0-9a-f]{16}, the registry "
                                     r"has layout hash [0-9a-f]{16} \(1 buffers, 64 bytes: w"):
                rt.start()
        with trainguard.Runtime(**options) as rt:
            w = torch.zeros(8)
            rt.register("w", w)
            assert rt.start() == 1
            assert torch.equal(w, torch.ones(8))
    finally:
        for name in os.listdir("/dev/shm"):
            if job_id in name:
                os.unlink(os.path.join("/dev/shm", name))


# Issue 40, 2: a state broadcast still owed fails a step that would succeed, loudly; a step that
# failed anyway (a peer lost while the group was rebuilt) goes to recover() as usual.
def test_a_step_that_succeeds_without_the_owed_state_broadcast_is_refused(make_runtime):
    rt = make_runtime()
    rt.register("w", torch.ones(4))
    rt.start()
    rt._state_sync = (rt.generation, 1)  # as after a re-rendezvous with no commit
    with rt.step(0) as s:
        raise trainguard.CommunicationError("a peer died while the process group was rebuilt")
    assert s.result.action == "re_rendezvous"
    with pytest.raises(trainguard.Error, match=r"must take rank 1's registered state"):
        with rt.step(1):
            pass
