#!/usr/bin/env bash
# On a GPU host: build with CUDA (all cores), run the CUDA tests (a usable device required), the
# decode benchmarks with JSON output and a table of them, Nsight Compute on the decode kernels,
# then compute-sanitizer memcheck and racecheck on a filtered subset of the tests (last: the
# slowest, and a run cut short by its time limit keeps the numbers). Everything it writes goes
# into the directory given as $1.
#   scripts/cuda_device_check.sh OUT_DIR [BUILD_DIR]
# QMOE_SKIP_BUILD=1 uses an existing BUILD_DIR as it is (for a host without the build's Debian
# dependencies: GoogleTest, Google Benchmark, cpuinfo, pthreadpool, FP16; scripts/setup.sh).
# QMOE_CUDA_ARCHS=90 builds one architecture instead of the project's 80 and 90 (a short
# lease); QMOE_CHECK_NCU=0 leaves out the Nsight Compute step; QMOE_CHECK_BENCH=0 the benchmarks
# (tests and sanitizers only, for a lease too short for both).
# Meant to finish in about 4 minutes on an H200 with 16 cores (build excluded): the benchmarks
# are the decode rows (gpu/), the offload round trip and the prefill GEMM against cuBLAS at the
# launcher's tile (scripts/cuda_gemm_tc_check.sh sweeps the tiles), and the host-only emulation
# tests (EmulatedDevice.*, run by ctest on any machine) are left out of the device test step. Each step has its own timeout and the script
# goes on after a failed step, exiting non-zero at the end if any failed. OUT_DIR.tgz holds all
# of it.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/lib/device_steps.sh"
build=${2:-"$root/build-cuda"}
steps_begin "${1:?usage: scripts/cuda_device_check.sh OUT_DIR [BUILD_DIR]}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv >"$out/gpu.txt" 2>&1 || true
jobs=$(nproc)

# 1. Build (the architectures of the project default, 80 and 90, unless QMOE_CUDA_ARCHS says).
if [[ ${QMOE_SKIP_BUILD:-0} != 1 ]]; then
archs=()
[[ -n ${QMOE_CUDA_ARCHS:-} ]] && archs=(-DCMAKE_CUDA_ARCHITECTURES="$QMOE_CUDA_ARCHS")
step configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  "${archs[@]}" -DQMOE_BUILD_TESTS=ON -DQMOE_BUILD_BENCHMARKS=ON -DQMOE_BUILD_TOOLS=ON || {
  echo "configure failed; see $out/configure.log" >&2
  exit 1
}
step build 300 cmake --build "$build" -j"$jobs" --target qmoe_cuda_tests qmoe_tests qmoe_cuda_bench \
  qmoe_offload_latency || {
  echo "build failed; see $out/build.log" >&2
  exit 1
}
fi
tests="$build/tests/qmoe_cuda_tests"
bench="$build/benchmarks/qmoe_cuda_bench"

# 2. The CUDA tests, skips not allowed: a skipped test here means the device was not usable.
step tests 240 "$tests" --gtest_filter='-EmulatedDevice.*' --gtest_output="xml:$out/cuda_tests.xml"
if grep -q "SKIPPED" "$out/tests.log"; then
  echo "tests: some tests skipped on the GPU host (no usable device?)" | tee -a "$out/summary.txt"
  failed+=("tests-skipped")
fi
# The host-side checks of the CUDA ABI in the main test binary: on a machine without a GPU (CI)
# their set-dependent parts skip, so they must run here too.
step host_checks 60 "$build/tests/qmoe_tests" --gtest_filter='Cuda*'

# 3. The decode benchmarks (JSON), before the slower sanitizer steps, then the same layer rows
# with programmatic dependent launch off (and a GEMV row: the GEMV now launches with it too).
if [[ ${QMOE_CHECK_BENCH:-1} != 0 ]]; then
step bench 150 "$bench" --benchmark_filter='^gpu/' --benchmark_out="$out/cuda_bench.json" \
  --benchmark_out_format=json
step bench_no_pdl 60 env QMOE_CUDA_PDL=0 "$bench" \
  --benchmark_filter='^gpu/(moe_(layer|stack48)|int4_gemv/gptoss/fast/m:1/)' \
  --benchmark_out="$out/cuda_bench_no_pdl.json" --benchmark_out_format=json
# The offload doorbell's round trip beside a mapped ping-pong and a host-function hand-off that
# move the same bytes (one FP32 token of H 2048, then four).
step offload_latency 120 bash -c "'$build/benchmarks/qmoe_offload_latency' --calls 5000 &&
  '$build/benchmarks/qmoe_offload_latency' --m 4 --calls 5000"
# The prefill GEMM against cuBLAS BF16 on the same weights dequantised, M = 128, 512 and 2048.
step prefill 90 "$bench" --benchmark_filter='BM_Int4GemmTcVsCublas' \
  --benchmark_out="$out/prefill_bench.json" --benchmark_out_format=json

# The decode rows as a short table, right after the benchmarks (so a run cut short by its time
# limit still has it) and again at the end (the end of the output is what a remote run returns).
command -v python3 >/dev/null && python3 "$root/scripts/lib/cuda_bench_table.py" \
  "$out/cuda_bench.json" "$out/cuda_bench_no_pdl.json" >"$out/table.txt" 2>&1
fi

# 4. Where the time goes: Nsight Compute on a few launches of the GEMV (gpt-oss shape, fast, m 1)
# and of both MoE kernels (Qwen3 layer, fast, m 1), each run filtered to its own benchmark so the
# launch counts select the right kernels (clocks left alone; ncu serialises kernels, so
# dependent launch does not overlap here).
if [[ ${QMOE_CHECK_NCU:-1} != 0 && ${QMOE_CHECK_BENCH:-1} != 0 ]] && command -v ncu >/dev/null; then
  sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
    --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats)
  step ncu_gemv 90 ncu --clock-control none "${sections[@]}" --kernel-name regex:gemv \
    --launch-skip 20 --launch-count 2 \
    "$bench" --benchmark_filter='^gpu/int4_gemv/gptoss/fast/m:1/' --benchmark_min_time=0.01
  step ncu_moe 90 ncu --clock-control none "${sections[@]}" --kernel-name regex:moe_fc \
    --launch-skip 20 --launch-count 4 \
    "$bench" --benchmark_filter='^gpu/moe_layer/qwen3/fast/m:1/' --benchmark_min_time=0.01
fi

# 5. compute-sanitizer on a subset that covers every kernel and both levels in little time.
if command -v compute-sanitizer >/dev/null; then
  # Every offload test (the ring, the wait kernel, the timeout and destroy paths) and the ABI
  # layer tests run whole; of the kernel suites, the cases that reach every kernel and tail.
  filter='CudaInt4Gemv.TailsEveryBlockSizeAndPlaneOrder:CudaInt4Gemv.IntegerPartsAreExact:CudaMoeLayer.GraphReplayWithNewRoutingEqualsEager:CudaMoeLayer.ErrorWordAndZeroOutputOnInvalidInput:CudaInt4GemmTc.RowTails:CudaInt4GemmTc.KTails:CudaInt4GemmTc.ColumnSubRanges:CudaInt4GemmTc.ScaleAndZeroPointPlanes:CudaInt4GemmTc.WgmmaTiles:CudaInt4GemmTc.WgmmaScaledWeights:CudaInt4GemmTc.WideTileRunsScaledWeightsOnly:CudaInt4GemmTc.SplitOverKAcrossACluster:CudaFp4Decode.GemmNanScalesMakeTheirRowsNan:CudaFp4Decode.MoeLayerNvfp4:CudaAbiLayer.*:Offload.*'
  step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$tests" --gtest_filter="$filter"
  step racecheck 240 compute-sanitizer --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$tests" \
    --gtest_filter='CudaInt4Gemv.IntegerPartsAreExact:CudaMoeLayer.ErrorWordAndZeroOutputOnInvalidInput:CudaInt4GemmTc.RowTails:CudaInt4GemmTc.WgmmaTiles:CudaInt4GemmTc.WgmmaScaledWeights:CudaInt4GemmTc.SplitOverKAcrossACluster:CudaFp4Decode.MoeLayerNvfp4:Offload.HybridLayerIsTheResidentLayerPlusTheCpuColdPart:Offload.ShortCircuitGivesTheBitsOfTheRingPath'
else
  echo "compute-sanitizer: not found" | tee -a "$out/summary.txt"
  failed+=("sanitizer-missing")
fi

# 6. Resource usage and the kernels' SASS, for the record.
objs=("$build/lib/CMakeFiles/qmoe_cuda.dir/cuda/int4_gemv.cu.o"
  "$build/lib/CMakeFiles/qmoe_cuda.dir/cuda/moe_layer.cu.o")
wgmma_obj="$build/lib/CMakeFiles/qmoe_cuda_sm90a.dir/cuda/int4_gemm_wgmma.cu.o"
[[ -f $wgmma_obj ]] && objs+=("$wgmma_obj")
# One object a call: cuobjdump takes a single file (given several, it prints its usage).
for obj in "${objs[@]}"; do cuobjdump --dump-resource-usage "$obj" 2>&1 || true; done \
  >"$out/resource_usage.txt"
for obj in "${objs[@]}"; do cuobjdump --dump-sass "$obj" 2>&1 || true; done |
  gzip >"$out/decode_sass.txt.gz"

cat "$out/table.txt" "$out/offload_latency.log" 2>/dev/null
grep -E '^BM_Int4GemmTcVsCublas' "$out/prefill.log" 2>/dev/null | sed -E 's/ +/ /g' || true
steps_end
