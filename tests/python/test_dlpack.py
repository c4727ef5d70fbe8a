# Issue 14, test 6: buffers registered through DLPack are checkpointed in place, whatever their
# dtype and layout; memory swapped behind the registry's back is detected.
import copy

import pytest
import torch

import trainguard
import trainguard.torch as tgt

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]


def _filled(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 200, shape, generator=g).to(dtype)


def _round_trip(rt, tensors):
    """Checkpoints, scribbles over every tensor, restores; returns the expected values."""
    expected = {name: t.clone() for name, t in tensors.items()}
    rt.checkpoint(1)
    rt.wait_for_checkpoints()
    for t in tensors.values():
        with torch.no_grad():
            t.zero_()
    assert rt.restore_checkpoint() == 1
    return expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_dtype_round_trips_bit_exactly(make_runtime, dtype):
    rt = make_runtime()
    t = _filled(dtype, (33, 7), 1)
    rt.register("t", t)
    expected = _round_trip(rt, {"t": t})
    assert torch.equal(t, expected["t"])


def test_a_transposed_tensor_round_trips(make_runtime):
    rt = make_runtime()
    base = _filled(torch.float32, (8, 5), 2)
    t = base.t()
    assert not t.is_contiguous()
    rt.register("t", t)
    expected = _round_trip(rt, {"t": t})
    assert torch.equal(t, expected["t"])


def test_a_slice_with_gaps_is_refused_naming_it(make_runtime):
    rt = make_runtime()
    t = torch.zeros(8, 8)[:, :3]
    with pytest.raises(trainguard.InvalidArgumentError, match="'sliced'"):
        rt.register("sliced", t)


def test_a_requires_grad_parameter_is_registered_by_its_storage(make_runtime):
    rt = make_runtime()
    p = torch.nn.Parameter(_filled(torch.float32, (4, 4), 3))
    rt.register("p", p)
    expected = _round_trip(rt, {"p": p})
    assert torch.equal(p.detach(), expected["p"])
    assert p.requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA driver")
def test_pinned_memory_round_trips(make_runtime):
    rt = make_runtime()
    t = _filled(torch.float32, (64,), 4).pin_memory()
    rt.register("pinned", t)
    expected = _round_trip(rt, {"pinned": t})
    assert torch.equal(t, expected["pinned"])


def test_storage_swapped_by_load_state_dict_assign_is_detected_by_the_next_step(make_runtime):
    rt = make_runtime(checkpoint_every_steps=1)
    model = torch.nn.Linear(3, 2)
    tgt.register(rt, model=model, rng=False)
    with rt.step(0) as s:
        pass
    assert s.result.ok
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(fresh, assign=True)
    with pytest.raises(trainguard.StaleStateError, match="model.weight|model.bias"):
        with rt.step(1):
            pass


def test_optimizer_load_state_dict_is_detected_before_it_is_snapshotted(make_runtime):
    rt = make_runtime(checkpoint_every_steps=1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    tgt.register(rt, model=model, optimizer=opt, materialize=True)
    with pytest.raises(trainguard.StaleStateError, match=r"optimizer\.state\.0\."):
        with rt.step(0) as s:
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # new state tensors
    assert not s.result.ok  # the step failed; nothing stale was snapshotted


def test_in_place_loading_keeps_the_registration_valid(make_runtime):
    rt = make_runtime(checkpoint_every_steps=1)
    model = torch.nn.Linear(3, 2)
    tgt.register(rt, model=model, rng=False)
    model.load_state_dict({k: torch.ones_like(v) for k, v in model.state_dict().items()})
    with rt.step(0) as s:
        pass
    assert s.result.ok
