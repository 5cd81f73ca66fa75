#!/usr/bin/env bash
# On the device host (16-core Sapphire Rapids with AVX-VNNI and AVX512-VNNI, which the
# development CPU lacks): build everything, run the whole CPU suite, and the benchmark runs the
# plots of docs/benchmarks.md are drawn from. Everything goes into OUT_DIR (OUT_DIR.tgz holds it
# all); the build directory is left for scripts/cuda_device_check.sh (QMOE_SKIP_BUILD=1).
#   scripts/device_cpu_check.sh OUT_DIR [BUILD_DIR]
# Dependencies first: scripts/device_deps.sh install.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/lib/device_steps.sh"
build=${2:-"$root/build-device"}
steps_begin "${1:?usage: scripts/device_cpu_check.sh OUT_DIR [BUILD_DIR]}"
grep -m1 "model name" /proc/cpuinfo >"$out/cpu.txt"
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E "avx|amx|vnni|bf16|fp16" | tr '\n' ' ' \
  >>"$out/cpu.txt"
jobs=$(nproc)
step configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DQMOE_BUILD_TESTS=ON -DQMOE_BUILD_BENCHMARKS=ON -DQMOE_BUILD_TOOLS=ON || exit 1
step build 400 cmake --build "$build" -j"$jobs" || exit 1
# The whole suite; every tier and extension this CPU has runs (the logs name what skipped).
step ctest 400 ctest --test-dir "$build" -j"$jobs" --output-on-failure --no-tests=error
grep -E "Skipped|tests passed|tests failed" "$out/ctest.log" >"$out/ctest_summary.txt"
bench="$build/benchmarks/qmoe_bench"
step bench_bars 240 "$bench" \
  --benchmark_filter='^gemm_int4/(qwen3_fc1|qwen3_fc2|gptoss)/(avx2|avx512)/(read_only/cold|(fast|exact)/m:(1|4)/cold)' \
  --benchmark_repetitions=3 --benchmark_out="$out/bars.json" --benchmark_out_format=json
# The INT4 layer rows the plot draws, then every format's fast M = 1 rows (issue 21's bar).
step bench_moe 240 "$bench" --benchmark_filter='^moe_layer/qwen3/' --benchmark_repetitions=3 \
  --benchmark_out="$out/moe.json" --benchmark_out_format=json
step bench_moe_formats 240 "$bench" \
  --benchmark_filter='^moe_layer/qwen3_(int3|mxfp4|nvfp4)/(avx2|avx512)/fast/m:1/' \
  --benchmark_repetitions=3 --benchmark_out="$out/moe_formats.json" --benchmark_out_format=json
step bench_convert 120 "$bench" --benchmark_filter='^convert_.*/dram/' \
  --benchmark_repetitions=3 --benchmark_out="$out/convert.json" --benchmark_out_format=json
for t in 1 2 4 8 16; do
  step "decode_t$t" 120 sh -c "'$build/tools/qmoe/qmoe' run --layers 48 --tokens 8 --threads $t \
    --json >'$out/decode-$t.json'"
done
steps_end
