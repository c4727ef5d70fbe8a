# Issue 14, test 7: optimizer state, param_groups and RNG states round-trip through the
# shared-memory arena and through disk, into a fresh model and optimizer.
import os
import random

import pytest
import torch

import trainguard
import trainguard.torch as tgt


def _make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def _train(model, opt, steps):
    for _ in range(steps):
        x = torch.randn(4, 6)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _run_and_checkpoint(tmp_path, job_id, extra):
    model, opt = _make()
    rt = trainguard.Runtime(job_id=job_id, run_dir=str(tmp_path / "run"),
                            checkpoint_every_steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    tgt.register(rt, model=model, optimizer=opt, rng=True, extra=extra, materialize=True)
    step = rt.start()
    while step < 3:
        with rt.step(step) as s:
            _train(model, opt, 1)
            opt.param_groups[0]["lr"] *= 0.5
            extra["seen"] = step + 1
        assert s.result.ok
        step += 1
        # A save still running when the next one is due is skipped (docs/GUIDE.md section 10):
        # let each step's snapshot (and its persistence) finish, so step 3's is the newest.
        rt.wait_for_checkpoints()
    # What a resumed run must see: the state after step 2, and the RNG streams from here on.
    expected = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "opt": opt.state_dict(),
        "torch_draw": torch.rand(3),
        "python_draw": random.random(),
    }
    rt.close()
    return expected


def _resume(tmp_path, job_id):
    torch.manual_seed(123)  # different RNG and model values, to be overwritten by the restore
    random.seed(123)
    model, opt = _make()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    extra = {"seen": -1}
    rt = trainguard.Runtime(job_id=job_id, run_dir=str(tmp_path / "run"),
                            checkpoint_every_steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    tgt.register(rt, model=model, optimizer=opt, rng=True, extra=extra, materialize=True)
    step = rt.start()
    return rt, model, opt, extra, step


def _assert_same(expected, rt, model, opt, extra, step, source):
    try:
        assert step == 3
        assert rt.last_restore_source == source
        for k, v in model.state_dict().items():
            assert torch.equal(v, expected["model"][k]), k
        got = opt.state_dict()
        assert got["param_groups"] == expected["opt"]["param_groups"]
        for i, state in expected["opt"]["state"].items():
            for key, value in state.items():
                assert torch.equal(got["state"][i][key], value), (i, key)
        assert extra == {"seen": 3}
        # The RNG states were those saved after step 2's snapshot was taken... at the snapshot.
        assert torch.equal(torch.rand(3), expected["torch_draw"])
        assert random.random() == expected["python_draw"]
    finally:
        rt.close()


def test_optimizer_param_groups_and_rng_round_trip_through_the_arena(tmp_path, job_id):
    expected = _run_and_checkpoint(tmp_path, job_id, {"seen": 0})
    _assert_same(expected, *_resume(tmp_path, job_id), "arena")


def test_optimizer_param_groups_and_rng_round_trip_through_disk(tmp_path, job_id):
    expected = _run_and_checkpoint(tmp_path, job_id, {"seen": 0})
    for name in os.listdir("/dev/shm"):  # the machine lost its memory: only the disk is left
        if job_id in name:
            os.unlink(os.path.join("/dev/shm", name))
    _assert_same(expected, *_resume(tmp_path, job_id), "disk")


def test_an_optimizer_without_state_is_refused_unless_materialized(make_runtime):
    rt = make_runtime()
    model, opt = _make()
    with pytest.raises(trainguard.Error, match="materialize=True"):
        tgt.register(rt, model=model, optimizer=opt)


def test_materializing_leaves_parameters_and_counters_untouched(make_runtime):
    rt = make_runtime()
    model, opt = _make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tgt.register(rt, model=model, optimizer=opt, materialize=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    for state in opt.state.values():
        assert float(state["step"]) == 0
    assert all(p.grad is None for p in model.parameters())
