#!/usr/bin/env bash
# libqmoe against ggml's CPU backend, same bytes, same process (issue 21; docs/benchmarks.md).
#
# Downloads the llama-cpp-python source distribution from PyPI into a cache folder outside the
# repository (ggml is never vendored here), unpacks it, builds ggml's CPU backend from its
# vendor/llama.cpp/ggml (Release, -march=native, repacking on, no BLAS, no GPU) together with
# compare_ggml.cc against an installed libqmoe, runs the comparison RUNS times and prints the
# median of the runs as a table and JSON. CI does not run it.
#
#   benchmarks/ggml/compare_ggml.sh [compare_ggml options]   # e.g. --layers 16, --only gemv
#
# Environment:
#   QMOE_GGML_CACHE   cache folder (default /tmp/qmoe-ggml): sdist, sources, builds, results
#   LLAMA_CPP_PYTHON  sdist version to use (default: the newest, as pip picks it)
#   QMOE_PREFIX       an installed libqmoe (its CMake package); default: the repository's
#                     build/ (QMOE_BUILD_DIR), configured and built when missing, then
#                     installed into the cache
#   RUNS              processes to run (default 3); the figures are their medians
#   PYTHON            python with pip (default python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${QMOE_GGML_CACHE:-/tmp/qmoe-ggml}
runs=${RUNS:-3}
python=${PYTHON:-python3}
jobs=$(nproc)
mkdir -p "$cache/sdist"

# 1. The sdist (about 77 MB), once per version.
spec=llama-cpp-python${LLAMA_CPP_PYTHON:+==$LLAMA_CPP_PYTHON}
sdist=$(ls -t "$cache"/sdist/llama_cpp_python-${LLAMA_CPP_PYTHON:-*}.tar.gz 2>/dev/null | head -1 || true)
if [[ -z "$sdist" ]]; then
  echo "== pip download --no-binary :all: --no-deps $spec"
  "$python" -m pip download --no-binary :all: --no-deps "$spec" -d "$cache/sdist" >&2
  sdist=$(ls -t "$cache"/sdist/llama_cpp_python-*.tar.gz | head -1)
fi
version=$(basename "$sdist" .tar.gz)
version=${version#llama_cpp_python-}
src=$cache/llama_cpp_python-$version
if [[ ! -f "$src/vendor/llama.cpp/ggml/CMakeLists.txt" ]]; then
  echo "== unpacking $(basename "$sdist")"
  tar -xzf "$sdist" -C "$cache"
fi
ggml_src=$src/vendor/llama.cpp/ggml

# The llama.cpp commit: the sdist carries the submodule's git data; else its CHANGELOG says.
commit=$(git -C "$src/vendor/llama.cpp" rev-parse HEAD 2>/dev/null || true)
if [[ -z "$commit" ]]; then
  commit=$(awk -v v="## [$version]" '$0 == v {f = 1; next} f && /llama.cpp@/ {
             sub(/.*llama.cpp@/, ""); print; exit }' "$src/CHANGELOG.md" || true)
fi
ggml_version=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' \
                 "$ggml_src/CMakeLists.txt" | paste -sd.)
echo "== llama-cpp-python $version: llama.cpp ${commit:-unknown}, ggml $ggml_version"

# 2. libqmoe, through its CMake package.
if [[ -n "${QMOE_PREFIX:-}" ]]; then
  prefix=$QMOE_PREFIX
else
  build=${QMOE_BUILD_DIR:-$repo/build}
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=OFF \
      -DQMOE_BUILD_TESTS=OFF -DQMOE_BUILD_BENCHMARKS=OFF >&2
  fi
  # Installing needs every target the build folder installs: the library, and the qmoe tool
  # where that folder builds tools.
  targets=(qmoe)
  if cmake --build "$build" --target help 2>/dev/null | grep -qw qmoe_cli; then
    targets+=(qmoe_cli)
  fi
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" >&2
  prefix=$cache/qmoe-install
  cmake --install "$build" --prefix "$prefix" >/dev/null
fi

# 3. ggml's CPU backend and compare_ggml, in one CMake build in the cache.
bin=$cache/build-$version
cmake -S "$repo/benchmarks/ggml" -B "$bin" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_SOURCE_DIR="$ggml_src" -DCMAKE_PREFIX_PATH="$prefix" >"$cache/configure.log" ||
  { cat "$cache/configure.log" >&2; exit 1; }
cmake --build "$bin" -j"$jobs" --target compare_ggml >"$cache/build.log" 2>&1 ||
  { tail -50 "$cache/build.log" >&2; exit 1; }

# 4. RUNS processes, then their medians.
out=$cache/results-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "== compare_ggml $* (x$runs); THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
for ((i = 1; i <= runs; ++i)); do
  echo "== run $i of $runs"
  "$bin/compare_ggml" --json "$out/run-$i.json" "$@"
done

"$python" - "$out" "$version" "${commit:-unknown}" "$ggml_version" "$*" <<'EOF'
import json, pathlib, statistics, sys

out, version, commit, ggml_version, args = sys.argv[1:]
runs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(out).glob("run-*.json"))]
keys = ("bench", "format", "shape", "ggml_buffer", "m", "threads", "layers")
rows = {}
for run in runs:
    for r in run["rows"]:
        rows.setdefault(tuple(r[k] for k in keys), []).append(r)
summary = []
for key, rs in rows.items():
    ratios = [r["ratio"] for r in rs]
    summary.append(dict(zip(keys, key)) | {
        "runs": len(rs),
        "qmoe_us": statistics.median(r["qmoe_us"] for r in rs),
        "ggml_us": statistics.median(r["ggml_us"] for r in rs),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "err_qmoe_vs_ggml": max(r["err_qmoe_vs_ggml"] for r in rs),
        "err_qmoe_vs_fp64": max(r["err_qmoe_vs_fp64"] for r in rs),
        "err_ggml_vs_fp64": max(r["err_ggml_vs_fp64"] for r in rs),
    })
context = runs[0]["context"] | {"llama_cpp_python": version, "llama_cpp_commit": commit,
                                "ggml_version_cmake": ggml_version, "args": args}
print(f"\nllama-cpp-python {version}, llama.cpp {commit}, ggml {ggml_version}; {len(runs)} runs; "
      "ratio = qmoe / ggml time (below 1: libqmoe faster), median of the runs [min-max]")
print("| bench | format (ggml/qmoe) | shape | ggml buffer | M | threads | qmoe us | ggml us | ratio [range] | err qmoe-ggml | err vs FP64 qmoe / ggml |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in summary:
    fmt = "Q4_0 / INT4" if s["format"] == "q4_0" else "MXFP4 / MXFP4"
    shape = s["shape"] + (f" x{s['layers']} layers" if s["layers"] else "")
    print(f"| {s['bench']} | {fmt} | {shape} | {s['ggml_buffer']} | {s['m']} | {s['threads']} | "
          f"{s['qmoe_us']:.1f} | {s['ggml_us']:.1f} | {s['ratio']:.2f} [{s['ratio_min']:.2f}-"
          f"{s['ratio_max']:.2f}] | {s['err_qmoe_vs_ggml']:.1e} | "
          f"{s['err_qmoe_vs_fp64']:.1e} / {s['err_ggml_vs_fp64']:.1e} |")
result = {"context": context, "rows": summary}
(pathlib.Path(out) / "summary.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result))
print(f"\n(files in {out})")
EOF
