"""From a persisted trainguard checkpoint back to torch ``state_dict``s.

    import torch, trainguard.checkpoint
    ckpt = trainguard.checkpoint.load_state_dicts("/ckpt/dir", model=model)   # newest complete step
    model.load_state_dict(ckpt["model"])
    torch.save({"model": ckpt["model"], "optimizer": ckpt["optimizer"],
                "iter_num": ckpt["step"], **ckpt["extra"]}, "ckpt.pt")       # e.g. nanoGPT's

A checkpoint directory holds one shard per rank per step (docs/FORMATS.md). ``export()`` runs
``trainguard ckpt export``, which verifies every chunk of the chosen shard and writes it as one
safetensors file; ``read_safetensors()`` reads such a file without torch; ``load_state_dicts()``
(which imports torch) turns it into what ``trainguard.torch.register`` registered: the model's
``state_dict`` (the "model.<name>" buffers), the optimizer's (the "optimizer.state.<i>.<key>"
tensors with the pickled "optimizer.param_groups" and "optimizer.state_values"), ``extra`` and the
step. ``import trainguard.checkpoint`` does not import torch.

The ranks of a data-parallel job hold the same state: rank 0's shard (the default) is the model.
With tensor or pipeline parallelism each rank's shard holds its own part only.
"""

import json
import os
import pickle
import struct
import subprocess
import tempfile

from . import _cli
from .errors import Error

__all__ = ["BLOB_PREFIX", "export", "read_safetensors", "load_state_dicts"]

# Where `trainguard ckpt export` puts a blob: a U8 tensor "__blob__/<name>".
BLOB_PREFIX = "__blob__/"


def export(directory, out, step=None, rank=0):
    """Runs ``trainguard ckpt export DIRECTORY --out OUT [--step STEP] [--rank RANK]``: rank
    `rank`'s shard of `step` (None: the newest complete committed step), every chunk verified, as
    a safetensors file at `out` (written under a temporary name and renamed: never partial).
    Returns `out`. Raises trainguard.Error with the command's message (the missing step, the
    corrupt shard, the file it could not write)."""
    args = [_cli.binary_path(), "ckpt", "export", os.fspath(directory), "--out", os.fspath(out),
            "--rank", str(int(rank))]
    if step is not None:
        args += ["--step", str(int(step))]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        raise Error(f"trainguard ckpt export failed (exit status {done.returncode}): {message}")
    return out


def read_safetensors(path):
    """The tensors of a safetensors file, without torch: ``(metadata, tensors)`` where metadata is
    the header's "__metadata__" dict (strings) and tensors maps each name to ``(dtype, shape,
    data)``: the safetensors dtype name ("F32", "BF16", "U8", ...), a list of ints and the bytes,
    in the file's order."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise Error(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (header_bytes,) = struct.unpack("<Q", raw)
        header_raw = f.read(header_bytes)
        if len(header_raw) != header_bytes:
            raise Error(f"{path}: truncated header ({len(header_raw)} of {header_bytes} bytes)")
        data = f.read()
    try:
        header = json.loads(header_raw)
    except ValueError as e:
        raise Error(f"{path}: the header is not JSON: {e}") from None
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise Error(f"{path}: tensor {name!r} has data_offsets [{begin}, {end}] outside the "
                        f"{len(data)}-byte data section")
        tensors[name] = (info["dtype"], list(info["shape"]), data[begin:end])
    return metadata, tensors


_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                 "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                 "BOOL": "bool"}


def _tensor(torch, name, dtype, shape, data):
    if dtype not in _TORCH_DTYPES:
        raise Error(f"tensor {name!r}: dtype {dtype} has no torch equivalent here")
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    if not data:
        return torch.empty(shape, dtype=torch_dtype)
    # A copy (bytearray): the tensor owns writable memory and outlives the file's bytes.
    return torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)


def _optimizer_state_dict(prefix, tensors, blobs, optimizer):
    groups_blob = blobs.get(f"{prefix}optimizer.param_groups")
    state = {}
    head = f"{prefix}optimizer.state."
    for name, value in tensors.items():
        if name.startswith(head):
            index, _, key = name[len(head):].partition(".")
            state.setdefault(int(index), {})[key] = value
    if groups_blob is None:
        if state:
            raise Error("the checkpoint holds optimizer state tensors but no "
                        f"{prefix}optimizer.param_groups blob")
        return None
    values_blob = blobs.get(f"{prefix}optimizer.state_values")
    if values_blob is not None:
        for index, scalars in pickle.loads(values_blob).items():
            state.setdefault(int(index), {}).update(scalars)
    groups = pickle.loads(groups_blob)
    # The blob holds each group's hyperparameters, not its parameters: torch numbers parameters
    # consecutively through the groups, so the groups' sizes come from `optimizer` (built as for
    # training), or, with one group, from the highest index that has state.
    if optimizer is not None:
        sizes = [len(g["params"]) for g in optimizer.param_groups]
        if len(sizes) != len(groups):
            raise Error(f"the checkpoint's optimizer has {len(groups)} parameter groups, the "
                        f"optimizer given has {len(sizes)}")
    elif len(groups) == 1:
        sizes = [max(state) + 1 if state else 0]
    else:
        raise Error(f"the checkpoint's optimizer has {len(groups)} parameter groups; pass "
                    "optimizer= (built as for training) so that each group's parameters can be "
                    "numbered")
    param_groups, first = [], 0
    for group, size in zip(groups, sizes):
        param_groups.append(dict(group, params=list(range(first, first + size))))
        first += size
    return {"state": dict(sorted(state.items())), "param_groups": param_groups}


def _model_state_dict(prefix, tensors, model):
    head = f"{prefix}model."
    state = {name[len(head):]: value for name, value in tensors.items() if name.startswith(head)}
    if model is None:
        return state
    # named_parameters() lists a tied (shared) parameter once, state_dict() under each of its
    # names: fill in the others. Keys the model's state_dict lacks (non-persistent buffers) go.
    registered = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is not None:
            registered.setdefault((t.data_ptr(), tuple(t.shape), t.dtype), name)
    out = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if key in state:
            out[key] = state[key]
        elif t is not None:
            source = registered.get((t.data_ptr(), tuple(t.shape), t.dtype))
            if source is not None and source in state:
                out[key] = state[source]
    return out


def load_state_dicts(path, step=None, rank=0, prefix="", model=None, optimizer=None):
    """What a persisted checkpoint holds, as torch objects (imports torch). `path`: a checkpoint
    directory (exported with ``export(path, ..., step, rank)`` into a temporary file first) or a
    file ``trainguard ckpt export`` wrote (then `step` and `rank` are not used). `prefix`: the one
    given to ``trainguard.torch.register``. Returns a dict:

    - "model": the model's state_dict (names without "model."), CPU tensors; with `model` (built as
      for training), completed with the other names of tied parameters and limited to the keys of
      ``model.state_dict()``, so that ``model.load_state_dict`` takes it as it is;
    - "optimizer": the optimizer's state_dict as ``optimizer.state_dict()`` shapes it (None if no
      optimizer was registered); several parameter groups need `optimizer` (built as for
      training) to number their parameters;
    - "extra": the ``extra`` dict (None if none was registered);
    - "step": the step the checkpoint was taken at (training resumes there);
    - "blobs": every blob's bytes by name (the pickled "rng", ...);
    - "metadata": the file's "__metadata__" (step, rank, world size, generation, layout hash).

    Buffers registered as raw bytes (bool or int8 tensors, or views that were not contiguous)
    come back flat, as uint8 or in the dtype they were registered with."""
    import torch

    if os.path.isdir(path):
        with tempfile.TemporaryDirectory(prefix="trainguard-export-") as tmp:
            out = os.path.join(tmp, "checkpoint.safetensors")
            export(path, out, step=step, rank=rank)
            metadata, raw = read_safetensors(out)
    else:
        metadata, raw = read_safetensors(path)
    tensors, blobs = {}, {}
    for name, (dtype, shape, data) in raw.items():
        if name.startswith(BLOB_PREFIX):
            blobs[name[len(BLOB_PREFIX):]] = data
        else:
            tensors[name] = _tensor(torch, name, dtype, shape, data)
    extra_blob = blobs.get(f"{prefix}extra")
    return {
        "model": _model_state_dict(prefix, tensors, model),
        "optimizer": _optimizer_state_dict(prefix, tensors, blobs, optimizer),
        "extra": pickle.loads(extra_blob) if extra_blob is not None else None,
        "step": int(metadata["trainguard_step"]) if "trainguard_step" in metadata else None,
        "blobs": blobs,
        "metadata": metadata,
    }
