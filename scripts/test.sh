#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test.
#
#   ./scripts/test.sh               default preset (RelWithDebInfo): the command CI runs
#   ./scripts/test.sh --sanitize    the same suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   ./scripts/test.sh --tsan        the same suite under ThreadSanitizer
#   ./scripts/test.sh --wheel       only the tests of the self-contained wheels (label wheel:
#                                   scripts/build_wheel.sh builds the CPU one, and the CUDA one
#                                   where nvcc is; a Debian image without the build's libraries
#                                   installs each); the other runs leave them out
#   extra arguments after -- go to ctest, e.g.  ./scripts/test.sh -- -R Topology
#
# Build output goes to $TG_BUILD_DIR (default: build/) in a folder per preset.
# Tests labelled `gpu` run only when nvidia-smi sees a GPU; those labelled `wheel` only with
# --wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

preset=default
ctest_args=()
wheel=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize|--asan) preset=asan-ubsan ;;
    --tsan) preset=tsan ;;
    --wheel) wheel=1 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "usage: $0 [--sanitize|--tsan|--wheel] [-- ctest args]" >&2; exit 2 ;;
  esac
  shift
done

./scripts/setup.sh

build_root="${TG_BUILD_DIR:-build}"
build_dir="$build_root/$preset"
jobs="$(nproc)"

# The Python bindings and their tests (label python) are built in the default preset, with the
# virtual environment scripts/setup.sh made; the sanitizer presets leave them out.
python_args=(-DTRAINGUARD_PYTHON=OFF)
if [ "$preset" = default ] && [ -x .venv/bin/python ] && [ "${TG_SKIP_PYTHON:-0}" != 1 ]; then
  python_args=(-DTRAINGUARD_PYTHON=ON "-DPython_EXECUTABLE=$PWD/.venv/bin/python")
fi

# Compiles through ccache (scripts/setup.sh installs it), in ccache's own cache ($CCACHE_DIR, else
# ~/.cache/ccache): the wheel test's `pip wheel` (label python) reuses this build's objects instead
# of compiling the SDK again, and another clone of the project on this machine reuses them too
# (paths are hashed relative to the source tree).
ccache_args=()
if command -v ccache >/dev/null 2>&1; then
  cache="${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}"
  mkdir -p "$cache"
  ccache_args=("-DTRAINGUARD_CCACHE_DIR=$(cd "$cache" && pwd)")
fi

mkdir -p "$build_dir"
cmake --preset "$preset" -B "$build_dir" "${python_args[@]}" "${ccache_args[@]}" >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" -j "$jobs"

label_filter=(-LE '^(gpu|wheel)$')
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  label_filter=(-LE '^wheel$')
  echo "test: GPU found, running gpu-labelled tests too"
fi
if [ "$wheel" = 1 ]; then
  label_filter=(-L '^wheel$')
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}"
# Two tests more than there are cores: most end-to-end tests wait (for a liveness bound, a peer, a
# store) more than they compute (at one more, the cores were busy 71 % of ctest's time), and the
# timing-sensitive ones run alone (SERIAL) or one at a time (the simulated_hosts lock) whatever
# -j is. tests/README.md has the figures.
ctest --test-dir "$build_dir" --output-on-failure -j "$((jobs + 2))" --timeout 300 \
  "${label_filter[@]}" "${ctest_args[@]}"
