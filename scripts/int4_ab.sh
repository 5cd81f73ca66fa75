#!/usr/bin/env bash
# A/B of two builds of libqmoe's CPU path in one session on one machine: the INT4 bar rows of
# qmoe_bench and the 48-layer `qmoe run` decode, alternated (A B, then B A, ...) until a time
# budget runs out, each run's JSON kept. For changes that must leave the ratios as they were.
#   scripts/int4_ab.sh A_SOURCE B_SOURCE OUT_DIR [BUDGET_S] [TIER]
# A_SOURCE and B_SOURCE are source trees (e.g. a `git worktree` of the old commit and this
# checkout); each is built Release without CUDA or tests into OUT_DIR/build-{a,b}.
set -uo pipefail
a_src=$(cd "${1:?usage: scripts/int4_ab.sh A_SOURCE B_SOURCE OUT_DIR [BUDGET_S] [TIER]}" && pwd)
b_src=$(cd "${2:?}" && pwd)
out=${3:?}
budget=${4:-480}
tier=${5:-avx512}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS
jobs=$(nproc)
for side in a b; do
  src_var=${side}_src
  cmake -S "${!src_var}" -B "$out/build-$side" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=OFF \
    -DQMOE_BUILD_TESTS=OFF >"$out/configure-$side.log" 2>&1 &&
    cmake --build "$out/build-$side" -j"$jobs" --target qmoe_bench qmoe_cli \
      >"$out/build-$side.log" 2>&1 || { echo "build $side failed: $out/build-$side.log"; exit 1; }
done
echo "builds: $((SECONDS - start)) s"
filter="^gemm_int4/(qwen3_fc1|qwen3_fc2|gptoss)/$tier/(read_only/cold|(fast|exact)/m:(1|4)/cold)"
bars() {  # bars SIDE ROUND
  "$out/build-$1/benchmarks/qmoe_bench" --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_out="$out/bars-$1-$2.json" --benchmark_out_format=json >"$out/bars-$1-$2.log" 2>&1
}
decode() {  # decode SIDE ROUND THREADS
  "$out/build-$1/tools/qmoe/qmoe" run --layers 48 --tokens 8 --threads "$3" --json \
    >"$out/decode-$1-$2-t$3.json" 2>"$out/decode-$1-$2-t$3.log"
}
round=0
order=(a b)
# Bars first (short), then the decode, one pair at a time while the budget lasts.
while ((SECONDS - start < budget * 6 / 10)); do
  for side in "${order[@]}"; do bars "$side" "$round"; done
  echo "bars round $round: $((SECONDS - start)) s"
  order=("${order[1]}" "${order[0]}")
  round=$((round + 1))
done
round=0
for threads in 16 1; do
  ((SECONDS - start < budget)) || break
  for side in "${order[@]}"; do decode "$side" "$round" "$threads"; done
  echo "decode threads $threads: $((SECONDS - start)) s"
  order=("${order[1]}" "${order[0]}")
done
echo "total $((SECONDS - start)) s"
