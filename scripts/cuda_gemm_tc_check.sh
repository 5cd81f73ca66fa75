#!/usr/bin/env bash
# On a GPU host, in about four minutes: the tensor-core INT4 prefill GEMM alone, the slice of
# scripts/cuda_device_check.sh (every kernel, both architectures, Nsight Compute) that a short
# device lease can afford. In order, so that a cut run still returns the most useful part:
#   1. build the CUDA test and benchmark binaries for sm_90 only, with all cores;
#   2. the GEMM's device tests (a usable device required; the layout and host-emulation tests
#      need no GPU and run in CI);
#   3. the prefill benchmark against cuBLAS (the launcher's tile at M = 128, 512 and 2048 on the
#      three shapes), its table printed as soon as it is done;
#   4. compute-sanitizer memcheck and racecheck on the GEMM's tail and plane cases.
# Everything goes into the directory given as $1 (and OUT_DIR.tgz); the benchmark table and the
# summary are printed last.
#   scripts/cuda_gemm_tc_check.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR may also be a bundle of scripts/cuda_device_bundle.sh (it has run.sh): then nothing
# is built. QMOE_SKIP_BUILD=1 uses an existing BUILD_DIR as it is. QMOE_TC_SANITIZERS=0 skips
# step 4. QMOE_TC_BENCH_TILES=all adds every forced tile to the benchmark (5x the rows).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: scripts/cuda_gemm_tc_check.sh OUT_DIR [BUILD_DIR]}
build=${2:-"$root/build-cuda-sm90"}
mkdir -p "$out"
out=$(cd "$out" && pwd)
failed=()
step() {  # step NAME TIMEOUT_S COMMAND...: run, log to $out/NAME.log, record a failure
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  [[ $rc -eq 0 ]] || failed+=("$name")
  return $rc
}
table() {
  grep -E '^BM_Int4GemmTcVsCublas' "$out/bench.log" 2>/dev/null | sed -E 's/ +/ /g' || true
}

: >"$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
  --format=csv >"$out/gpu.txt" 2>&1 || true

if [[ -x $build/run.sh ]]; then
  tests=("$build/run.sh" tests)
  bench=("$build/run.sh" bench)
else
  if [[ ${QMOE_SKIP_BUILD:-0} != 1 ]]; then
    step configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DQMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DQMOE_BUILD_TESTS=ON \
      -DQMOE_BUILD_BENCHMARKS=ON -DQMOE_BUILD_TOOLS=OFF || {
      echo "configure failed; see $out/configure.log" >&2
      exit 1
    }
    step build 240 cmake --build "$build" -j"$(nproc)" --target qmoe_cuda_tests qmoe_cuda_bench || {
      tail -30 "$out/build.log" >&2
      exit 1
    }
  fi
  tests=("$build/tests/qmoe_cuda_tests")
  bench=("$build/benchmarks/qmoe_cuda_bench")
fi

step tests 90 env QMOE_REQUIRE_CUDA=1 "${tests[@]}" \
  --gtest_filter='CudaInt4GemmTc.*:CudaInt4GemmTcTiles.*' --gtest_output="xml:$out/gemm_tests.xml"
tail -3 "$out/tests.log"

step bench 90 "${bench[@]}" --benchmark_filter='BM_Int4GemmTcVsCublas' \
  --benchmark_out="$out/gemm_bench.json" --benchmark_out_format=json
table

if [[ ${QMOE_TC_SANITIZERS:-1} == 0 ]]; then
  echo "sanitizers: skipped (QMOE_TC_SANITIZERS=0)" | tee -a "$out/summary.txt"
elif command -v compute-sanitizer >/dev/null; then
  planes='CudaInt4GemmTc.ScaleAndZeroPointPlanes:CudaInt4GemmTc.KTails'
  step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 "${tests[@]}" \
    --gtest_filter="$planes:CudaInt4GemmTc.RowTails:CudaInt4GemmTc.ColumnSubRanges"
  step racecheck 90 compute-sanitizer --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "${tests[@]}" --gtest_filter='CudaInt4GemmTc.RowTails:CudaInt4GemmTc.KTails'
else
  echo "compute-sanitizer: not found" | tee -a "$out/summary.txt"
  failed+=("sanitizer-missing")
fi

echo "total $SECONDS s; failed: ${failed[*]:-none}" | tee -a "$out/summary.txt"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
table
cat "$out/summary.txt"
[[ ${#failed[@]} -eq 0 ]]
