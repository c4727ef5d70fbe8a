# The guard, recover(), phases and options from Python: unit-level specifications.
import json
import os
import subprocess

import numpy as np
import pytest

import trainguard


def test_a_step_without_exception_is_ok(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        pass
    assert s.result.ok
    assert s.result.step == 0
    assert s.result.fault == "none"


def test_a_recoverable_error_is_recorded_swallowed_and_skipped(make_runtime):
    rt = make_runtime()
    with rt.step(4) as s:
        raise trainguard.RecoverableError("bad batch 17")
    assert not s.result.ok
    assert s.result.fault == "step_failure"
    assert s.result.action == "skip"
    assert "bad batch 17" in s.result.message
    assert rt.recover(s.result) == 5


def test_an_unknown_exception_is_fatal_and_recover_raises_job_must_exit(make_runtime):
    rt = make_runtime()
    with rt.step(2) as s:
        raise ValueError("shape mismatch")
    assert s.result.fault == "unclassified"
    with pytest.raises(trainguard.JobMustExit) as info:
        rt.recover(s.result)
    assert info.value.result is s.result


def test_keyboard_interrupt_passes_through_and_ends_the_step(make_runtime):
    rt = make_runtime()
    with pytest.raises(KeyboardInterrupt):
        with rt.step(0) as s:
            raise KeyboardInterrupt()
    assert s.result is not None
    with rt.step(1) as s:  # the guard was released: the next step runs
        pass
    assert s.result.ok


def test_system_exit_passes_through(make_runtime):
    rt = make_runtime()
    with pytest.raises(SystemExit):
        with rt.step(0):
            raise SystemExit(3)


def test_communication_error_asks_for_a_re_rendezvous(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        raise trainguard.CommunicationError("peer 3 gone")
    assert s.result.fault == "communication_failure"
    assert s.result.action == "re_rendezvous"
    with pytest.raises(trainguard.JobMustExit):  # a static job cannot re-rendezvous
        rt.recover(s.result)


def test_skips_past_the_limit_stop_the_job_without_checkpoints(make_runtime):
    rt = make_runtime(max_consecutive_step_failures=2)
    step = 0
    with pytest.raises(trainguard.JobMustExit):
        for _ in range(5):
            with rt.step(step) as s:
                raise trainguard.RecoverableError("again")
            step = rt.recover(s.result)


def test_a_nan_loss_fails_the_step(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        assert s.check_loss(1.5)
    assert s.result.ok
    with rt.step(1) as s:
        assert not s.check_loss(float("nan"))
    assert s.result.fault == "step_failure"
    assert "loss" in s.result.message


def test_check_finite_names_the_buffer_with_a_nan(make_runtime):
    rt = make_runtime()
    grads = np.ones(1000, dtype=np.float32)
    grads[123] = np.inf
    with rt.step(0) as s:
        assert s.check_finite("ok.grad", np.zeros(10, dtype=np.float32))
        assert not s.check_finite("layer3.grad", grads)
    assert not s.result.ok
    assert "layer3.grad" in s.result.message


def test_check_finite_refuses_an_integer_buffer(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        with pytest.raises(trainguard.InvalidArgumentError, match="ids"):
            s.check_finite("ids", np.zeros(4, dtype=np.int64))


def test_step_helpers_outside_the_block_raise(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        pass
    with pytest.raises(trainguard.Error, match="not inside"):
        s.check_loss(1.0)


def test_phases_nest_inside_a_step_and_ticks_are_accepted(make_runtime):
    rt = make_runtime()
    with rt.step(0) as s:
        with rt.phase("generate"):
            for _ in range(3):
                rt.tick(16)
        with rt.phase("train"):
            pass
    assert s.result.ok


def test_identity_of_a_static_single_rank_job(make_runtime):
    rt = make_runtime()
    assert (rt.rank, rt.world_size, rt.generation) == (0, 1, 0)
    assert rt.resume_step() == 0
    assert rt.store is None


def test_an_unknown_option_is_an_error_naming_it(tmp_path):
    with pytest.raises(trainguard.Error, match="no_such_option"):
        trainguard.Runtime(no_such_option=1, run_dir=str(tmp_path))


def test_checkpoint_copy_threads_is_an_option_checked_on_creation(make_runtime):
    with pytest.raises(trainguard.InvalidArgumentError,
                       match="checkpoint_copy_threads must be <= 256, got 300"):
        make_runtime(checkpoint_copy_threads=300)
    rt = make_runtime(checkpoint_copy_threads=16, checkpoint_every_steps=1)
    rt.register("weight", np.ones(1 << 21, dtype=np.float32))  # 8 MiB: two chunks
    with rt.step(0) as s:
        pass
    assert s.result.ok


def test_from_env_reads_torchrun_variables_and_overrides(monkeypatch, tmp_path, job_id):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with trainguard.Runtime.from_env(job_id=job_id, run_dir=str(tmp_path)) as rt:
        assert (rt.rank, rt.world_size) == (1, 2)
        assert rt.job_id == job_id


def test_start_without_checkpointing_returns_step_zero(make_runtime):
    rt = make_runtime()
    assert rt.start() == 0


def test_emit_event_appends_a_custom_event_with_its_step_and_attributes(make_runtime, tmp_path):
    cli = os.environ.get("TG_CLI")
    if not cli:
        pytest.skip("TG_CLI (the trainguard binary) is not set; ctest sets it")
    rt = make_runtime()
    rt.emit_event("step done", step=7, kind=trainguard.EventKind.STEP_DONE, pid=1234)
    rt.emit_event("no step", mine="yes")
    with pytest.raises(trainguard.InvalidArgumentError, match="no event kind is named 'stepdone'"):
        rt.emit_event("typo", kind="stepdone")
    with pytest.raises(trainguard.InvalidArgumentError, match="leave out the attribute 'what'"):
        rt.emit_event("twice", kind="step_done", what="step_done")
    out = subprocess.run([cli, "events", "--json", str(tmp_path / "run")], check=True,
                         capture_output=True, text=True).stdout
    custom = [json.loads(line) for line in out.splitlines()
              if json.loads(line)["type"] == 5]  # EventType::kCustom
    assert [e["message"] for e in custom] == ["step done", "no step"]
    assert custom[0]["step"] == "7" and custom[1]["step"] == "-1"
    assert [(a["key"], a["value"]) for a in custom[0]["attributes"]] == [
        ("what", "step_done"), ("pid", "1234")]
    assert [(a["key"], a["value"]) for a in custom[1]["attributes"]] == [("mine", "yes")]
    assert custom[0]["rank"] == 0


# Issue 40, 10: one line on stderr per recovery, and nothing on a fresh start.
def test_every_recovery_prints_one_line_and_a_fresh_start_none(make_runtime, capfd):
    rt = make_runtime()
    assert rt.start() == 0
    with rt.step(4) as s:
        raise trainguard.RecoverableError("bad batch 17")
    assert rt.recover(s.result) == 5
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("trainguard:")]
    assert lines == ["trainguard: rank 0: step 4 failed (step_failure): skip, resuming at step 5"]
