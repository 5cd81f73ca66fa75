#!/usr/bin/env python3
"""benchmarks/gemm_int4_summary.py's bar section on a hand-written Google Benchmark JSON run.

Why: the closing notes quote the bar rows this script prints, so a wrong row (a repetition
taken for the median, a bar compared the wrong way, a read_only row matched to the wrong GEMM
row) would misreport a bar as met. Each row below is built so that a plausible mistake gives a
different line:
  - qwen3_fc1/avx2 fast M = 1 has two repetitions (0.50 and 0.95) and then, as Google
    Benchmark writes them, its mean (0.20), median (0.91), stddev and cv aggregates: only the
    median may be printed;
  - the fractions are on both sides of each bar, one equals a bar exactly (met), and two lie
    just under one: judged as printed to three decimals, 0.5496 is 0.550 (met) and 0.5494 is
    0.549 (NOT met);
  - time(M = 4) / time(M = 1) is 1.25 (met) and 1.40 (NOT met), from us_per_call, which
    differs from real_time so that using the wrong field shows;
  - read_only rows exist for one shape only, and at another thread count than a GEMM row.

Usage: gemm_int4_summary_test.py path/to/gemm_int4_summary.py
Exit status: 0 pass, 1 failure (the missing and unexpected lines printed).
"""

import json
import os
import subprocess
import sys
import tempfile


# (row name without "gemm_int4/" and "/manual_time", frac_of_read_bw, us_per_call, aggregate
# name or None for a repetition), in the order Google Benchmark writes them.
ROWS = (
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.50, 100.0, None),
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.95, 100.0, None),
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.20, 100.0, "mean"),
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.91, 100.0, "median"),
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.03, 3.0, "stddev"),
    ("qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.04, 0.04, "cv"),
    ("qwen3_fc1/avx2/fast/m:4/cold/threads:1", 0.70, 125.0, None),
    ("qwen3_fc2/avx512/fast/m:1/cold/threads:1", 0.90, 50.0, None),
    ("qwen3_fc2/avx512/fast/m:4/cold/threads:1", 0.60, 70.0, None),
    ("qwen3_fc2/avx512/fast/m:1/cold/threads:all", 0.48, 8.0, None),
    ("qwen3_fc2/avx512/fast/m:1/warm/threads:1", 1.90, 20.0, None),
    ("qwen3_fc1/avx2/exact/m:1/cold/threads:1", 0.56, 180.0, None),
    ("qwen3_fc2/avx512/exact/m:1/cold/threads:1", 0.54, 90.0, None),
    ("gptoss/avx512/exact/m:1/cold/threads:1", 0.5494, 400.0, None),
    ("gptoss/avx2/exact/m:1/cold/threads:1", 0.5496, 410.0, None),
    ("qwen3_fc1/scalar/fast/m:1/cold/threads:1", 0.05, 2000.0, None),
    ("qwen3_fc1/avx2/read_only/cold/threads:1", 0.91, 90.0, None),
    ("qwen3_fc1/avx2/read_only/cold/threads:all", 0.80, 20.0, None),
)


def benchmark_json(row, frac, us, aggregate):
    # real_time is not proportional to us_per_call, so a ratio of the wrong field shows.
    name = "gemm_int4/" + row + "/manual_time"
    b = {"name": name, "run_name": name, "run_type": "iteration", "frac_of_read_bw": frac,
         "us_per_call": us, "real_time": 1000.0 - us, "GB/s": 1.0}
    if aggregate is not None:
        b.update(name=name + "_" + aggregate, run_type="aggregate", aggregate_name=aggregate)
    return b


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    benchmarks = [benchmark_json(*r) for r in ROWS]
    run = {"context": {"qmoe_read_roof_1_thread_GB/s": "15.00"}, "benchmarks": benchmarks}
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "run.json")
        with open(path, "w") as f:
            json.dump(run, f)
        out = subprocess.run([sys.executable, sys.argv[1], path], capture_output=True,
                             text=True, check=True).stdout
    bars = out[out.index("Issue 3's bars"):]
    got = [" ".join(line.split()) for line in bars.splitlines()[1:]]
    want = [
        "fast M=1 cold, 1 thread, of the roof >= 0.90:",
        "qwen3_fc1/avx2 0.910 met",
        "qwen3_fc2/avx512 0.900 met",
        "fast M=1 cold, all threads, of the roof >= 0.90:",
        "qwen3_fc2/avx512 0.480 NOT met",
        "exact M=1 cold, 1 thread, of the roof >= 0.55:",
        "gptoss/avx2 0.550 met",
        "gptoss/avx512 0.549 NOT met",
        "qwen3_fc1/avx2 0.560 met",
        "qwen3_fc2/avx512 0.540 NOT met",
        "fast M=4 / M=1 time, cold, 1 thread <= 1.30:",
        "qwen3_fc1/avx2 1.250 met",
        "qwen3_fc2/avx512 1.400 NOT met",
        "fast M=1 cold over read_only (the same pages read alone, same run), for reference:",
        "qwen3_fc1/avx2 t:1 1.00",
    ]
    if got != want:
        print("bar section differs from what the run implies")
        for line in want:
            if line not in got:
                print("  missing:    " + line)
        for line in got:
            if line not in want:
                print("  unexpected: " + line)
        if sorted(got) == sorted(want):
            print("  (same lines, other order)")
        print(out)
        return 1
    print("gemm_int4_summary bar section: all %d lines as expected" % len(want))
    return 0


if __name__ == "__main__":
    sys.exit(main())
