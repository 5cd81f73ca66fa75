"""Timing helpers of the ONNX Runtime comparisons (benchmarks/compare_onnxruntime.py, its
`gemm` and `moe` subcommands): the median of per-call times, the L3 size that sizes cold
weight rotations, the hardware thread count, and a gate that repeats measurements other
processes disturbed.

Why a module of its own: every comparison times ORT and libqmoe with these, so their figures
can be read together, and the method stays one.
"""

import os
import statistics
import time


def hardware_threads():
    """CPUs this process may run on."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)


def median_time(call, seconds, min_runs, per_run=1, prepare=None):
    """Median seconds per unit of work of call(), which does `per_run` units per call: one
    warm-up call, then calls until both `min_runs` and `seconds` are reached. `prepare`, when
    given, runs before every call, outside the timed interval."""
    if prepare is not None:
        prepare()
    call()  # warm-up
    samples = []
    deadline = time.perf_counter() + seconds
    while len(samples) < min_runs or time.perf_counter() < deadline:
        if prepare is not None:
            prepare()
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) * 1e-9 / per_run)
        if len(samples) >= 100000:
            break
    return statistics.median(samples)


def l3_bytes():
    """Bytes of one L3 instance (sysfs), 32 MiB when unknown."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return 32 << 20


def add_method_arguments(parser):
    """The measurement options every comparison takes, with one meaning: --rounds (interleaved
    rounds, samples pooled) and --gate (the Gate below)."""
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds (samples pooled; default 2)")
    parser.add_argument("--gate", action="store_true",
                        help="on a shared Linux host: wait for an idle moment before each "
                             "measurement and repeat those other processes disturbed")


class Gate:
    """Repeats a measurement that other processes disturbed (Linux; --gate).

    Before a measurement it waits (up to `max_wait` s) for a moment when the machine is idle,
    and afterwards compares the CPU time the whole machine used (/proc/stat) with this
    process's own (all its threads: ORT's and libqmoe's pools included). When other processes
    used more than 5% of a CPU over the measurement, it is repeated (up to `attempts` times;
    the last result is kept and counted as disturbed).
    """

    def __init__(self, enabled, max_wait=120.0, attempts=6):
        self.enabled = enabled and os.path.exists("/proc/stat")
        self.max_wait, self.attempts = max_wait, attempts
        self.tick = os.sysconf("SC_CLK_TCK") if self.enabled else 100
        self.repeated = 0
        self.disturbed = 0

    def _busy(self):
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        # user nice system | idle iowait | irq softirq steal
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / self.tick

    @staticmethod
    def _own():
        t = os.times()
        return t.user + t.system

    def _wait_idle(self):
        deadline = time.monotonic() + self.max_wait
        while time.monotonic() < deadline:
            b0, c0, t0 = self._busy(), self._own(), time.monotonic()
            time.sleep(0.5)
            others = (self._busy() - b0) - (self._own() - c0)
            if others <= 0.05 * (time.monotonic() - t0):
                return

    def measure(self, fn):
        if not self.enabled:
            return fn()
        for _ in range(self.attempts):
            self._wait_idle()
            b0, c0, t0 = self._busy(), self._own(), time.monotonic()
            result = fn()
            wall = time.monotonic() - t0
            others = (self._busy() - b0) - (self._own() - c0)
            if others <= 0.05 * wall + 2.0 / self.tick:
                return result
            self.repeated += 1
        self.disturbed += 1
        return result
