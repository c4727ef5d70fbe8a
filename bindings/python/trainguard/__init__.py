"""trainguard: fault tolerance for training jobs, from Python.

    import trainguard
    rt = trainguard.Runtime.from_env()        # RANK, WORLD_SIZE, TRAINGUARD_* as the C++ SDK reads them
    step = rt.start()
    while step < steps:
        with rt.step(step) as s:
            loss = train_step(step)
            s.check_loss(float(loss))
        step = step + 1 if s.result.ok else rt.recover(s.result)   # raises JobMustExit

``import trainguard`` needs no torch; ``trainguard.torch`` (register a model and optimizer, a
``torch.distributed.Store`` over the job's store) imports torch when it is imported.
"""

from ._C import __version__, open_store, TcpStoreServer, Store
from .errors import (
    DeadlineExceededError,
    Error,
    InvalidArgumentError,
    JobMustExit,
    NotFoundError,
    StaleStateError,
)
from .runtime import Runtime, Step, RecoverableError, CommunicationError, EventKind

__all__ = [
    "__version__",
    "Runtime",
    "EventKind",
    "Step",
    "Store",
    "TcpStoreServer",
    "open_store",
    "RecoverableError",
    "CommunicationError",
    "Error",
    "NotFoundError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "JobMustExit",
    "StaleStateError",
]
