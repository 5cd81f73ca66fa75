#!/usr/bin/env python3
"""benchmarks/plot_benchmarks.py on hand-written runs: what it reads, then the PNGs it draws.

Why: the plots in docs/benchmarks.md are redrawn from new runs by this script alone, so a row
read wrongly (a repetition or the mean taken for the median, a failed row drawn as zero, an
M = 4 / M = 1 ratio across two processes) would put a wrong bar in the docs unnoticed.
  - qwen3_fc1/avx2 fast M = 1 has two repetitions (0.50, 0.95), then its mean (0.20) and
    median (0.91): only 0.91 may stand for the row;
  - a row with error_occurred is dropped;
  - two processes give M = 4 / M = 1 of 1.25 and 2.00 when each ratio is taken within its
    process (mixing them would give 1.60 or 2.50).
The loader needs the standard library only. The drawing needs matplotlib (Debian's
python3-matplotlib): the test runs the script with this interpreter or /usr/bin/python3,
whichever imports matplotlib, and exits 77 (a skip) when neither does.

Usage: plot_benchmarks_test.py path/to/plot_benchmarks.py
Exit status: 0 pass, 1 failure, 77 skip (no matplotlib: the loader checks still ran).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile


def row(name, frac, us, aggregate=None, error=False):
    full = name + "/manual_time"
    b = {"name": full, "run_name": full, "run_type": "iteration", "frac_of_read_bw": frac,
         "us_per_call": us}
    if aggregate is not None:
        b.update(name=full + "_" + aggregate, run_type="aggregate", aggregate_name=aggregate)
    if error:
        b.update(error_occurred=True, error_message="avx512 unavailable")
    return b


def bench_run(m1_us, m4_us):
    context = {"host_name": "test", "date": "2026-12-01T00:00:00+00:00",
               "qmoe_hardware_threads": "16", "qmoe_read_roof_1_thread_GB/s": "15.00",
               "qmoe_read_roof_all_threads_GB/s": "100.00"}
    benchmarks = [
        row("gemm_int4/qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.50, m1_us),
        row("gemm_int4/qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.95, m1_us),
        row("gemm_int4/qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.20, m1_us, "mean"),
        row("gemm_int4/qwen3_fc1/avx2/fast/m:1/cold/threads:1", 0.91, m1_us, "median"),
        row("gemm_int4/qwen3_fc1/avx2/fast/m:4/cold/threads:1", 0.70, m4_us),
        row("gemm_int4/qwen3_fc1/avx2/exact/m:1/cold/threads:all", 0.40, 50.0),
        row("gemm_int4/qwen3_fc1/avx2/read_only/cold/threads:1", 0.98, 90.0),
        row("gemm_int4/qwen3_fc1/avx512/fast/m:1/cold/threads:1", 0.0, 0.0, error=True),
        row("moe_layer/qwen3/avx2/fast/m:1/cold/threads:all", 1.02, 180.0),
        row("moe_layer/qwen3_int3/avx2/fast/m:1/cold/threads:all", 0.97, 150.0),
        row("convert_f16_to_f32/avx2/dram/threads:1", 1.05, 7000.0),
    ]
    return {"context": context, "benchmarks": benchmarks}


def decode_report(threads, ratio):
    return {"command": "run", "cpu": "test", "tier": "avx2", "threads": threads,
            "accuracy": "fast", "activations": "f32", "model": {"layers": 48},
            "bandwidth_ratio": ratio, "weights_bandwidth_ratio": ratio + 0.05,
            "timing": {"ms_per_layer": 1.6 / threads}}


def cache_report(residency, hit_rate):
    policies = [{"policy": name, "steady_hit_rate": hit_rate, "steady_promotions_per_step": copies}
                for name, copies in (("static-hindsight", 0.0), ("lru", 40.0), ("lfru", 12.0))]
    return {"command": "cache", "model": {"name": "qwen3-30b-a3b", "layers": 48},
            "trace": {"routing": "zipf", "steps": 2000, "tokens_per_step": 1},
            "cache": {"residency": residency}, "policies": policies}


def check_loader(plot, paths, failures):
    runs, decodes, caches = plot.load(paths)
    if len(runs) != 2 or len(decodes) != 2 or len(caches) != 2:
        failures.append(f"load: {len(runs)} benchmark runs, {len(decodes)} run reports and "
                        f"{len(caches)} cache reports, want 2, 2 and 2")
        return
    rows = runs[0].rows
    got = rows["gemm_int4/qwen3_fc1/avx2/fast/m:1/cold/threads:1"]["frac_of_read_bw"]
    if got != 0.91:
        failures.append(f"the repeated row read {got}, want its median 0.91")
    if any("avx512" in name for name in rows):
        failures.append("a row with error_occurred was kept")
    ratios, _ = plot.m4_over_m1(runs)
    got = sorted(ratios.get(("qwen3_fc1", "avx2"), []))
    if got != [1.25, 2.0]:
        failures.append(f"M = 4 / M = 1 per process {got}, want [1.25, 2.0]")


def drawing_python():
    for python in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(python) and subprocess.run(
                [python, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return python
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    script = sys.argv[1]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # for gemm_int4_summary
    spec = importlib.util.spec_from_file_location("plot_benchmarks", script)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)

    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for name, data in (("a.json", bench_run(100.0, 125.0)), ("b.json", bench_run(80.0, 160.0)),
                           ("t1.json", decode_report(1, 0.85)),
                           ("t16.json", decode_report(16, 1.10)),
                           ("c25.json", cache_report(0.25, 0.93)),
                           ("c50.json", cache_report(0.5, 0.98))):
            paths.append(os.path.join(scratch, name))
            with open(paths[-1], "w") as f:
                json.dump(data, f)
        check_loader(plot, paths, failures)

        python = drawing_python()
        if python is not None:
            out = os.path.join(scratch, "plots")
            subprocess.run([python, script, "--out", out] + paths, check=True)
            for name in ("gemm_int4_roof.png", "gemm_int4_m4_over_m1.png", "moe_layer_roof.png",
                         "convert_roof.png", "decode_threads.png", "cache_policies.png"):
                path = os.path.join(out, name)
                if not os.path.exists(path):
                    failures.append(f"{name} was not drawn")
                    continue
                with open(path, "rb") as f:
                    if f.read(8) != b"\x89PNG\r\n\x1a\n":
                        failures.append(f"{name} is not a PNG")

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    if python is None:
        print("SKIP: no python with matplotlib (apt-get install python3-matplotlib); "
              "the loader checks passed, nothing was drawn")
        return 77
    print("plot_benchmarks.py: loader checks passed, six PNGs drawn with", python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
