"""Runtime and Step: the C++ Runtime and guard (include/trainguard/runtime.h, guard.h) in Python idiom.

Thread safety: as in C++: rank, world_size, generation and the store may be used from any thread;
steps, phases, register(), start() and recover() belong to the training thread. Every call that
can wait (start, recover, restore_checkpoint, wait_for_checkpoints, store waits, a step's entry,
which fences the previous snapshot) releases the GIL.
"""

import atexit
import contextlib
import enum
import json
import os
import sys
import weakref

from . import _C

# trainguard's event kinds (include/trainguard/events.h): the member STEP_DONE is "step_done", the
# `what` its events carry. Built from the extension's table, so it never disagrees with it.
EventKind = enum.Enum("EventKind", [(name.upper(), name) for name in _C.EVENT_KINDS], type=str,
                      module=__name__)
EventKind.__doc__ = ("trainguard's event kinds; a member's value is its name in event files "
                     "(Runtime.emit_event(kind=...)).")
from .errors import Error, JobMustExit, StaleStateError


class RecoverableError(Exception):
    """Raise from a step body for a failure that leaves the process sound: the step is skipped
    (C++ trainguard::RecoverableError)."""


class CommunicationError(Exception):
    """Raise from a step body when a collective failed or a peer was lost: the ranks meet again in
    the next generation (C++ trainguard::CommunicationError)."""


# torch's exceptions, matched by name so that this module does not import torch.
_TORCH_COMMUNICATION_ERRORS = {"DistBackendError", "DistNetworkError", "DistStoreError"}
_TORCH_STEP_ERRORS = {"OutOfMemoryError"}


def _fault_kind_of(exc):
    """The FaultKind of an exception a step body raised, as the C++ guard classifies its own."""
    if isinstance(exc, RecoverableError):
        return _C.FAULT_STEP_FAILURE
    if isinstance(exc, CommunicationError):
        return _C.FAULT_COMMUNICATION_FAILURE
    for cls in type(exc).__mro__:
        if not cls.__module__.startswith("torch"):
            continue
        if cls.__name__ in _TORCH_COMMUNICATION_ERRORS:
            return _C.FAULT_COMMUNICATION_FAILURE
        if cls.__name__ in _TORCH_STEP_ERRORS:
            return _C.FAULT_STEP_FAILURE
    # gloo's transport errors (a peer's connection reset or closed, a read timing out) reach
    # Python as a plain RuntimeError naming gloo's source file.
    if type(exc) is RuntimeError and "gloo/transport/" in str(exc):
        return _C.FAULT_COMMUNICATION_FAILURE
    # Anything else: its effect on the process's state is unknown, so (as in C++) it is fatal.
    return _C.FAULT_UNCLASSIFIED


def _textproto_value(key, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"trainguard.Runtime: option {key}: expected bool, int or str, "
                    f"got {type(value).__name__}")


def _env_value(key, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"trainguard.Runtime.from_env: option {key}: expected bool, int or str, "
                    f"got {type(value).__name__}")


def _signature(obj):
    """What must not change about a registered buffer: its address and layout (None: unknown)."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):  # a torch.Tensor
        return (obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype),
                str(obj.device))
    interface = getattr(obj, "__array_interface__", None)  # numpy
    if interface is not None:
        return (interface["data"][0], tuple(interface["shape"]), interface.get("strides"),
                interface["typestr"])
    return None


def _dlpack_view(obj):
    """A tensor torch lets DLPack export: requires_grad tensors are detached (same storage)."""
    if getattr(obj, "requires_grad", False):
        return obj.detach()
    return obj


def _cuda_stream_of(obj):
    if getattr(obj, "is_cuda", False):
        import torch  # only reached with a torch tensor in hand
        return torch.cuda.current_stream(obj.device).cuda_stream
    return 0


class Step:
    """One guarded step: ``with rt.step(n) as s:``.

    An ``Exception`` raised in the body is recorded as the step's fault and swallowed (as
    sdk::guard does): RecoverableError and torch's OutOfMemoryError are step failures (skip),
    CommunicationError and torch.distributed's DistBackendError/DistNetworkError/DistStoreError
    communication failures (re-rendezvous), anything else unclassified (fatal: recover() raises
    JobMustExit). KeyboardInterrupt, SystemExit and other BaseExceptions end the step and pass
    through. After the block, ``s.result`` is the StepResult (ok, fault, action, message,
    evidence, duration).
    """

    def __init__(self, runtime, number):
        self._runtime = runtime
        self.number = number
        self._scope = None
        self._failed = False
        self._communication_failed = False
        self._pending = []  # (kind, message) reported from other threads (the DDP hook's futures)
        self._gradients_reduced = False  # a DDP hook reduced a bucket in this step
        self.result = None

    def __enter__(self):
        self._scope = _C.StepScope(self._runtime._c, self.number)
        if not self._scope.active:
            self.result = self._scope.finish()
            raise Error(f"step {self.number} was rejected: {self.result.message}")
        if self._scope.superseded_at_entry:
            # The C++ guard skips the body; a `with` block cannot: the step has already failed
            # (a communication failure), so `s.failed` is True from the start.
            self._failed = True
            self._communication_failed = True
        self._runtime._current_step = self
        return self

    def __exit__(self, exc_type, exc, tb):
        self._runtime._current_step = None
        self._drain()
        scope, self._scope = self._scope, None
        swallow = isinstance(exc, Exception)
        if swallow:
            kind = _fault_kind_of(exc)
            if self._communication_failed and kind == _C.FAULT_UNCLASSIFIED:
                # A collective of this step already failed (the DDP hook saw it): torch raises the
                # backend's error as a plain RuntimeError, a consequence of that failure.
                kind = _C.FAULT_COMMUNICATION_FAILURE
            scope.report_fault(kind, f"{type(exc).__qualname__}: {exc}")
            reduce_failed = self._runtime._failed_step_reduction
            if (reduce_failed is not None and not self._gradients_reduced
                    and not self._communication_failed
                    and kind != _C.FAULT_COMMUNICATION_FAILURE):
                # Raised before backward(): the other ranks wait in this step's DDP allreduces for
                # this rank (trainguard.torch.wrap_ddp), which takes part with a NaN, so they fail
                # the step too instead of waiting out a timeout.
                lost = reduce_failed(self.number)
                if lost is not None:
                    scope.report_fault(_C.FAULT_COMMUNICATION_FAILURE, lost)
        stale = None
        if exc is None or swallow:
            stale = self._runtime._prepare_snapshot(scope, self.number,
                                                    failed=swallow or self._failed)
        self.result = scope.finish()
        if not self.result.ok:
            # Whatever the loop does after a failed step (a `zero_grad` at its end skipped by the
            # exception), the replay or the next step must not add onto this step's gradients.
            self._runtime._clear_gradients()
        if stale is not None:
            raise stale
        return swallow

    def _live_scope(self):
        if self._scope is None:
            raise Error(f"step {self.number}: not inside its `with` block")
        return self._scope

    def report_fault(self, message, kind=_C.FAULT_STEP_FAILURE):
        """Marks the step failed without raising; the body goes on."""
        scope = self._live_scope()
        self._drain()
        self._failed = True
        if kind == _C.FAULT_COMMUNICATION_FAILURE:
            self._communication_failed = True
        scope.report_fault(kind, message)

    def report_fault_from_any_thread(self, message, kind=_C.FAULT_STEP_FAILURE):
        """report_fault() for another thread (a torch future's callback): the fault reaches the
        C++ step, which belongs to the training thread, when that thread next asks `failed` or
        leaves the `with` block."""
        self._pending.append((kind, message))  # list.append is atomic under the GIL

    def _drain(self):
        while self._pending and self._scope is not None:
            kind, message = self._pending.pop(0)
            self._failed = True
            if kind == _C.FAULT_COMMUNICATION_FAILURE:
                self._communication_failed = True
            self._scope.report_fault(kind, message)

    @property
    def failed(self):
        """True once a fault was reported in this step (report_fault, a failed check_loss or
        check_finite, the DDP hook): e.g. leave optimizer.step() out then."""
        self._drain()
        return self._failed

    def _failed_before_reduction(self):
        """For trainguard.torch's DDP hook, as it reduces a bucket (any thread): whether a fault
        was recorded on the training thread, which the hook then passes on to every rank."""
        self._gradients_reduced = True
        return self._failed

    def check_loss(self, loss):
        """Judges this step's loss (NaN, Inf, a spike: the step fails). Returns False then.

        In a DDP job call it before ``backward()``: the loss is each rank's own, and a failure
        found before the gradients are reduced reaches every rank through trainguard.torch's hook
        (every rank skips the step); one found after is this rank's alone, its replica would
        diverge, and a warning says so."""
        ok = self._live_scope().check_loss(float(loss))
        if not ok:
            self._failed = True
            if self._gradients_reduced:
                _warn_check_loss_after_reduction(self._runtime.rank, self.number)
        return ok

    def check_replicated(self, name, array):
        """Compares a CPU buffer every rank of this rank's data-parallel group must hold
        bit-identical now (the gradients right after DDP reduced them) across the group, out of
        band through the job's store (Step::CheckReplicated, docs/GUIDE.md "Silent data
        corruption"): a rank whose buffer differs from its group's majority is named, and with
        silent_corruption=repair or evict every rank goes back to the last committed snapshot at
        its next step. Every rank of the group calls it with the same `name`, once per step. The
        step itself is not failed. A CUDA tensor is refused: copy it to the CPU first."""
        self._live_scope().check_replicated(name, _dlpack_view(array))

    def check_finite(self, name, array):
        """Checks a float buffer (any DLPack tensor: numpy, torch; cpu, pinned, cuda) for
        NaN/Inf; a non-finite one fails the step, naming `name`, the rank and the step. Returns
        False when a host buffer is not finite (True for a CUDA one: its answer comes later)."""
        ok = self._live_scope().check_finite(name, _dlpack_view(array), _cuda_stream_of(array))
        if not ok:
            self._failed = True
        return ok


_warned_check_loss_after_reduction = False


def _warn_check_loss_after_reduction(rank, step):
    global _warned_check_loss_after_reduction
    if _warned_check_loss_after_reduction:
        return
    _warned_check_loss_after_reduction = True
    print(f"trainguard: rank {rank}: step {step}: check_loss failed the step after the DDP "
          "gradients were reduced, so only this rank skips it and the replicas diverge; call "
          "s.check_loss(loss) before loss.backward(), and the DDP hook fails the step on every "
          "rank", file=sys.stderr, flush=True)


class Runtime:
    """The per-process trainguard Runtime (include/trainguard/runtime.h).

    ``Runtime(**options)`` takes the Options fields as keywords (job_id="x", world_size=2,
    checkpoint_every_steps=10, ...); ``Runtime.from_env(**overrides)`` reads TRAINGUARD_* and
    torchrun's variables as the C++ Options::FromEnv does. Creating it joins the rendezvous when
    a store is configured. Close it (``close()`` or ``with``) to stop its threads.
    """

    def __init__(self, **options):
        text = " ".join(f"{k}: {_textproto_value(k, v)}" for k, v in options.items())
        self._setup(_C.Runtime.from_textproto(text))

    @classmethod
    def from_env(cls, **overrides):
        """The Runtime of this rank, from TRAINGUARD_* and torchrun's variables (``overrides`` as
        TRAINGUARD_<KEY>). In a warm standby under ``trainguard run --standby K`` this waits until
        the standby is given a rank: build what does not depend on the rank (imports, model,
        optimizer) before calling it, so that a replacement does not pay for it after the fault."""
        variables = dict(os.environ)
        for key, value in overrides.items():
            variables["TRAINGUARD_" + key.upper()] = _env_value(key, value)
        rt = cls.__new__(cls)
        rt._setup(_C.Runtime.from_environment(variables))
        rt._export_torchrun_variables()
        return rt

    def _export_torchrun_variables(self):
        """torchrun's variables for this process's rank, which a standby learns only here: scripts
        pick their device from LOCAL_RANK after from_env(), as under torchrun."""
        local_world = self._c.local_world_size
        os.environ.update({
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(local_world),
            "GROUP_RANK": str(self.rank // local_world), "ROLE_RANK": str(self.rank),
        })

    def _setup(self, c):
        self._c = c
        self._store = None
        self._tracked = []       # functions returning [(name, current tensor, signature)]
        self._blob_sources = []  # (save() -> {name: bytes}, load(get_blob))
        self._current_step = None  # the Step inside its `with` block, for the DDP hook
        # name -> callable that aborts a communicator of the current generation (trainguard.torch's
        # process group): called before a recovery that re-rendezvouses, so that a peer blocked in
        # one of its collectives on this rank fails at once instead of waiting out its timeout.
        self._communicator_aborts = {}
        self._on_close = []  # callables run before the C++ Runtime closes (stop helper threads)
        self._gradient_clearers = []  # callables that drop the registered model's gradients
        # trainguard.torch.wrap_ddp's stand-in for the DDP reduction of a step whose body raised
        # before backward(): callable(step) -> None, or the error of a lost peer.
        self._failed_step_reduction = None
        # (generation, source rank) while the registered state must still be broadcast from a
        # survivor (a replacement joined and no checkpoint was restored); trainguard.torch's
        # init_process_group does it (broadcast_state).
        self._state_sync = None
        _live_runtimes.add(self)

    @property
    def current_step(self):
        """The Step whose `with` block is running, or None (read by trainguard.torch's DDP hook)."""
        return self._current_step

    # --- identity
    @property
    def rank(self):
        return self._c.rank

    @property
    def world_size(self):
        return self._c.world_size

    @property
    def local_rank(self):
        """This rank's index on its host (torchrun's LOCAL_RANK); for a standby, known once it
        was given a rank."""
        return self._c.local_rank

    @property
    def recovery_plan(self):
        """The plan of the last re-rendezvous this process took part in (a dict: generation,
        resume_step, state_source_rank, new_ranks), or None."""
        return self._c.recovery_plan

    @property
    def generation(self):
        return self._c.generation

    @property
    def job_id(self):
        return self._c.job_id

    @property
    def run_dir(self):
        return self._c.run_dir

    @property
    def fatal(self):
        return self._c.fatal

    @property
    def last_restore_source(self):
        """"arena" or "disk" after a checkpoint was restored; "" before."""
        return self._c.last_restore_source

    @property
    def last_recovery(self):
        """What the last start() or recover() did (a dict: decision, restored_from, ...)."""
        return self._c.last_recovery

    def resume_step(self):
        return self._c.resume_step()

    @property
    def store(self):
        """The job's Store (a trainguard.Store), or None for a static job (no store)."""
        if self._store is None:
            self._store = self._c.store()
        return self._store

    # --- events
    def emit_event(self, message, step=-1, kind=None, **attributes):
        """Appends an event to this rank's event file (``trainguard events RUN_DIR`` prints it),
        with the rank, generation and time filled in. ``kind``: one of trainguard's event kinds
        (a trainguard.EventKind or its name), written as trainguard writes that kind, e.g.
        ``rt.emit_event("step done", step=s, kind=trainguard.EventKind.STEP_DONE,
        pid=os.getpid())``, the progress record ``trainguard report`` measures ETTR from; None: a
        custom event of the caller's own. Attribute values are made strings. Raises
        trainguard.InvalidArgumentError for an unknown kind or a ``what`` beside a kind, and
        trainguard.Error when the event cannot be written (a full disk)."""
        if kind is not None:
            kind = kind.value if isinstance(kind, EventKind) else str(kind)
        self._c.emit_event(str(message), int(step),
                           {str(k): str(v) for k, v in attributes.items()}, kind)

    # --- steps
    def step(self, number):
        return Step(self, number)

    @contextlib.contextmanager
    def phase(self, name):
        """A watchdog phase nested in the current step (e.g. "generate", "forward_backward")."""
        self._c.begin_phase(name)
        try:
            yield
        finally:
            self._c.end_phase()

    def tick(self, amount=1):
        """Progress inside a long phase (tokens, samples): a ticking phase is not hung."""
        self._c.tick(amount)

    def start(self):
        """Restores the newest committed checkpoint (when checkpointing) and returns the first
        step to run; collective. Raises JobMustExit when this process cannot start."""
        self._check_state("start()")
        try:
            step = self._c.start()
        except Error as e:
            raise self._must_exit(e, None) from e
        self._after_recovery()
        self._say_recovery(None, step)
        return step

    def recover(self, result):
        """Carries out the recovery for a failed step's result and returns the step to run next;
        raises JobMustExit when this process must exit (the job stopped, a fatal fault, this
        process replaced)."""
        self._check_state(f"recover(step {result.step})")
        if result.action == "re_rendezvous":
            self._abort_communicators(f"rank {self.rank} step {result.step}: {result.message}")
        try:
            step = self._c.recover(result)
        except Error as e:
            raise self._must_exit(e, result) from e
        self._after_recovery()
        self._say_recovery(result, step)
        return step

    def _say_recovery(self, result, step):
        """One line on stderr per recovery (and per start that restored or joined a generation):
        what failed, what was done, where training resumes."""
        report = self._c.last_recovery or {}
        source = report.get("restored_from")
        how = [f"restored from {source}"] if source else []
        if report.get("joined_generation"):
            how.append(f"generation {report.get('generation')}")
        if result is None:
            if not how:
                return  # a fresh start: nothing to say
            line = f"resuming at step {step} ({', '.join(how)})"
        else:
            line = (f"step {result.step} failed ({result.fault}): {report.get('decision')}, "
                    f"resuming at step {step}" + (f" ({', '.join(how)})" if how else ""))
        print(f"trainguard: rank {self.rank}: {line}", file=sys.stderr, flush=True)

    def _abort_communicators(self, why):
        """Aborts every communicator of the current generation registered by an integration
        (the torch process group), as the C++ Runtime aborts its own before a re-rendezvous."""
        for name, abort in list(self._communicator_aborts.items()):
            self._abort_one(name, abort, why)

    def _abort_one(self, name, abort, why):
        """Calls one communicator's abort. Also used by trainguard.torch's abort thread (a hang,
        a superseded generation). An abort that fails is reported and the recovery goes on: the
        collective's own timeout remains."""
        try:
            abort(why)
        except Exception as e:  # noqa: BLE001 - an abort that fails must not stop recovery
            print(f"trainguard: rank {self.rank}: aborting {name} failed: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _must_exit(self, error, result):
        report = self._c.last_recovery or {}
        return JobMustExit(str(error), error.code, result, bool(report.get("job_stopped")))

    # --- checkpoints
    def restore_checkpoint(self):
        """Restores the newest committed checkpoint and returns its step (NotFoundError: none)."""
        self._check_state("restore_checkpoint()")
        step = self._c.restore_checkpoint()
        self._load_blobs()
        return step

    def checkpoint(self, resume_step):
        """Starts a checkpoint of the registered state now, tagged `resume_step`."""
        self._check_state(f"checkpoint({resume_step})")
        self._save_blobs()
        self._c.checkpoint(resume_step)

    def wait_for_checkpoints(self, timeout=600.0):
        self._c.wait_for_checkpoints(timeout)

    @property
    def checkpointing(self):
        return self._c.checkpointing

    # --- state
    def register(self, name, array, group="model"):
        """Registers a buffer for checkpoints: any DLPack tensor (torch, numpy) in cpu or pinned
        memory (cuda where the SDK was built with CUDA), viewed in place, never copied. Its
        storage must stay the same from now on: every step and checkpoint checks it and raises
        StaleStateError naming `name` when it moved. Register everything before start()."""
        self._c.register_buffer(name, group, _dlpack_view(array))
        signature = _signature(array)
        if signature is not None:
            self._tracked.append(lambda: [(name, array, signature)])

    def set_blob(self, name, value):
        """A small byte string saved with the state (read at each snapshot)."""
        self._c.set_blob(name, bytes(value))

    def get_blob(self, name):
        return self._c.get_blob(name)

    def buffer_names(self):
        return self._c.buffer_names()

    def _track(self, entries):
        """entries() -> [(name, current tensor or None, signature at registration)]."""
        self._tracked.append(entries)

    def _add_blob_source(self, save, load):
        """save() -> {name: bytes}, read before every snapshot; load(get_blob) after a restore."""
        self._blob_sources.append((save, load))
        for name, value in save().items():
            self._c.set_blob(name, value)

    def _stale(self):
        """The StaleStateError for the first registered tensor whose memory moved, or None."""
        for entries in self._tracked:
            for name, current, signature in entries():
                if current is None:
                    return StaleStateError(
                        f"rank {self.rank}: registered buffer '{name}' no longer exists in its "
                        "model/optimizer (re-created state cannot be re-registered: the registry "
                        "is frozen)")
                now = _signature(current)
                if now != signature:
                    return StaleStateError(
                        f"rank {self.rank}: registered buffer '{name}' now lives elsewhere "
                        f"(data_ptr/shape/stride/dtype/device {signature} -> {now}); its storage "
                        "was replaced (load_state_dict, assign=True, swap_tensors, set_?) and the "
                        "frozen registry would snapshot the old memory. Load state before "
                        "registering, or copy into the registered tensors in place")
        return None

    def _check_state(self, where):
        stale = self._stale()
        if stale is not None:
            raise StaleStateError(f"{where}: {stale}")

    def _save_blobs(self):
        for save, _ in self._blob_sources:
            for name, value in save().items():
                self._c.set_blob(name, value)

    def _load_blobs(self):
        for _, load in self._blob_sources:
            load(self._c.get_blob)

    def _prepare_snapshot(self, scope, step, failed):
        """At the end of a step: refuses a step that succeeded on state a survivor was to
        broadcast and did not (a failed one goes to recover(), which enters the next generation);
        before a step that starts a snapshot, refuses stale memory (the step fails and nothing is
        snapshotted) and refreshes the blobs. Other steps pay for neither. Returns the error to
        raise, or None."""
        if self._state_sync is not None and not failed:
            generation, source = self._state_sync
            error = Error(
                f"rank {self.rank}: generation {generation} was entered without a committed "
                f"checkpoint, so every rank must take rank {source}'s registered state before "
                "training on (a replacement has none); call trainguard.torch.init_process_group"
                "(rt) (which broadcasts it) or trainguard.torch.broadcast_state(rt, group) after "
                "building your own process group")
            scope.report_fault(_C.FAULT_UNCLASSIFIED, str(error))
            return error
        if not self._c.checkpoint_due_after(step):
            return None
        stale = self._stale()
        if stale is not None:
            scope.report_fault(_C.FAULT_UNCLASSIFIED, str(stale))
            return stale
        if self._blob_sources:
            self._save_blobs()
        return None

    def _clear_gradients(self):
        for clear in self._gradient_clearers:
            clear()

    def _after_recovery(self):
        report = self._c.last_recovery or {}
        if report.get("restored_from") or report.get("state_source_rank", -1) >= 0:
            self._load_blobs()
        self._clear_gradients()
        plan = self._c.recovery_plan
        entered = report.get("decision") in ("start", "re_rendezvous")
        if (entered and plan is not None and plan["generation"] == self.generation
                and plan["state_source_rank"] >= 0 and not report.get("restored_from")
                and report.get("state_source_rank", -1) < 0):
            # Without a communicator factory the C++ Runtime broadcasts nothing (torch's process
            # group is the trainer's): the integration must, before the state is trained on.
            self._state_sync = (self.generation, plan["state_source_rank"])
        else:
            self._state_sync = None

    # --- lifetime
    def close(self):
        """Waits for the checkpoint in flight, stops the Runtime's threads, releases the buffers.
        Also called at interpreter exit and when the Runtime is garbage-collected, so a script
        that never calls it still ends cleanly; calling it again does nothing."""
        _live_runtimes.discard(self)
        hooks, self._on_close = self._on_close, []
        for hook in hooks:  # before the C++ Runtime goes: their threads call into it
            hook()
        if self._store is not None:
            self._store.close()
            self._store = None
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        c = getattr(self, "_c", None)
        if c is not None and not c.closed:
            self.close()


# Runtimes not closed yet: closed at interpreter exit, before the interpreter tears down the
# modules their threads call into (a Runtime left open ended every rank with SIGABRT).
_live_runtimes = weakref.WeakSet()


@atexit.register
def _close_live_runtimes():
    for rt in list(_live_runtimes):
        try:
            rt.close()
        except Exception as e:  # noqa: BLE001 - exiting: report, close the others
            print(f"trainguard: closing the Runtime at exit failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
