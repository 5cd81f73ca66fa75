#!/usr/bin/env bash
# The main job: set up, build, and run a MoE decode end to end on the CPU (`qmoe run`: a
# synthetic Qwen3-30B-A3B-shaped model, 4 layers by default; `--layers 48` for full depth).
# Extra arguments go to `qmoe run` (see `qmoe run --help`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" "$root/build"
"$root/build/tools/qmoe/qmoe" run "$@"
