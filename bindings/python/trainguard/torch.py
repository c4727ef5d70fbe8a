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

After a re-rendezvous (``rt.recover()`` of a communication failure, or ``rt.start()`` of a
replacement) the ranks are in a new generation and rebuild their process group from trainguard's
store: ``init_process_group(rt)`` (destroys the old default group, builds one under
"torch/gen<G>") and ``wrap_ddp(rt, model)`` (DistributedDataParallel on it, with
``guarded_allreduce_hook``). Without a communicator factory (a Python trainer has none) the
Runtime's start() and recover() only restore the checkpoint and agree on the step: the process
group is the trainer's to rebuild, and no state is broadcast, so checkpoint (the shared-memory
arena) to give a replacement its state.

    step = rt.start()
    while step < steps:
        if trainguard.torch.init_process_group(rt, backend="gloo"):   # new generation: rebuild
            ddp = trainguard.torch.wrap_ddp(rt, model)
        with rt.step(step) as s:
            loss = loss_fn(ddp(x), y)
            s.check_loss(loss.item())            # before backward: the hook passes a spike on
            loss.backward()                      # the hook checks and records every bucket
            if not s.failed:                     # a fault on any rank: every rank skips it
                optimizer.step()
        step = step + 1 if s.result.ok else rt.recover(s.result)

Adam-like optimizers create their state in the first ``optimizer.step()``. ``register`` refuses
an optimizer whose parameters have no state yet (a clear error), unless ``materialize=True``: it
then runs one ``optimizer.step()`` with learning rate 0 and zero gradients (parameters unchanged),
puts the learning rates and gradients back and zeroes the step counters.
"""

import datetime
import math
import os
import pickle
import random
import socket
import sys
import threading
import time
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _C
from .errors import DeadlineExceededError, Error
from .runtime import CommunicationError

__all__ = ["register", "Store", "process_group_store", "init_process_group", "broadcast_state",
           "wrap_ddp", "guarded_allreduce_hook"]


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


def _register_model(rt, model, prefix, replicated):
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
        # Parameters only: a buffer (batch norm's running statistics) is updated by each rank's
        # own batch after DDP broadcast it, so replicas hold different values between steps.
        rt._c.register_buffer(reg_name, "model", _view(t), replicated and not is_buffer)
        registered.append((reg_name, name, is_buffer, _tensor_signature(t)))

    def entries():
        params_now = dict(model.named_parameters())
        buffers_now = dict(model.named_buffers())
        return [(reg_name, (buffers_now if is_buffer else params_now).get(name), sig)
                for reg_name, name, is_buffer, sig in registered]

    rt._track(entries)
    return [r[0] for r in registered]


def _register_optimizer(rt, optimizer, prefix, materialize, replicated):
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
                rt._c.register_buffer(name, "optimizer", _view(value), replicated)
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
             materialize=False, replicated=None):
    """Registers a model's parameters and buffers, an optimizer's state, the RNG states and
    `extra` (a picklable dict) with `rt` (see the module's docstring). Call it once, before
    rt.start(); a registration after the first checkpoint or restore is refused (trainguard.Error).
    Returns the names of the registered buffers.

    `replicated`: whether every rank of the data-parallel group holds the same parameters and
    optimizer state after each step (DDP; not ZeRO, FSDP or any sharded optimizer). Their
    snapshots are then compared across the group and a rank that disagrees is named (silent data
    corruption, docs/GUIDE.md). None: True when `model` is a DistributedDataParallel, else False.
    The model's buffers are never marked (batch norm's running statistics differ between steps).

    The model's and optimizer's gradients are dropped (``zero_grad(set_to_none=True)``) when a
    step fails and after every start()/recover(), so a replayed or next step never adds onto a
    failed step's gradients, wherever the loop calls zero_grad."""
    if replicated is None:
        replicated = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    replicated = bool(replicated)
    if replicated and type(optimizer).__name__ == "ZeroRedundancyOptimizer":
        raise Error("trainguard.torch.register: a ZeroRedundancyOptimizer's state is sharded, not "
                    "replicated; pass replicated=False")
    names = []
    if model is not None:
        names += _register_model(rt, model, prefix, replicated)
        rt._gradient_clearers.append(lambda: model.zero_grad(set_to_none=True))
    if optimizer is not None:
        names += _register_optimizer(rt, optimizer, prefix, materialize, replicated)
        rt._gradient_clearers.append(lambda: optimizer.zero_grad(set_to_none=True))
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
    rank) instead of a TCPStore hosted by rank 0. get() waits for the key, as torch expects.

    ``superseded``: a callable, or None. When given, every wait is cut into slices of
    SUPERSEDED_POLL_S and gives up between them, raising trainguard.CommunicationError, once
    ``superseded()`` is true: a process group whose generation was superseded (a peer died while
    it was being built) is never completed, and waiting out the timeout for it would hold the
    survivors back (process_group_store passes the Runtime's superseded generation)."""

    SUPERSEDED_POLL_S = 0.25

    def __init__(self, store, prefix="torch", timeout=datetime.timedelta(minutes=5),
                 superseded=None):
        super().__init__()
        self._store = store
        self._prefix = prefix.rstrip("/") + "/"
        self._superseded = superseded
        self.set_timeout(timeout)

    def _wait(self, keys, seconds):
        if self._superseded is None:
            self._store.wait(keys, seconds)
            return
        deadline = time.monotonic() + seconds
        while True:
            if self._superseded():
                raise CommunicationError(
                    f"the process group's generation was superseded while its store wait for "
                    f"{keys} ran (a peer died or asked for a new generation)")
            left = deadline - time.monotonic()
            try:
                self._store.wait(keys, max(min(self.SUPERSEDED_POLL_S, left), 0.001))
                return
            except DeadlineExceededError:
                if time.monotonic() >= deadline:
                    raise

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
        self._wait([k], self._t())
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
        self._wait([self._key(k) for k in keys], t)

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
    the process group again after a re-rendezvous with a fresh one. Its waits give up (raising
    trainguard.CommunicationError) once that generation is superseded. None for a static job."""
    if rt.store is None:
        return None
    generation = rt.generation
    return Store(rt.store, f"{prefix}/gen{generation}", timeout,
                 superseded=lambda: (rt._c.superseded_generation >= generation
                                     or rt.generation > generation))


# Collective tracker ids of the process groups built here: one per generation, clear of the ids
# the Runtime gives the communicators its factory builds (generation + 1).
_COMM_ID_BASE = 1 << 40


def _socket_inodes():
    """{inode: fd} of this process's sockets now (Linux: /proc/self/fd)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            found[int(link[8:-1])] = int(name)
    return found


class _GroupRecord:
    """What init_process_group built for a Runtime: the generation, the tracker's comm id, and the
    sockets the group's backend opened while it was built (its gloo pairs and listener)."""

    def __init__(self, generation, comm_id, group, sockets):
        self.generation = generation
        self.comm_id = comm_id
        self.group = group
        self.sockets = sockets  # inodes
        self.aborted = False
        self.lock = threading.Lock()

    def abort(self, why):
        """Aborts the group once, so that a collective blocked in it fails at once, here and on
        the peers blocked on this rank: shuts down the sockets the group opened (gloo sees its
        connections close, as when a peer dies: every pending and later operation fails with a
        communication error), then ProcessGroup.abort(). torch's abort() alone does not wake a
        gloo collective already blocked (torch 2.15), hence the sockets."""
        with self.lock:
            if self.aborted:
                return False
            self.aborted = True
        print(f"trainguard: aborting torch process group of generation {self.generation}: {why}",
              file=sys.stderr, flush=True)
        now = _socket_inodes()
        for inode in self.sockets:
            fd = now.get(inode)
            if fd is None:
                continue  # already closed
            try:
                with socket.socket(fileno=os.dup(fd)) as s:
                    if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        s.shutdown(socket.SHUT_RDWR)  # a listener is left alone
            except OSError:
                pass  # already shut down
        self.group.abort()
        return True


class _AbortThread:
    """Owns the thread that aborts a Runtime's torch process group when its collectives can no
    longer complete, so that the training thread's blocked collective fails at once instead of
    waiting out the group's timeout:

    - the generation was superseded (``rt._c.superseded_generation``: a newer generation was
      published because a peer died or asked for a re-rendezvous; the Runtime's superseded handler
      ends this thread's wait at once): the peers have left for the new generation, and a rank
      waiting on one of them in a gloo ring would wait forever;
    - a hang: the watchdog aborts the communicators registered when it declared the hang (not
      the next generation's, built meanwhile); the one init_process_group registered only queues
      its id (the watchdog's thread must not wait for the GIL), and this
      thread, waiting with the GIL released, carries it out.

    Started by the first init_process_group on a Runtime; stopped and joined when the Runtime
    closes, before its C++ side goes (the thread calls into it)."""

    POLL_S = 0.2

    def __init__(self, rt):
        self._rt = rt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainguard-torch-abort",
                                        daemon=True)
        self._thread.start()
        rt._on_close.append(self.stop)

    def _run(self):
        c = self._rt._c
        while not self._stop.is_set():
            comm_id = c.wait_communicator_abort(self.POLL_S)
            record = _group_record(self._rt)
            superseded = c.superseded_generation
            if record is None:
                continue
            if comm_id is not None and record.comm_id == comm_id:
                self._rt._abort_one("torch process group", record.abort,
                                    f"the watchdog aborted communicator {comm_id} after a hang")
            if superseded >= 0 and record.generation == superseded:
                self._rt._abort_one("torch process group", record.abort,
                                    f"generation {superseded} was superseded (a peer left or "
                                    "asked for a re-rendezvous)")

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10.0)
        if self._thread.is_alive():
            print(f"trainguard: rank {self._rt.rank}: the torch abort thread did not stop within "
                  "10 s", file=sys.stderr, flush=True)


def _group_record(rt):
    return getattr(rt, "_torch_group", None)


def _reset_group_count():
    """torch names an unnamed group after a per-process counter of the groups it created, and the
    name is part of the group's store keys, so every rank must build a generation's group at the
    same count. destroy_process_group() of the default group resets the counter to 0 "to allow
    consistent value to be generated when we re-create process groups after some trainers recover
    from failure" (torch's words), but an init_process_group that failed half-way (a peer died,
    the generation was superseded) advanced it with no group left to destroy: the survivors would
    then build the next generation's group at 1, a fresh replacement at 0, and wait for each
    other's keys for ever. With no default group there is no other group either, so the counter
    goes back to 0, as destroy_process_group() would have set it."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def init_process_group(rt, backend="gloo", timeout=datetime.timedelta(seconds=60),
                       prefix="torch", force=False):
    """Makes torch's default process group the one of rt's current generation: when none was
    built for it (the first call, or a recover()/start() that entered a new generation, or
    `force`), destroys the default group if any and calls
    ``torch.distributed.init_process_group(backend, store=<trainguard's store under
    "<prefix>/gen<G>">, rank=rt.rank, world_size=rt.world_size, timeout=timeout)``. A static job
    (no store) uses torch's env:// rendezvous (MASTER_ADDR, MASTER_PORT) instead. The group is
    registered with the Runtime's collective tracker, so the DDP hook's allreduces are recorded
    in the flight recorder. Collective: every rank of the generation calls it. Returns True when
    it built a group, False when the current one is already this generation's."""
    record = _group_record(rt)
    generation = rt.generation
    if record is not None and record.generation == generation and not force \
            and dist.is_initialized():
        return False
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        _reset_group_count()
    rt._communicator_aborts.pop("torch process group", None)
    if record is not None:
        try:
            rt._c.unregister_communicator(record.comm_id)
        except Error:
            pass  # already gone with a closed Runtime
        rt._torch_group = None
    store = process_group_store(rt, prefix, timeout)
    sockets_before = _socket_inodes()
    if store is None:
        dist.init_process_group(backend, rank=rt.rank, world_size=rt.world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=rt.rank, world_size=rt.world_size,
                                timeout=timeout)
    comm_id = _COMM_ID_BASE + max(generation, 0)
    rt._c.register_communicator(comm_id, f"torch/{backend}/gen{generation}")
    record = _GroupRecord(generation, comm_id, dist.group.WORLD,
                          set(_socket_inodes()) - set(sockets_before))
    rt._torch_group = record
    rt._communicator_aborts["torch process group"] = record.abort
    if getattr(rt, "_torch_abort_thread", None) is None:
        rt._torch_abort_thread = _AbortThread(rt)
    broadcast_state(rt, record.group)
    return True


def _registered_tensors(rt):
    """[(name, tensor)] of every buffer registered with rt, as they are now."""
    found = []
    for entries in rt._tracked:
        for name, current, _ in entries():
            if current is None:
                raise Error(f"rank {rt.rank}: registered buffer '{name}' no longer exists")
            if not isinstance(current, torch.Tensor):
                current = torch.from_numpy(current)  # numpy: the same memory
            found.append((name, current.detach()))
    return found


def broadcast_state(rt, group=None):
    """Gives every rank the registered state of the survivor the recovery plan names, when the
    ranks entered a generation without restoring a checkpoint (a rank replaced before the first
    commit): every registered tensor (parameters, buffers, optimizer state) and every blob
    (optimizer hyperparameters, RNG states, ``extra``), as the C++ Runtime does with its
    communicator factory. Without it the replacement would train from its fresh state and the
    replicas (the optimizer state first) would silently diverge, so until it is done a step that
    would succeed fails with an error saying so. init_process_group calls it; call it yourself,
    collectively on `group` (default: the default group), when you build your own process group.
    A replacement also takes the source's check_loss window (the survivors keep their own).
    Returns True when it broadcast, False when there was nothing to do."""
    pending = rt._state_sync
    if pending is None:
        return False
    generation, source = pending
    if generation != rt.generation:
        raise Error(f"rank {rt.rank}: the state broadcast pending is of generation {generation}, "
                    f"the Runtime is in generation {rt.generation}")
    for name, tensor in _registered_tensors(rt):
        try:
            dist.broadcast(tensor, src=source, group=group)
        except Exception as e:  # noqa: BLE001 - a peer lost: the step fails, recover() follows
            raise CommunicationError(f"rank {rt.rank}: broadcasting registered buffer '{name}' "
                                     f"from rank {source}: {type(e).__name__}: {e}") from e
    blobs = [None, None]  # the blobs, and the source's check_loss window
    if rt.rank == source:
        rt._save_blobs()
        blobs[0] = {name: rt._c.get_blob(name) for save, _ in rt._blob_sources for name in save()}
        blobs[1] = rt._c.loss_window_state()
    try:
        dist.broadcast_object_list(blobs, src=source, group=group)
    except Exception as e:  # noqa: BLE001
        raise CommunicationError(f"rank {rt.rank}: broadcasting the state's blobs from rank "
                                 f"{source}: {type(e).__name__}: {e}") from e
    if rt.rank != source:
        for name, value in blobs[0].items():
            rt._c.set_blob(name, value)
        rt._load_blobs()
        # The window is each rank's own: a survivor keeps its, a replacement (whose rank's window
        # died with it) takes the source's, as the C++ Runtime's broadcast does.
        if rt.rank in (rt.recovery_plan or {}).get("new_ranks", ()):
            rt._c.load_loss_window(blobs[1])
    rt._state_sync = None
    what = "gave its state to every rank" if rt.rank == source else f"took rank {source}'s state"
    print(f"trainguard: rank {rt.rank}: {what} (generation {generation}: a replacement joined "
          "before any checkpoint was committed)", file=sys.stderr, flush=True)
    return True


class _HookState:
    """The DDP hook's state: the Runtime, the tracker's comm id, the parameter names."""

    def __init__(self, rt, comm_id, group, names):
        self.rt = rt
        self.comm_id = comm_id
        self.group = group
        self.names = names  # id(parameter) -> name, for the evidence


def _all_finite(t):
    """Whether every element of `t` is finite: a sum first (one vectorised pass, no allocation: a
    NaN or Inf makes it non-finite), in float32 for half types; only a non-finite sum, which finite
    values can also give by overflowing, is confirmed element by element."""
    total = t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()
    if math.isfinite(float(total)):
        return True
    return bool(torch.isfinite(t).all())


def _bucket_names(state, bucket, limit=3):
    names = [state.names.get(id(p), "?") for p in bucket.parameters()]
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} parameters)" if len(names) > limit else "")


def guarded_allreduce_hook(state, bucket):
    """A DDP communication hook (register it with wrap_ddp): averages the bucket with an
    allreduce, as DDP's default hook does, and

    - before the reduction, checks the bucket's flat gradient for NaN/Inf: a hit fails the current
      step (a step failure: skip), naming the rank, the bucket index and its parameters, so the
      rank where the NaN was born is the one named;
    - after it, checks the reduced bucket: a NaN/Inf any rank contributed reaches every rank
      through the sum, so every rank fails the step too and skips the same update;
    - when this rank's step has already failed before the bucket is reduced (a check_loss that
      judged a spike or a non-finite loss, a check_finite, a report_fault, all before
      ``backward()``), puts a NaN into its contribution, so that the other ranks see a non-finite
      bucket after the allreduce and fail the step too: a fault on any rank, every rank skips,
      with no collective of its own (a step that did not fail pays one attribute read);
    - records the allreduce in the collective tracker (the flight recorder's collective_begin/end,
      the watchdog's hang bound), as op "ddp_allreduce";
    - turns a failed allreduce (a peer died) into a communication failure of the step (the
      gradients are left as they are: the step fails, so the update must be skipped), instead of
      an exception out of backward() that the guard could not classify.

    Faults go to ``rt.current_step`` (outside a step the hook only reduces)."""
    rt = state.rt
    step = rt.current_step
    buf = bucket.buffer()
    index = bucket.index()
    local_finite = _all_finite(buf)
    if not local_finite and step is not None:
        step.report_fault_from_any_thread(
            f"rank {rt.rank}: non-finite values (NaN/Inf) in DDP gradient bucket {index} "
            f"({buf.numel()} elements: {_bucket_names(state, bucket)}) before the allreduce")
    buf.div_(dist.get_world_size(state.group))
    # A fault recorded on the training thread before backward() is this rank's alone; the NaN
    # makes it every rank's (the gradients of a failed step are dropped, so none is lost).
    poisoned = local_finite and step is not None and step._failed_before_reduction()
    if poisoned:
        buf = buf.clone()  # the NaN goes out, not into DDP's bucket, kept from step to step
        buf.view(-1)[0] = float("nan")
    handle = rt._c.collective_begin("ddp_allreduce", state.comm_id,
                                    buf.numel() * buf.element_size())
    try:
        work = dist.all_reduce(buf, group=state.group, async_op=True)
    except Exception as e:  # noqa: BLE001 - a peer lost before the allreduce could start
        rt._c.collective_end(handle)
        if step is None:
            raise
        step.report_fault_from_any_thread(
            f"rank {rt.rank}: the allreduce of DDP gradient bucket {index} failed: "
            f"{type(e).__name__}: {e}", _C.FAULT_COMMUNICATION_FAILURE)
        done = torch.futures.Future()
        done.set_result(buf)
        return done
    future = work.get_future()

    def finished(fut):
        rt._c.collective_end(handle)
        try:
            reduced = fut.value()[0]
        except Exception as e:  # noqa: BLE001 - any backend error: the peers are gone
            if step is not None:
                step.report_fault_from_any_thread(
                    f"rank {rt.rank}: the allreduce of DDP gradient bucket {index} failed: "
                    f"{type(e).__name__}: {e}", _C.FAULT_COMMUNICATION_FAILURE)
            return buf
        if local_finite and not poisoned and step is not None and not _all_finite(reduced):
            step.report_fault_from_any_thread(
                f"rank {rt.rank}: DDP gradient bucket {index} is not finite after the allreduce "
                "(another rank's gradients held NaN/Inf, or its step had already failed: a loss "
                "spike, a non-finite loss); the update is skipped on every rank")
        return reduced

    return future.then(finished)


class _FailedStepReduction:
    """What a rank whose step body raised before backward() does in place of that step's DDP
    reduction (Step.__exit__ calls it): the other ranks are in backward(), each bucket's allreduce
    waiting for this rank's contribution, and would wait until a timeout. It runs the allreduce of
    every bucket, in the reducer's order and sizes, with a NaN contribution, so the others see
    non-finite buckets after the reduction and fail the step as after a loss spike on this rank:
    every rank skips it, and no collective is left half-done. For the DDP model of one generation
    (wrap_ddp's last): every guarded step runs one backward() through it on every rank."""

    def __init__(self, rt, ddp, generation, comm_id, group):
        self._rt = rt
        self._ddp = weakref.ref(ddp)
        self.generation = generation
        self._comm_id = comm_id
        self._group = group

    def __call__(self, step):
        """Returns None, or the error that ended the reduction (a peer lost)."""
        ddp = self._ddp()
        record = _group_record(self._rt)
        if (ddp is None or record is None or record.generation != self.generation
                or record.aborted or self._rt.generation != self.generation):
            return None  # that generation's group is gone: its collectives fail by themselves
        buckets = sorted(ddp.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
        for bucket in buckets:
            buf = bucket.buffer()
            poison = torch.full_like(buf, float("nan"))
            handle = self._rt._c.collective_begin("ddp_allreduce", self._comm_id,
                                                  buf.numel() * buf.element_size())
            try:
                dist.all_reduce(poison, group=self._group)
            except Exception as e:  # noqa: BLE001 - a peer lost: the step is a communication failure
                return (f"rank {self._rt.rank} step {step}: the NaN allreduce of DDP gradient "
                        f"bucket {bucket.index()} (standing in for the failed step's reduction) "
                        f"failed: {type(e).__name__}: {e}")
            finally:
                self._rt._c.collective_end(handle)
        return None


class _FixedLayoutDDP(DistributedDataParallel):
    """DistributedDataParallel whose reducer holds the parameters in reverse declaration order, so
    the layout wrap_ddp fixes at construction puts the last-declared parameters (their gradients
    come first in backward) in the first bucket, as torch's own construction-time layout does:
    the reducer starts the buckets' allreduces in index order, and this order lets them start
    while backward goes on."""

    def _build_params_for_reducer(self):
        parameters, expect_sparse_gradient = super()._build_params_for_reducer()
        return parameters[::-1], expect_sparse_gradient[::-1]


def wrap_ddp(rt, model, fixed_bucket_layout=True, **ddp_kwargs):
    """DistributedDataParallel(model, process_group=<the group init_process_group built for rt's
    generation>, **ddp_kwargs) with guarded_allreduce_hook registered. Build it again after every
    init_process_group that returned True (the old one holds the destroyed group). DDP's
    construction broadcasts rank 0's parameters in place, so registered storage does not move.

    fixed_bucket_layout (default): a replay after a recovery must round as the first run did.
    DDP lays its buckets out again after the first iteration of each instance (by the order the
    gradients became ready), and the layout decides which chunk of the ring allreduce each
    gradient falls in, so the order of its sum: a DDP built anew after recover() would reduce its
    first step in the other layout and drift from an uninterrupted run in the last bits. So the
    layout is fixed before the first iteration: torch's one-time re-layout is run at once, over
    the parameters in reverse declaration order (the order torch assumes gradients become ready;
    the reducer's own `_push_all_rebuilt_params` and `_rebuild_buckets`, with which DDP's join
    hook lays out a rank that has run out of inputs), and torch never lays them out again. Every
    instance, on every rank, in every generation, gets the same layout from the same model.
    find_unused_parameters=True, when given, keeps torch's construction-time layout by itself
    (torch prints a one-time warning when no parameter went unused). False: torch's default.

    A step whose body raises on one rank before backward() (a bad batch, an OutOfMemoryError in
    forward) would leave the other ranks waiting in this DDP's allreduces: that rank runs them with
    a NaN contribution instead, so every rank fails the step the same way (a skip for a
    RecoverableError, as after a loss spike). This needs every guarded step to run one backward()
    through the last DDP wrap_ddp built, on every rank."""
    record = _group_record(rt)
    if record is None or record.generation != rt.generation:
        raise Error(f"trainguard.torch.wrap_ddp: rank {rt.rank}: no process group for generation "
                    f"{rt.generation}; call trainguard.torch.init_process_group(rt) first")
    relayout = fixed_bucket_layout and not ddp_kwargs.get("find_unused_parameters", False)
    ddp_class = _FixedLayoutDDP if relayout else DistributedDataParallel
    ddp = ddp_class(model, process_group=record.group, **ddp_kwargs)
    if relayout:
        # A collective (rank 0's layout is broadcast), like the construction before it.
        ddp.reducer._push_all_rebuilt_params()
        if ddp.reducer._rebuild_buckets():
            ddp._has_rebuilt_buckets = True
    names = {id(p): n for n, p in model.named_parameters()}
    ddp.register_comm_hook(_HookState(rt, record.comm_id, record.group, names),
                           guarded_allreduce_hook)
    rt._failed_step_reduction = _FailedStepReduction(rt, ddp, rt.generation, record.comm_id,
                                                     record.group)
    return ddp
