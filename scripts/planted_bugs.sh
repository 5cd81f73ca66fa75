#!/usr/bin/env bash
# Plant each of issue 22's five bugs in a scratch worktree, one at a time, rebuild, run the CPU
# suite, and list the tests that failed: each bug must fail at least two (the suite proves what
# it claims only if it does). The worktree and its build stay in BUILD_ROOT between runs, so a
# second run rebuilds only what a bug touches.
#   scripts/planted_bugs.sh [BUILD_ROOT]        default /tmp/qmoe-planted
# Exit status: 0 when every bug failed two tests or more, 1 otherwise. CUDA, the benchmarks and
# the host emulation of the CUDA kernels are left out (the bugs are all in the CPU library).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-/tmp/qmoe-planted}
tree=$work/tree
build=$work/build
mkdir -p "$work"
if [[ ! -d $tree/.git && ! -f $tree/.git ]]; then
  git -C "$root" worktree add --detach "$tree" HEAD >/dev/null
fi
git -C "$tree" checkout --detach -q "$(git -C "$root" rev-parse HEAD)"
git -C "$tree" checkout -q -- .
cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=OFF -DQMOE_BUILD_TESTS=ON \
  -DQMOE_BUILD_BENCHMARKS=OFF -DQMOE_BUILD_TOOLS=OFF -DQMOE_TEST_FIXED_SEEDS= >/dev/null ||
  exit 1

# plant NAME FILE PERL: apply the substitution, which must change the file.
plant() {
  local file=$tree/$2
  cp "$file" "$work/original"
  perl -0pi -e "$3" "$file"
  if cmp -s "$file" "$work/original"; then
    echo "planted_bugs: $1: the substitution did not apply to $2 (the code moved?)" >&2
    return 1
  fi
}

declare -A bugs=(
  [avx512_table_from_avx2]='lib/cpu/kernel_tables.cc|s/feature, &k_##token##_table\}/feature, CpuIsa::token == CpuIsa::avx512 ? &k_avx2_table : &k_##token##_table}/'
  [routing_without_renormalisation]='lib/moe/routing.cc|s/if \(renormalize\) \{/if (false \&\& renormalize) {/'
  [q4_0_import_off_by_one_block]='lib/formats/int4_import.cc|s/scales\[row \* scale_row_stride \+ b \* scale_block_stride\] = d;/scales[row * scale_row_stride + ((b + 1) % blocks) * scale_block_stride] = d;/'
  [task_shares_scratch]='lib/gemm_api.cc|s/task->scratch \+ t \* task->scratch_stride/task->scratch/'
  [dropped_join]='lib/context.cc|s/pthreadpool_parallelize_1d\(pool_, task, task_state, range, \/\*flags=\*\/0\);/std::thread([=] { for (size_t i = 1; i < range; ++i) task(task_state, i); }).detach();\n    task(task_state, 0);/'
)
order=(avx512_table_from_avx2 routing_without_renormalisation q4_0_import_off_by_one_block
  task_shares_scratch dropped_join)

weak=0
summary=()
for name in "${order[@]}"; do
  file=${bugs[$name]%%|*}
  expr=${bugs[$name]#*|}
  git -C "$tree" checkout -q -- .
  plant "$name" "$file" "$expr" || {
    weak=1
    continue
  }
  if ! cmake --build "$build" -j"$(nproc)" >"$work/$name.build.log" 2>&1; then
    echo "planted_bugs: $name: the build failed ($work/$name.build.log)" >&2
    weak=1
    continue
  fi
  # A dropped join can leave a task running into the next test: a per-test timeout ends it.
  ctest --test-dir "$build" -j"$(nproc)" --timeout 300 -E 'EmulatedDevice|^cuda\.' \
    >"$work/$name.ctest.log" 2>&1
  mapfile -t failing < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (\(Failed\|Timeout\|SEGFAULT\|Subprocess aborted\|Exception\).*/\1/p' \
    "$work/$name.ctest.log")
  summary+=("$name: ${#failing[@]} tests failed")
  echo "== $name ($file): ${#failing[@]} tests failed"
  printf '   %s\n' "${failing[@]:0:12}"
  ((${#failing[@]} > 12)) && echo "   ... and $((${#failing[@]} - 12)) more ($work/$name.ctest.log)"
  ((${#failing[@]} >= 2)) || weak=1
done
git -C "$tree" checkout -q -- .
printf '%s\n' "${summary[@]}"
exit "$weak"
