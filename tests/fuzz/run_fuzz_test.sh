#!/usr/bin/env bash
# CTest driver of the store frame fuzzer (see CMakeLists.txt beside it): builds tests/fuzz/project
# with clang++ and runs the fuzzer from the checked-in seed corpus for a bounded time. A crash, a
# leak, a sanitizer report or a timeout fails the test; the reproducer is left in WORK_DIR.
# Exits 77 (CTest: skipped) when clang++ or its libFuzzer runtime is missing.
#
#   run_fuzz_test.sh SOURCE_DIR WORK_DIR GENERATOR SECONDS [CCACHE_DIR]
#
# CCACHE_DIR (the main build's TRAINGUARD_CCACHE_DIR, may be empty): compile through ccache in that
# cache, paths hashed relative to SOURCE_DIR as the main build does, so a second clone's fuzz build
# reuses the first's objects instead of compiling them again with clang.
set -euo pipefail
src="$1"
work="$2"
generator="$3"
seconds="$4"
ccache_dir="${5:-}"

cxx="$(command -v clang++ || true)"
if [ -z "$cxx" ]; then
  echo "store_frame_fuzzer: SKIPPED: clang++ not found (install clang to fuzz the store frame parser)"
  exit 77
fi
mkdir -p "$work"
probe_src="$work/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe_src"
if ! "$cxx" -fsanitize=fuzzer "$probe_src" -o "$work/probe" 2>"$work/probe.log"; then
  echo "store_frame_fuzzer: SKIPPED: $cxx cannot link -fsanitize=fuzzer (libclang-rt-dev missing?):"
  cat "$work/probe.log"
  exit 77
fi

echo "store_frame_fuzzer: building with $cxx"
launcher=()
if [ -n "$ccache_dir" ] && command -v ccache >/dev/null 2>&1; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_DIR=$ccache_dir;CCACHE_BASEDIR=$src;CCACHE_NOHASHDIR=true;$(command -v ccache)")
fi
cmake -S "$src/tests/fuzz/project" -B "$work/build" -G "$generator" "${launcher[@]}" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTRAINGUARD_SOURCE_DIR="$src" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

# New inputs go to a scratch corpus; the checked-in seeds are only read.
rm -rf "$work/corpus" && mkdir -p "$work/corpus"
cd "$work"
echo "store_frame_fuzzer: fuzzing for ${seconds}s from $(ls "$src/tests/fuzz/corpus" | wc -l) seeds"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" \
  "$work/build/store_frame_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 "$work/corpus" "$src/tests/fuzz/corpus"
