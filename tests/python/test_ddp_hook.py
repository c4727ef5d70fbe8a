# trainguard.torch's DDP integration in one process (a one-rank gloo group, torch's env://
# rendezvous since a one-rank job has no store): init_process_group builds once per generation,
# wrap_ddp registers guarded_allreduce_hook, which fails the step naming the rank and the bucket
# when a gradient is not finite and records every bucket's allreduce in the collective tracker.
import random
import socket

import pytest
import torch
import torch.distributed as dist

import trainguard
import trainguard.torch as tgt


def _free_port():
    """A loopback port free now, below the ephemeral range (as tests/support/free_port.h draws
    them): no bind to port 0 or outgoing connection of another test can take it before torch's
    store binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in [10000, {low}) after 1000 draws")


def _env_rendezvous(monkeypatch):
    """torch's env:// rendezvous for a one-rank group, on a free loopback port."""
    port = _free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))


@pytest.fixture
def one_rank_group(make_runtime, monkeypatch):
    _env_rendezvous(monkeypatch)
    rt = make_runtime(world_size=1)
    yield rt
    if dist.is_initialized():
        dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def test_init_process_group_builds_once_per_generation(one_rank_group):
    rt = one_rank_group
    assert tgt.init_process_group(rt) is True
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert tgt.init_process_group(rt) is False  # same generation: the group stays
    assert tgt.init_process_group(rt, force=True) is True


def test_wrap_ddp_without_a_group_of_this_generation_is_an_error(one_rank_group):
    with pytest.raises(trainguard.Error, match="init_process_group"):
        tgt.wrap_ddp(one_rank_group, _model())


def test_a_clean_step_through_the_hook_is_ok_and_every_allreduce_is_tracked(one_rank_group):
    rt = one_rank_group
    tgt.init_process_group(rt)
    model = _model()
    ddp = tgt.wrap_ddp(rt, model)
    for step in range(3):
        with rt.step(step) as s:
            ddp(torch.randn(5, 4)).sum().backward()
            assert not s.failed
        assert s.result.ok, s.result.message
    assert rt._c.collective_usage_errors() == 0  # each Begin had its End, on a registered comm


def test_wrap_ddp_lays_the_buckets_out_once_at_construction_last_declared_parameters_first(
        one_rank_group):
    # Two buckets: torch's first one closes at its 1 MiB limit. Laid out in reverse declaration
    # order: the last Linear's weight and bias, the middle weight (1.44 MB: the first bucket is
    # full), then the rest. Without find_unused_parameters: no graph walk, no torch warning.
    rt = one_rank_group
    tgt.init_process_group(rt)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 600), torch.nn.Tanh(),
                                torch.nn.Linear(600, 600), torch.nn.Tanh(), torch.nn.Linear(600, 1))
    ddp = tgt.wrap_ddp(rt, model)
    assert ddp._has_rebuilt_buckets and not ddp.find_unused_parameters
    for step in range(3):
        with rt.step(step) as s:
            ddp(torch.randn(5, 16)).sum().backward()
        assert s.result.ok, s.result.message
    sizes = [4 * p.numel() for p in model.parameters()][::-1]  # float32, last declared first
    expected = f"{sum(sizes[:4])}, {sum(sizes[4:])}"
    assert ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"] == expected


def test_a_nan_gradient_fails_the_step_naming_the_rank_and_the_bucket(one_rank_group):
    rt = one_rank_group
    tgt.init_process_group(rt)
    model = _model()
    ddp = tgt.wrap_ddp(rt, model)
    with rt.step(0) as s:
        loss = ddp(torch.randn(5, 4)).sum() + model[0].bias.sum() * float("nan")
        loss.backward()
        assert s.failed  # the trainer leaves optimizer.step() out
    assert not s.result.ok
    assert s.result.fault == "step_failure" and s.result.action == "skip"
    assert "rank 0: non-finite values (NaN/Inf) in DDP gradient bucket 0" in s.result.message
    assert "0.bias" in s.result.message and "before the allreduce" in s.result.message
    assert rt._c.collective_usage_errors() == 0


def test_a_fault_reported_from_another_thread_reaches_the_step(make_runtime):
    import threading

    rt = make_runtime()
    with rt.step(0) as s:
        t = threading.Thread(target=s.report_fault_from_any_thread, args=("from a callback",))
        t.start()
        t.join()
        assert s.failed
    assert s.result.fault == "step_failure"
    assert "from a callback" in s.result.message


def test_an_exception_after_a_failed_collective_is_a_communication_failure(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        s.report_fault_from_any_thread("allreduce failed", trainguard._C.FAULT_COMMUNICATION_FAILURE)
        raise RuntimeError("a consequence of the failed allreduce")
    assert s.result.fault == "communication_failure"


def test_a_hang_the_watchdog_declares_aborts_the_torch_process_group(make_runtime, monkeypatch):
    # The watchdog (a C++ thread) aborts the registered communicators on a hang; the torch group's
    # abort is queued for trainguard.torch's abort thread, which carries it out while the training
    # thread waits (time.sleep releases the GIL, as a blocked collective does).
    import time

    _env_rendezvous(monkeypatch)
    rt = make_runtime(world_size=1, watchdog_poll_ms=20, watchdog_warmup_samples=3,
                      watchdog_floor_ms=500)
    try:
        assert tgt.init_process_group(rt) is True
        record = rt._torch_group
        for step in range(5):  # teach the step phase its bound (the 500 ms floor)
            with rt.step(step) as s:
                pass
            assert s.result.ok, s.result.message
        assert not record.aborted
        deadline = time.monotonic() + 60  # a bound on the poll, not a measured threshold
        with rt.step(5) as s:
            while not record.aborted and time.monotonic() < deadline:  # the "step" phase hangs
                time.sleep(0.02)
        assert record.aborted, "the watchdog's abort never reached the torch process group"
        assert not s.result.ok
        assert s.result.fault == "communication_failure", s.result
        assert "hang" in s.result.message, s.result.message
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_step_that_failed_before_backward_puts_a_nan_into_its_buckets_for_every_rank_to_see(
        one_rank_group):
    # check_loss judges this rank's loss alone; the hook passes its failure on through the
    # allreduce (a NaN in this rank's contribution), so every rank fails the step
    # (test_python_ddp's loss spike on one rank of a real job). This rank's step keeps its own
    # message.
    rt = one_rank_group
    tgt.init_process_group(rt)
    model = _model()
    ddp = tgt.wrap_ddp(rt, model)
    with rt.step(0) as s:
        loss = ddp(torch.randn(5, 4)).sum()
        assert not s.check_loss(float("nan"))
        loss.backward()
        reduced = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.isnan(reduced).sum() == 1  # one element of the bucket, the rest reduced
        assert s.failed
    assert s.result.fault == "step_failure" and s.result.action == "skip"
    assert s.result.message.endswith(": loss is not finite (nan) on rank 0 at step 0"), \
        s.result.message
    model.zero_grad(set_to_none=True)  # as trainguard.torch.register's model is after a failure
    with rt.step(1) as s:  # the next step contributes its gradients as they are
        ddp(torch.randn(5, 4)).sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert s.result.ok, s.result.message
    assert rt._c.collective_usage_errors() == 0


def test_a_check_loss_that_fails_after_backward_warns_that_only_this_rank_skips(
        one_rank_group, monkeypatch, capfd):
    rt = one_rank_group
    monkeypatch.setattr(trainguard.runtime, "_warned_check_loss_after_reduction", False)
    tgt.init_process_group(rt)
    ddp = tgt.wrap_ddp(rt, _model())
    with rt.step(0) as s:
        loss = ddp(torch.randn(5, 4)).sum()
        loss.backward()
        assert not s.check_loss(float("inf"))
    assert not s.result.ok
    err = capfd.readouterr().err
    assert "rank 0: step 0: check_loss failed the step after the DDP gradients were reduced" \
        in err, err
    assert "before loss.backward()" in err, err
