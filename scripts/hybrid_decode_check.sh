#!/usr/bin/env bash
# On a GPU host: the hybrid CPU/GPU decode (`qmoe run --gpu`) over 48 Qwen3-30B-A3B-shaped INT4
# layers at 25, 50, 75 and 100% residency, uniform and Zipf routing, M = 1 and 4; one JSON and
# one log per run in OUT_DIR, then a table of them (scripts/lib/hybrid_table.py) on stdout and
# in OUT_DIR/hybrid_table.txt. Uses the build of scripts/cuda_device_check.sh (it builds the
# tool if missing).
#   scripts/hybrid_decode_check.sh OUT_DIR [BUILD_DIR]
# QMOE_HYBRID_LAYERS and QMOE_HYBRID_TOKENS change the depth (48) and the timed steps (32).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: scripts/hybrid_decode_check.sh OUT_DIR [BUILD_DIR]}
build=${2:-"$root/build-cuda"}
mkdir -p "$out"
cmake --build "$build" -j"$(nproc)" --target qmoe_cli >"$out/build_cli.log" 2>&1 || {
  echo "building qmoe failed; see $out/build_cli.log" >&2
  exit 1
}
qmoe="$build/tools/qmoe/qmoe"
layers=${QMOE_HYBRID_LAYERS:-48}
tokens=${QMOE_HYBRID_TOKENS:-32}
failed=0
for m in 1 4; do
  for routing in uniform zipf; do
    for residency in 0.25 0.5 0.75 1; do
      name="hybrid_m${m}_${routing}_${residency}"
      timeout 300 "$qmoe" run --gpu --layers "$layers" --tokens "$tokens" --batch "$m" \
        --routing "$routing" --residency "$residency" --json >"$out/$name.json" \
        2>"$out/$name.log" || {
        echo "$name failed (exit $?); see $out/$name.log" >&2
        failed=1
      }
    done
  done
done
python3 "$root/scripts/lib/hybrid_table.py" "$out"/hybrid_m*.json | tee "$out/hybrid_table.txt"
exit $failed
