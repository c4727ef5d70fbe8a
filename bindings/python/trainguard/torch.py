"""PyTorch integration: register a model and optimizer with a Runtime, and a torch.distributed
Store over the job's trainguard store. Importing this module imports torch (``import trainguard``
does not).

    import trainguard, trainguard.torch
    rt = trainguard.Runtime.from_env()
    trainguard.torch.register(rt, model=model, optimizer=opt, rng=True, extra={"epoch": 0})
    store = trainguard.torch.process_group_store(rt)          # the job's store, this generation
    torch.distributed.init_process_group("gloo", store=store, rank=rt.rank, world_size=rt.world_size)

Tensors are registered as DLPack views of their storage (``detach()``: no copy): parameters and
persistent buffers ("model.<name>", group "model"), every tensor of the optimizer state
("optimizer.state.<i>.<key>", group "optimizer", i the parameter's position in param_groups;
the step counters too). The rest goes into blobs (pickle), refreshed before every snapshot and
put back after every restore: the param_groups' hyperparameters ("optimizer.param_groups"), the
optimizer state's non-tensor values ("optimizer.state_values"), the RNG states ("rng": torch's CPU
and CUDA generators, Python's random, numpy's global generator when numpy is imported) and
``extra`` ("extra": a dict the trainer keeps updating; restored in place).

The checkpoint registry is frozen once the first snapshot or restore happens, so a tensor whose
storage is later replaced (``optimizer.load_state_dict``, ``model.load_state_dict(assign=True)``,
``torch.utils.swap_tensors``, ``set_``) cannot be registered again: every step and checkpoint
compares each registered tensor's data pointer, shape, strides, dtype and device with those it
was registered with, and raises trainguard.StaleStateError naming the tensor (the step fails and
nothing is snapshotted). Load checkpoints of your own before ``register``, or copy into the
registered tensors in place.

Adam-like optimizers create their state in the first ``optimizer.step()``. ``register`` refuses
an optimizer whose parameters have no state yet (a clear error), unless ``materialize=True``: it
then runs one ``optimizer.step()`` with learning rate 0 and zero gradients (parameters unchanged),
puts the learning rates and gradients back and zeroes the step counters.
"""

import datetime
import pickle
import random
import sys

import torch
import torch.distributed as dist

from .errors import Error

__all__ = ["register", "Store", "process_group_store"]


def _view(t):
    return t.detach()


def _tensor_signature(t):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))


def _optimizer_params(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def _materialize(optimizer):
    params = _optimizer_params(optimizer)
    saved_lr = [group["lr"] for group in optimizer.param_groups]
    saved_grads = [p.grad for p in params]
    try:
        for group in optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.zeros_like(group["lr"])
            else:
                group["lr"] = 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, saved_lr):
            group["lr"] = lr
        for p, g in zip(params, saved_grads):
            p.grad = g
    for state in optimizer.state.values():
        if "step" in state:
            if isinstance(state["step"], torch.Tensor):
                state["step"].zero_()
            else:
                state["step"] = 0


def _register_model(rt, model, prefix):
    names = []
    for name, p in model.named_parameters():
        names.append((f"{prefix}model.{name}", name, False))
    for name, b in model.named_buffers():
        if b is not None:
            names.append((f"{prefix}model.{name}", name, True))
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    registered = []
    for reg_name, name, is_buffer in names:
        t = buffers[name] if is_buffer else params[name]
        rt._c.register_buffer(reg_name, "model", _view(t))
        registered.append((reg_name, name, is_buffer, _tensor_signature(t)))

    def entries():
        params_now = dict(model.named_parameters())
        buffers_now = dict(model.named_buffers())
        return [(reg_name, (buffers_now if is_buffer else params_now).get(name), sig)
                for reg_name, name, is_buffer, sig in registered]

    rt._track(entries)
    return [r[0] for r in registered]


def _register_optimizer(rt, optimizer, prefix, materialize):
    params = _optimizer_params(optimizer)
    if params and not any(optimizer.state.get(p) for p in params):
        if not materialize:
            raise Error(
                f"trainguard.torch.register: {type(optimizer).__name__} has no state yet (torch "
                "creates it in the first optimizer.step()); register after one step, or pass "
                "materialize=True")
        _materialize(optimizer)
    registered = []
    for i, p in enumerate(params):
        for key, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                name = f"{prefix}optimizer.state.{i}.{key}"
                rt._c.register_buffer(name, "optimizer", _view(value))
                registered.append((name, i, key, _tensor_signature(value)))

    def entries():
        params_now = _optimizer_params(optimizer)
        out = []
        for name, i, key, sig in registered:
            current = None
            if i < len(params_now):
                current = optimizer.state.get(params_now[i], {}).get(key)
            out.append((name, current if isinstance(current, torch.Tensor) else None, sig))
        return out

    rt._track(entries)

    groups_blob = f"{prefix}optimizer.param_groups"
    values_blob = f"{prefix}optimizer.state_values"

    def save():
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        values = {}
        for i, p in enumerate(_optimizer_params(optimizer)):
            scalars = {k: v for k, v in optimizer.state.get(p, {}).items()
                       if not isinstance(v, torch.Tensor)}
            if scalars:
                values[i] = scalars
        return {groups_blob: pickle.dumps(groups), values_blob: pickle.dumps(values)}

    def load(get_blob):
        groups = pickle.loads(get_blob(groups_blob))
        for group, saved in zip(optimizer.param_groups, groups):
            for k, v in saved.items():
                if isinstance(group.get(k), torch.Tensor) and isinstance(v, torch.Tensor):
                    group[k].copy_(v)
                else:
                    group[k] = v
        params_now = _optimizer_params(optimizer)
        for i, scalars in pickle.loads(get_blob(values_blob)).items():
            optimizer.state[params_now[i]].update(scalars)

    rt._add_blob_source(save, load)
    return [r[0] for r in registered]


def _rng_state():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


def register(rt, model=None, optimizer=None, rng=True, extra=None, prefix="",
             materialize=False):
    """Registers a model's parameters and buffers, an optimizer's state, the RNG states and
    `extra` (a picklable dict) with `rt` (see the module's docstring). Call it once, before
    rt.start(). Returns the names of the registered buffers."""
    names = []
    if model is not None:
        names += _register_model(rt, model, prefix)
    if optimizer is not None:
        names += _register_optimizer(rt, optimizer, prefix, materialize)
    if rng:
        rng_blob = f"{prefix}rng"
        rt._add_blob_source(lambda: {rng_blob: pickle.dumps(_rng_state())},
                            lambda get_blob: _set_rng_state(pickle.loads(get_blob(rng_blob))))
    if extra is not None:
        if not isinstance(extra, dict):
            raise TypeError("trainguard.torch.register: extra must be a dict")
        extra_blob = f"{prefix}extra"

        def load_extra(get_blob):
            saved = pickle.loads(get_blob(extra_blob))
            extra.clear()
            extra.update(saved)

        rt._add_blob_source(lambda: {extra_blob: pickle.dumps(dict(extra))}, load_extra)
    return names


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class Store(dist.Store):
    """A torch.distributed.Store over a trainguard Store, under a key prefix, so that
    ``init_process_group(store=...)`` rendezvouses through trainguard's store (which outlives any
    rank) instead of a TCPStore hosted by rank 0. get() waits for the key, as torch expects."""

    def __init__(self, store, prefix="torch", timeout=datetime.timedelta(minutes=5)):
        super().__init__()
        self._store = store
        self._prefix = prefix.rstrip("/") + "/"
        self.set_timeout(timeout)

    def _key(self, key):
        return self._prefix + key

    def _t(self):
        return _seconds(self.timeout)

    @staticmethod
    def _bytes(value):
        if isinstance(value, str):
            return value.encode()
        return bytes(value)

    def set(self, key, value):
        self._store.set(self._key(key), self._bytes(value), self._t())

    def get(self, key):
        k = self._key(key)
        self._store.wait([k], self._t())
        return self._store.get(k, self._t())

    def add(self, key, value):
        return self._store.add(self._key(key), int(value), self._t())

    def compare_set(self, key, expected_value, desired_value):
        expected = self._bytes(expected_value)
        desired = self._bytes(desired_value)
        swapped, current = self._store.compare_set(self._key(key), expected or None, desired,
                                                   self._t())
        if current is None:  # absent, and `expected` was not empty: torch returns `expected`
            return expected
        return current

    def check(self, keys):
        values = self._store.multi_get([self._key(k) for k in keys], self._t())
        return all(v is not None for v in values)

    def wait(self, keys, timeout=None):
        t = self._t() if timeout is None else _seconds(timeout)
        self._store.wait([self._key(k) for k in keys], t)

    def delete_key(self, key):
        return self._store.delete(self._key(key), self._t())

    def num_keys(self):
        return len(self._store.list_keys(self._prefix, self._t()))

    def multi_get(self, keys):
        return [self.get(k) for k in keys]

    def multi_set(self, keys, values):
        for k, v in zip(keys, values):
            self.set(k, v)


def process_group_store(rt, prefix="torch", timeout=datetime.timedelta(minutes=5)):
    """A Store for torch process groups of rt's current generation ("<prefix>/gen<G>/..."): build
    the process group again after a re-rendezvous with a fresh one. None for a static job."""
    if rt.store is None:
        return None
    return Store(rt.store, f"{prefix}/gen{rt.generation}", timeout)
