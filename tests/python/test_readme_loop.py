# Issue 40, 13: README's PyTorch loop, taken from README.md as written, runs under `trainguard run`
# with 2 ranks and a standby, and ends cleanly on every rank; docs/GUIDE.md section 11 shows the
# same text.
import re
import sys
from pathlib import Path

from conftest import run_job

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- the loop test_readme_loop.py runs -->"


def readme_loop(doc="README.md"):
    text = (REPO / doc).read_text()
    assert text.count(MARKER) == 1, f"{doc}: the marker must appear once"
    after = text[text.index(MARKER) + len(MARKER):]
    m = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    assert m, f"{doc}: no ```python block after the marker"
    return m.group(1)


def test_guides_section_11_shows_the_loop_this_test_runs():
    guide = (REPO / "docs" / "GUIDE.md").read_text()
    section = guide[guide.index("## 11. Python"):guide.index("## 12. ")]
    assert MARKER in section, "docs/GUIDE.md: the loop is not in section 11"
    assert readme_loop("docs/GUIDE.md") == readme_loop(), \
        "docs/GUIDE.md section 11's loop differs from README.md's, which this test runs"


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
