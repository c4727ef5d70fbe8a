# Shared fixtures of the Python bindings' tests (run by ctest's python_* entries through .venv's
# pytest, with PYTHONPATH at the build tree's package).
import os
import uuid

import pytest

import trainguard


@pytest.fixture
def job_id():
    return "py-" + uuid.uuid4().hex[:12]


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
    for name in os.listdir("/dev/shm"):
        if job_id in name:
            os.unlink(os.path.join("/dev/shm", name))
