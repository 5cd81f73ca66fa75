#!/usr/bin/env bash
# The main job: set up, build, and run `qmoe info` (host, tier, caches, kernels, bandwidth).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" "$root/build"
"$root/build/tools/qmoe/qmoe" info --bandwidth
