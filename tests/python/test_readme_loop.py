# Issue 40, 13: README's PyTorch loop, taken from README.md as written, runs under `trainguard run`
# with 2 ranks and a standby, and ends cleanly on every rank.
import re
import sys
from pathlib import Path

from conftest import run_job

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- the loop test_readme_loop.py runs -->"


def readme_loop():
    text = (REPO / "README.md").read_text()
    after = text[text.index(MARKER) + len(MARKER):]
    m = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    assert m, "README.md: no ```python block after the marker"
    return m.group(1)


def test_readmes_pytorch_loop_runs_as_written_under_trainguard_run(tmp_path):
    script = tmp_path / "readme_loop.py"
    script.write_text(readme_loop())
    done = run_job(tmp_path, "readme", ["--nproc", "2", "--standby", "1"],
                   [sys.executable, str(script)], 240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for rank in (0, 1):
        assert f"rank {rank}: trained to step 200" in out, out
    assert "Traceback" not in out and "terminate called" not in out, out
