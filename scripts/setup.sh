#!/usr/bin/env bash
# Installs what libqmoe needs to build, test and benchmark on Debian 12, when it is missing.
# Idempotent and quiet when everything is there: apt-get update runs once, only if some
# package is missing. Then makes sure python3 can import numpy, onnx and onnxruntime (the
# ONNX Runtime parity test and comparisons); when that cannot be installed it warns and goes
# on, and the parity test skips with its reason. matplotlib, for the optional plots, is left to
# the user: a one-line note says how to get it.
set -euo pipefail

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  if ((apt_updated == 0)); then
    "${sudo_cmd[@]}" apt-get update -qq
    apt_updated=1
  fi
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

packages=(
  build-essential cmake pkg-config git
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libcpuinfo-dev libpthreadpool-dev libfp16-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# Python packages from PyPI (onnxruntime 1.30+ there; Debian has none of it).
python_ok() { python3 -c "import onnx, onnxruntime, numpy" >/dev/null 2>&1; }
if ! python_ok; then
  echo "setup: installing numpy, onnx and onnxruntime for python3 (pip)"
  if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3 python3-pip || true
  fi
  pip_flags=(--quiet)
  # Debian's own python3 is marked externally managed (PEP 668): pip then needs consent to
  # install beside the apt packages (into /usr/local as root; pip itself falls back to the
  # user's site-packages when it cannot write there).
  if python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' \
      2>/dev/null; then
    pip_flags+=(--break-system-packages)
  fi
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install "${pip_flags[@]}" onnxruntime onnx numpy || true
  if ! python_ok; then
    echo "setup: WARNING: python3 cannot import numpy, onnx and onnxruntime; the ONNX Runtime" \
         "parity test (onnxruntime_qmoe_parity) will be skipped" >&2
  fi
fi

# Plots (benchmarks/plot_benchmarks.py) are optional, so nothing here requires or installs
# matplotlib; Debian's package is the one to use, with Debian's own python3.
if ! /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "setup: note: plots are optional; for benchmarks/plot_benchmarks.py run" \
       "'apt-get install -y python3-matplotlib' and use /usr/bin/python3"
fi
