#!/usr/bin/env bash
# Build the CUDA test and benchmark binaries here and gather what a GPU host without this
# machine's packages needs to run them: the two binaries (CUDA runtime linked statically), the
# shared libraries they take from Debian packages (cpuinfo, pthreadpool, Google Benchmark), and
# run.sh. cuBLAS is not copied (hundreds of MB): run.sh finds the host's libcublas.so.13.
#   scripts/cuda_device_bundle.sh [bundle-dir]     (default: .dev/cuda-bundle, git-ignored)
# Then, on the GPU host, from the repository root:
#   bash .dev/cuda-bundle/run.sh tests [gtest args...]
#   bash .dev/cuda-bundle/run.sh bench [benchmark args...]
#   bash .dev/cuda-bundle/run.sh offload-latency [--m M] [--calls N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=${1:-"$root/.dev/cuda-bundle"}
build_dir="$root/build"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON >/dev/null
cmake --build "$build_dir" -j"${QMOE_BUILD_JOBS:-2}" --target qmoe_cuda_tests qmoe_cuda_bench \
  qmoe_offload_latency
rm -rf "$bundle"
mkdir -p "$bundle/lib"
cp "$build_dir/tests/qmoe_cuda_tests" "$build_dir/benchmarks/qmoe_cuda_bench" \
  "$build_dir/benchmarks/qmoe_offload_latency" "$bundle/"
for binary in "$bundle/qmoe_cuda_tests" "$bundle/qmoe_cuda_bench"; do
  ldd "$binary" | awk '/=> \// {print $3}' | grep -E 'libcpuinfo|libpthreadpool|libbenchmark' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
done
cat >"$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# run.sh tests|bench|offload-latency [args...]: runs a bundled binary with the bundled
# libraries and the host's cuBLAS (CUDA toolkit, else the nvidia-cublas wheel of python3).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
libs="$here/lib"
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    "$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' \
       2>/dev/null || true)"; do
  if [[ -n $dir && -e $dir/libcublas.so.13 ]]; then libs="$libs:$dir"; break; fi
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
what=${1:?tests, bench or offload-latency}
shift
case $what in
  tests) QMOE_REQUIRE_CUDA=1 exec "$here/qmoe_cuda_tests" "$@" ;;
  bench) exec "$here/qmoe_cuda_bench" "$@" ;;
  offload-latency) exec "$here/qmoe_offload_latency" "$@" ;;
  *) echo "run.sh: tests, bench or offload-latency, not '$what'" >&2; exit 2 ;;
esac
EOF
chmod +x "$bundle/run.sh"
du -sh "$bundle"
