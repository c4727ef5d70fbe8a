#!/usr/bin/env bash
# Issue 14, test 8: builds the wheel from the source tree (what `pip install .` builds; its CMake
# build folder BUILD_DIR is kept, so a rebuild is incremental), installs it into a fresh virtual
# environment that has no torch, and checks that `import trainguard`, a guarded step and the
# `trainguard` console command work there, and that trainguard.torch says torch is missing.
#   usage: wheel_install_test.sh SOURCE_DIR WORK_DIR PYTHON BUILD_DIR [CMAKE_ARG...]
#   PYTHON has scikit-build-core and nanobind; CMAKE_ARGs go to the wheel's CMake configure
#   (tests/python/CMakeLists.txt passes the build's compilers and ccache folder).
set -euo pipefail
src="$1" work="$2" python="$3"
export SKBUILD_BUILD_DIR="$4"
shift 4
export CMAKE_ARGS="$*"
rm -rf "$work"
mkdir -p "$work/dist"

# --no-build-isolation: the pinned build tools already in PYTHON's environment (scripts/setup.sh).
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src"
wheel=("$work"/dist/trainguard-*.whl)

# Without pip of its own (ensurepip takes longer than the rest of the install): PYTHON's pip
# installs into it (--python), as the venv's own pip would.
/usr/bin/python3 -m venv --without-pip "$work/venv"
"$python" -m pip --python "$work/venv/bin/python" install -q --no-index --no-deps "${wheel[0]}"

cd "$work"  # not the source tree: the installed package must be the one imported
"$work/venv/bin/python" - <<'PY'
import importlib.util
import tempfile

assert importlib.util.find_spec("torch") is None, "the fresh venv must not have torch"
import trainguard

with tempfile.TemporaryDirectory() as d:
    with trainguard.Runtime(job_id="wheel-test", run_dir=d) as rt:
        with rt.step(0) as s:
            raise trainguard.RecoverableError("bad batch")
        assert rt.recover(s.result) == 1
try:
    import trainguard.torch  # noqa: F401
except ModuleNotFoundError as e:
    assert e.name == "torch", e
else:
    raise AssertionError("trainguard.torch imported without torch")
print("import trainguard", trainguard.__version__, "without torch: ok")
PY
"$work/venv/bin/trainguard" version
echo "wheel install: 1 passed, 0 failed"
