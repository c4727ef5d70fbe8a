# Shared fixtures of the Python bindings' tests (run by ctest's python_* entries through .venv's
# pytest, with PYTHONPATH at the build tree's package).
import os
import subprocess
import uuid

import pytest

import trainguard


def remove_job_shared_memory(job_id):
    """Removes every /dev/shm segment of `job_id` ("trainguard.<job id>.<suffix>"): a killed rank
    leaves its arena and ring behind on purpose, and the suite fails on any a test leaves
    (tests/shm_leak_check.sh)."""
    prefix = f"trainguard.{job_id}."
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                pass


@pytest.fixture
def job_id():
    """A job id of this test's own; its /dev/shm segments are removed after the test (after the
    runtimes of make_runtime are closed)."""
    job = "py-" + uuid.uuid4().hex[:12]
    yield job
    remove_job_shared_memory(job)


@pytest.fixture
def make_runtime(tmp_path, job_id):
    """make_runtime(**options): a Runtime of a one-rank job in tmp_path, closed after the test."""
    made = []

    def make(**options):
        options.setdefault("job_id", job_id)
        options.setdefault("run_dir", str(tmp_path / "run"))
        rt = trainguard.Runtime(**options)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


# The shared token of the TcpStore servers the tests start.
STORE_TOKEN = "test-token-" + uuid.uuid4().hex


@pytest.fixture
def server():
    """A TcpStore server on loopback, closed after the test."""
    s = trainguard.TcpStoreServer(STORE_TOKEN)
    yield s
    s.close()


@pytest.fixture
def store(server, job_id):
    """A client of `server` for `job_id`."""
    s = trainguard.open_store(f"tcp://{server.address}", job_id, STORE_TOKEN)
    yield s
    s.close()


def join_generation_0_as_coordinator(server, store, tmp_path, job_id, **options):
    """The test as the job's coordinator: publishes generation 0 with one member, host:rank0, and
    returns the Runtime of that rank (store and token file set; `options` added)."""
    token = tmp_path / "token"
    token.write_text(STORE_TOKEN)
    store.set("rdzv/gen/0/table", b"0\n1\nhost:rank0", 10)
    # What generation 0 changed (nothing: its table is the registrations) and its world size, read
    # by the joining rank instead of the table.
    store.set("rdzv/gen/0/changes", b"0\n1", 10)
    store.set("rdzv/current", b"0", 10)
    return trainguard.Runtime(job_id=job_id, run_dir=str(tmp_path / "run"), world_size=1, rank=0,
                              member_id="host:rank0", store=f"tcp://{server.address}",
                              store_token_file=str(token), **options)


def trainguard_cli():
    """The trainguard binary ctest gives (TG_CLI); the test is skipped without it."""
    cli = os.environ.get("TG_CLI")
    if not cli:
        pytest.skip("TG_CLI (the trainguard binary) is not set; ctest sets it")
    return cli


def run_job(tmp_path, name, launcher_args, command, timeout):
    """Runs `trainguard run LAUNCHER_ARGS -- COMMAND` under a fresh job id in tmp_path/run and removes
    the job's /dev/shm segments after; the CompletedProcess (stdout and stderr as text)."""
    job = f"{name}-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run([trainguard_cli(), "run", *launcher_args, "--job-id", job,
                               "--run-dir", str(tmp_path / "run"), "--", *command],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        for segment in os.listdir("/dev/shm"):
            if job in segment:
                os.unlink(os.path.join("/dev/shm", segment))
