#!/usr/bin/env bash
# Bundles the `gpu`-labelled tests and the GPU benchmarks of a build, with the shared libraries they
# load (Abseil, Protobuf, liburing, ... from this Debian machine), for a GPU machine that has a
# driver but not these packages (a cloud image with CUDA and PyTorch, say):
#
#   ./scripts/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]     # defaults: build/default .gpu-bundle
#   # copy BUNDLE_DIR to the GPU machine, then there:
#   BUNDLE_DIR/run.sh [OUT_DIR]                          # every gpu test, then the GPU benchmarks
#
# The driver's libraries (libcuda, libnvidia-ml) and NCCL are the GPU machine's own. glibc is
# bundled too, and used only when the machine's is older than this one's.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/default}"
bundle="${2:-.gpu-bundle}"
[ -d "$build/tests/gpu" ] || {
  echo "gpu_bundle: $build/tests/gpu not found: build with CUDA first (./scripts/test.sh)" >&2
  exit 2
}
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/glibc"
tests=()
for test in "$build"/tests/gpu/*_test; do
  cp "$test" "$bundle/bin/"
  tests+=("$(basename "$test")")
done
cp "$build/bench/bench_detection" "$build/bench/bench_checkpoint" "$bundle/bin/"
ldd "$bundle"/bin/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libcuda.so*|libnvidia-*|libnccl.so*) ;;  # the GPU machine's own
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*)
      cp -L "$lib" "$bundle/glibc/" ;;
    *) cp -L "$lib" "$bundle/lib/" ;;
  esac
done
cp -L /lib64/ld-linux-x86-64.so.2 "$bundle/glibc/"
strip --strip-debug "$bundle"/bin/* "$bundle"/lib/* 2>/dev/null || true

cat >"$bundle/run.sh" <<EOF
#!/usr/bin/env bash
# Runs the bundled gpu tests, then the GPU benchmarks; logs and JSON go to \${1:-/tmp/gpu-out}.
bundle="\$(cd "\$(dirname "\$0")" && pwd)"
out="\${1:-/tmp/gpu-out}"
mkdir -p "\$out"
exec > >(tee "\$out/gpu.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nccl="\$(ldconfig -p | awk '/libnccl.so.2 /{print \$NF; exit}')"
export LD_LIBRARY_PATH="\$bundle/lib\${nccl:+:\$(dirname "\$nccl")}"
run() {  # the machine's glibc if it runs the binary, else the bundled one
  if "\$bundle/bin/\$1" --help >/dev/null 2>&1; then
    "\$bundle/bin/\$@"
  else
    "\$bundle/glibc/ld-linux-x86-64.so.2" --library-path "\$LD_LIBRARY_PATH:\$bundle/glibc" "\$bundle/bin/\$@"
  fi
}
failed=0
for test in ${tests[*]}; do
  echo "=== \$test"
  timeout 300 bash -c "\$(declare -f run); bundle='\$bundle'; run \$test" || failed=\$((failed + 1))
done
echo "=== benchmarks"
run bench_detection --benchmark_filter=Device --benchmark_repetitions=5 \\
  --benchmark_report_aggregates_only=true --benchmark_out="\$out/bench_detection.json"
run bench_checkpoint --benchmark_filter='Device|ChunkChecksum' \\
  --benchmark_out="\$out/bench_checkpoint.json"
echo "gpu test binaries failed: \$failed"
exit \$((failed > 0))
EOF
chmod +x "$bundle/run.sh"
echo "gpu_bundle: $bundle ($(du -sh "$bundle" | cut -f1)): run $bundle/run.sh on the GPU machine"
