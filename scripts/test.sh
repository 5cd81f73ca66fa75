#!/usr/bin/env bash
# Set up, build and run the whole test suite.
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/ (CUDA off; the 2^32
#                                conversion sweeps sample every 257th input)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ${1:-} == "--sanitize" ]]; then
  "$root/scripts/build.sh" "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DQMOE_SANITIZE=address,undefined -DQMOE_CUDA=OFF -DQMOE_BUILD_BENCHMARKS=OFF -DQMOE_BUILD_TESTS=ON
  export QMOE_TEST_SWEEP_STRIDE=${QMOE_TEST_SWEEP_STRIDE:-257}
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  ctest --test-dir "$root/build-asan" --output-on-failure --no-tests=error -j"$(nproc)"
else
  # Tests on, whatever an earlier configure of build/ left in its cache; and no tests found
  # is a failure, not a pass.
  "$root/scripts/build.sh" "$root/build" -DQMOE_BUILD_TESTS=ON
  ctest --test-dir "$root/build" --output-on-failure --no-tests=error -j"$(nproc)"
fi
