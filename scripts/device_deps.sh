#!/usr/bin/env bash
# The build's Debian dependencies on a host with no package registry (the GPU host the device
# tool lends): fetched here as .deb files, carried along, unpacked there.
#   scripts/device_deps.sh fetch [DIR]     here: apt-get download into DIR (default .dev/debs)
#   scripts/device_deps.sh install [DIR]   there: unpack DIR's packages into / and ldconfig
# The packages are leaf libraries and headers (GoogleTest, Google Benchmark, cpuinfo,
# pthreadpool, FP16, and pkg-config where the host has none); nothing of the host's is
# replaced except by the same files.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${2:-"$root/.dev/debs"}
libraries=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libcpuinfo-dev
           libcpuinfo0 libpthreadpool-dev libpthreadpool0 libfp16-dev)
pkg_config=(pkg-config pkgconf pkgconf-bin libpkgconf3)
case ${1:-} in
  fetch)
    mkdir -p "$dir"
    (cd "$dir" && apt-get download "${libraries[@]}" "${pkg_config[@]}")
    ;;
  install)
    for name in "${libraries[@]}"; do dpkg -x "$dir/${name}"_*.deb /; done
    if ! command -v pkg-config >/dev/null; then
      for name in "${pkg_config[@]}"; do dpkg -x "$dir/${name}"_*.deb /; done
    fi
    ldconfig
    ;;
  *)
    echo "usage: scripts/device_deps.sh fetch|install [DIR]" >&2
    exit 2
    ;;
esac
