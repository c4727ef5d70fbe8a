# Issue 40, item 11: from a persisted trainguard checkpoint back to torch state_dicts (what
# nanoGPT's sample.py loads from ckpt.pt), through `trainguard ckpt export` and
# trainguard.checkpoint.load_state_dicts.
import os
import re

import pytest
import torch

import trainguard
import trainguard.checkpoint as tgc
import trainguard.torch as tgt


class _TinyLM(torch.nn.Module):
    """nanoGPT's shape in miniature: an embedding tied to the output head, a LayerNorm, a buffer."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(11, 6)
        self.ln = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.wte.weight  # tied: named_parameters() lists it once
        self.register_buffer("scale", torch.full((6,), 0.5))

    def forward(self, idx):
        return self.head(self.ln(self.wte(idx)) * self.scale)


def _make(seed=0):
    torch.manual_seed(seed)
    model = _TinyLM()
    # Two groups, as nanoGPT's configure_optimizers makes: weight decay for matrices only.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95))
    return model, opt


def _bits(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _assert_bitwise_equal(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    assert torch.equal(_bits(got), _bits(expected)), what


@pytest.fixture
def trained(tmp_path, job_id):
    """A one-rank job that trained 4 steps with a checkpoint persisted after each; the live model
    and optimizer it ended with, and its checkpoint directory."""
    model, opt = _make()
    extra = {"iter_num": 0, "model_args": {"vocab_size": 11, "n_embd": 6}}
    rt = trainguard.Runtime(job_id=job_id, run_dir=str(tmp_path / "run"), world_size=1,
                            checkpoint_every_steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    try:
        tgt.register(rt, model=model, optimizer=opt, rng=True, extra=extra, materialize=True)
        step = rt.start()
        while step < 4:
            with rt.step(step) as s:
                logits = model(torch.randint(0, 11, (3, 5)))
                loss = logits.logsumexp(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                extra["iter_num"] = step + 1
            assert s.result.ok
            step += 1
            rt.wait_for_checkpoints()  # so that the last step's checkpoint is the newest on disk
    finally:
        rt.close()
    for name in os.listdir("/dev/shm"):
        if job_id in name:
            os.unlink(os.path.join("/dev/shm", name))
    return model, opt, extra, str(tmp_path / "ckpt")


def test_the_exported_model_state_dict_is_the_live_models_bit_for_bit(trained):
    model, opt, extra, ckpt_dir = trained
    fresh_model, fresh_opt = _make(seed=1)
    got = tgc.load_state_dicts(ckpt_dir, model=fresh_model, optimizer=fresh_opt)

    assert got["step"] == 4
    assert got["extra"] == extra
    assert got["metadata"]["trainguard_world_size"] == "1"
    live = model.state_dict()
    assert set(got["model"]) == set(live)  # the tied head.weight filled in, "scale" kept
    for name, value in live.items():
        _assert_bitwise_equal(got["model"][name], value, name)
    fresh_model.load_state_dict(got["model"])  # strict
    for name, value in live.items():
        _assert_bitwise_equal(fresh_model.state_dict()[name], value, name)


def test_the_exported_optimizer_state_dict_loads_into_a_fresh_adamw(trained):
    model, opt, _, ckpt_dir = trained
    fresh_model, fresh_opt = _make(seed=1)
    got = tgc.load_state_dicts(ckpt_dir, model=fresh_model, optimizer=fresh_opt)
    fresh_opt.load_state_dict(got["optimizer"])

    expected, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert loaded["param_groups"] == expected["param_groups"]
    assert set(loaded["state"]) == set(expected["state"])
    for i, state in expected["state"].items():
        assert set(loaded["state"][i]) == set(state), i
        for key, value in state.items():
            _assert_bitwise_equal(loaded["state"][i][key], value, (i, key))


def test_a_state_dict_saved_as_ckpt_pt_loads_as_nanogpts_sample_py_loads_it(trained, tmp_path):
    model, _, extra, ckpt_dir = trained
    fresh_model, fresh_opt = _make(seed=1)
    got = tgc.load_state_dicts(ckpt_dir, model=fresh_model, optimizer=fresh_opt)
    torch.save({"model": got["model"], "optimizer": got["optimizer"],
                "model_args": got["extra"]["model_args"], "iter_num": got["step"]},
               tmp_path / "ckpt.pt")

    checkpoint = torch.load(tmp_path / "ckpt.pt", map_location="cpu")
    sampler = _TinyLM()
    sampler.load_state_dict(checkpoint["model"])
    idx = torch.tensor([[1, 2, 3]])
    assert torch.equal(sampler(idx), model(idx))
    assert checkpoint["iter_num"] == 4


def test_an_exported_file_reads_without_torch_and_names_its_blobs(trained, tmp_path):
    _, _, _, ckpt_dir = trained
    out = tmp_path / "export" / "model.safetensors"
    out.parent.mkdir()
    assert tgc.export(ckpt_dir, out) == out
    metadata, tensors = tgc.read_safetensors(out)
    assert metadata["trainguard_step"] == "4" and metadata["trainguard_rank"] == "0"
    assert tensors["model.wte.weight"][:2] == ("F32", [11, 6])
    assert "model.head.weight" not in tensors  # registered once, under its first name
    assert tensors["optimizer.state.0.step"][:2] == ("F32", [])
    for blob in ("optimizer.param_groups", "optimizer.state_values", "rng", "extra"):
        assert tensors[tgc.BLOB_PREFIX + blob][0] == "U8"
    # The file is what load_state_dicts also takes.
    assert tgc.load_state_dicts(str(out), optimizer=_make()[1])["step"] == 4


def test_several_param_groups_need_the_optimizer_to_number_their_parameters(trained):
    _, _, _, ckpt_dir = trained
    with pytest.raises(trainguard.Error, match="2 parameter groups; pass optimizer="):
        tgc.load_state_dicts(ckpt_dir)


def test_a_missing_step_or_a_corrupt_shard_fails_naming_it(trained, tmp_path):
    _, _, _, ckpt_dir = trained
    out = tmp_path / "model.safetensors"
    with pytest.raises(trainguard.Error, match="no committed shard of step 999"):
        tgc.export(ckpt_dir, out, step=999)
    newest = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))[-1]
    shard = os.path.join(ckpt_dir, newest, "rank-00000.shard")
    with open(shard, "r+b") as f:
        f.seek(4096 + 3)
        byte = f.read(1)
        f.seek(4096 + 3)
        f.write(bytes([byte[0] ^ 0x80]))
    with pytest.raises(trainguard.Error, match=f"shard {re.escape(shard)} .*checksum mismatch"):
        tgc.export(ckpt_dir, out)
    assert not out.exists()
    assert os.listdir(tmp_path) and not any(n.startswith("model.safetensors")
                                            for n in os.listdir(tmp_path))
