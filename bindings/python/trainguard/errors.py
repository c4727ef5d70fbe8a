"""The exceptions trainguard raises.

Every error of the C++ SDK (an absl::Status) arrives as ``trainguard.Error`` or one of its
subclasses below; ``code`` holds the status code's name ("NOT_FOUND", "DEADLINE_EXCEEDED", ...).
"""


class Error(RuntimeError):
    """An SDK call failed; the message names what failed and where (rank, key, file, step)."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code


class NotFoundError(Error, KeyError):
    """A key, a checkpoint or a registered name does not exist."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


class DeadlineExceededError(Error, TimeoutError):
    """A wait ran past its deadline."""


class InvalidArgumentError(Error, ValueError):
    """An argument or option was rejected; the message names it."""


class JobMustExit(Error):
    """Runtime.recover() decided that this process cannot go on.

    The trainer should leave its loop and exit non-zero: the launcher replaces the process, or,
    when ``job_stopped`` is true, the job was stopped on purpose (a fault that recurs, the state
    lost) and no replacement comes. ``result`` is the StepResult that recover() was given.
    """

    def __init__(self, message, code="UNKNOWN", result=None, job_stopped=False):
        super().__init__(message, code)
        self.result = result
        self.job_stopped = job_stopped


class StaleStateError(Error):
    """A registered tensor no longer holds the memory it was registered with.

    ``optimizer.load_state_dict``, ``module.load_state_dict(assign=True)``, ``swap_tensors``,
    ``tensor.set_()`` or a re-created optimizer state replace a tensor's storage; the checkpoint
    registry is frozen after the first snapshot, so the new storage cannot be registered and the
    old one must not be snapshotted. Load state before registering, or load it in place
    (``tensor.copy_``).
    """
