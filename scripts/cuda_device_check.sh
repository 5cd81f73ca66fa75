#!/usr/bin/env bash
# On a GPU host: build with CUDA (all cores), run the CUDA tests (a usable device required),
# compute-sanitizer memcheck and racecheck on a filtered subset of them, and the CUDA
# benchmarks with JSON output. Everything it writes goes into the directory given as $1.
#   scripts/cuda_device_check.sh OUT_DIR [BUILD_DIR]
# QMOE_SKIP_BUILD=1 uses an existing BUILD_DIR as it is (for a host without the build's Debian
# dependencies: GoogleTest, Google Benchmark, cpuinfo, pthreadpool, FP16; scripts/setup.sh).
# Meant to finish within 8 minutes on an H200 with 16 cores; each step has its own timeout and
# the script goes on after a failed step, exiting non-zero at the end if any failed. OUT_DIR.tgz
# holds all of it.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/lib/device_steps.sh"
build=${2:-"$root/build-cuda"}
steps_begin "${1:?usage: scripts/cuda_device_check.sh OUT_DIR [BUILD_DIR]}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv >"$out/gpu.txt" 2>&1 || true
jobs=$(nproc)

# 1. Build (the architectures of the project default, 80 and 90).
if [[ ${QMOE_SKIP_BUILD:-0} != 1 ]]; then
step configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DQMOE_BUILD_TESTS=ON -DQMOE_BUILD_BENCHMARKS=ON -DQMOE_BUILD_TOOLS=OFF || {
  echo "configure failed; see $out/configure.log" >&2
  exit 1
}
step build 300 cmake --build "$build" -j"$jobs" --target qmoe_cuda_tests qmoe_cuda_bench \
  qmoe_offload_latency || {
  echo "build failed; see $out/build.log" >&2
  exit 1
}
fi
tests="$build/tests/qmoe_cuda_tests"
bench="$build/benchmarks/qmoe_cuda_bench"

# 2. The CUDA tests, skips not allowed: a skipped test here means the device was not usable.
step tests 240 "$tests" --gtest_output="xml:$out/cuda_tests.xml"
if grep -q "SKIPPED" "$out/tests.log"; then
  echo "tests: some tests skipped on the GPU host (no usable device?)" | tee -a "$out/summary.txt"
  failed+=("tests-skipped")
fi

# 3. compute-sanitizer on a subset that covers every kernel and both levels in little time.
if command -v compute-sanitizer >/dev/null; then
  filter='CudaInt4Gemv.TailsEveryBlockSizeAndPlaneOrder:CudaInt4Gemv.IntegerPartsAreExact:CudaMoeLayer.GraphReplayWithNewRoutingEqualsEager:CudaMoeLayer.ErrorWordAndZeroOutputOnInvalidInput:CudaInt4GemmTc.RowTails:CudaInt4GemmTc.KTails:CudaInt4GemmTc.ColumnSubRanges:CudaInt4GemmTc.ScaleAndZeroPointPlanes:Offload.ShortCircuitGivesTheBitsOfTheRingPath:Offload.NoColdLayerLeavesTheStagingMemoryUntouched'
  step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$tests" --gtest_filter="$filter"
  step racecheck 240 compute-sanitizer --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$tests" \
    --gtest_filter='CudaInt4Gemv.IntegerPartsAreExact:CudaMoeLayer.ErrorWordAndZeroOutputOnInvalidInput:CudaInt4GemmTc.RowTails'
else
  echo "compute-sanitizer: not found" | tee -a "$out/summary.txt"
  failed+=("sanitizer-missing")
fi

# 4. Benchmarks (JSON), then the same layer rows with programmatic dependent launch off.
step bench 180 "$bench" --benchmark_out="$out/cuda_bench.json" --benchmark_out_format=json
step bench_no_pdl 60 env QMOE_CUDA_PDL=0 "$bench" --benchmark_filter='moe_(layer|stack48)' \
  --benchmark_out="$out/cuda_bench_no_pdl.json" --benchmark_out_format=json
# The offload doorbell's round trip beside a mapped ping-pong and a host-function hand-off that
# move the same bytes (one FP32 token of H 2048, then four).
step offload_latency 120 bash -c "'$build/benchmarks/qmoe_offload_latency' --calls 5000 &&
  '$build/benchmarks/qmoe_offload_latency' --m 4 --calls 5000"

# 5. Where a decode layer's time goes: Nsight Compute on a few launches of each MoE kernel and
# the GEMV (clocks left alone; ncu serialises kernels, so dependent launch does not overlap here).
if command -v ncu >/dev/null; then
  step ncu 180 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --kernel-name regex:'moe|gemv' --launch-skip 40 --launch-count 6 \
    "$bench" --benchmark_filter='moe_layer/qwen3/fast/m:1/|int4_gemv/gptoss/fast/m:1/' \
    --benchmark_min_time=0.01
fi

# 6. Resource usage and the hot loops' instructions, for the record.
cuobjdump --dump-resource-usage "$build/lib/CMakeFiles/qmoe_cuda.dir/cuda/int4_gemv.cu.o" \
  "$build/lib/CMakeFiles/qmoe_cuda.dir/cuda/moe_layer.cu.o" >"$out/resource_usage.txt" 2>&1 || true

steps_end
