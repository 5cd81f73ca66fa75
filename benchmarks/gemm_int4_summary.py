#!/usr/bin/env python3
"""Tables from a qmoe_bench JSON run of the gemm_int4 benchmarks (docs/benchmarks.md).

  qmoe_bench --benchmark_filter='^gemm_int4/' --benchmark_format=json \
      --benchmark_out=gemm.json --benchmark_out_format=json
  python3 benchmarks/gemm_int4_summary.py gemm.json

Per shape, ISA, level and thread count, one line per M: cold and warm us/call, cold GB/s and
fraction of the read roof, warm GB/s and fraction, and cold/warm. Then the ratios the figures
are usually read for: time(M)/time(M=1) (cold, fast and exact), and scalar/SIMD at M=1. Last,
issue 3's performance bars, each row marked met or NOT met, for every shape and tier the run
holds (the bar asks fast M = 1 of the Qwen3 shapes; the others are printed for comparison),
and the fast M = 1 rows over the `read_only` rows of the same run.
Only the standard library is needed.
"""

import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^gemm_int4/(?P<shape>[^/]+)/(?P<isa>[^/]+)/(?P<level>exact|fast)/"
                  r"m:(?P<m>\d+)/(?P<temp>cold|warm)/threads:(?P<threads>1|all)")
READ_ONLY = re.compile(r"^gemm_int4/(?P<shape>[^/]+)/(?P<isa>[^/]+)/read_only/cold/"
                       r"threads:(?P<threads>1|all)")

# Issue 3's bars on fractions of the same run's read roof, at least `limit`: (what, level,
# threads, limit). The fourth bar, time(M = 4) / time(M = 1) of fast cold 1-thread rows, is at
# most M4_OVER_M1_LIMIT. Each value is judged as printed, rounded to three decimals, so that a
# line never shows a bar's own value as NOT met (or one just past it as met).
FRACTION_BARS = (
    ("fast M=1 cold, 1 thread, of the roof", "fast", "1", 0.90),
    ("fast M=1 cold, all threads, of the roof", "fast", "all", 0.90),
    ("exact M=1 cold, 1 thread, of the roof", "exact", "1", 0.55),
)
M4_OVER_M1_LIMIT = 1.30


def bar_line(label, value, limit, at_least):
    shown = round(value, 3)
    met = shown >= limit if at_least else shown <= limit
    return f"    {label:<20} {shown:6.3f}  {'met' if met else 'NOT met'}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    context = data.get("context", {})
    print("read roof: 1 thread %s GB/s, all threads %s GB/s; %s" % (
        context.get("qmoe_read_roof_1_thread_GB/s", "?"),
        context.get("qmoe_read_roof_all_threads_GB/s", "?"),
        context.get("qmoe_gemm_int4_pool", "")))

    rows = {}  # (shape, isa, level, threads, m, temp) -> benchmark
    read_only = {}  # (shape, isa, threads) -> benchmark
    skipped = set()
    # With --benchmark_repetitions a row's median aggregate stands for it (it comes after the
    # repetitions, so it replaces them); other aggregates are not used.
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") == "aggregate":
            if b.get("aggregate_name") != "median":
                continue
            b = dict(b, name=b.get("run_name", b["name"]))
        match = READ_ONLY.match(b["name"])
        if match and not b.get("error_occurred"):
            g = match.groupdict()
            read_only[(g["shape"], g["isa"], g["threads"])] = b
            continue
        match = NAME.match(b["name"])
        if not match:
            continue
        g = match.groupdict()
        if b.get("error_occurred"):
            skipped.add((g["isa"], b.get("error_message", "")))
            continue
        key = (g["shape"], g["isa"], g["level"], g["threads"], int(g["m"]), g["temp"])
        rows[key] = b
    for isa, message in sorted(skipped):
        print(f"skipped: {isa}: {message}")

    groups = defaultdict(dict)
    for (shape, isa, level, threads, m, temp), b in rows.items():
        groups[(shape, isa, level, threads)].setdefault(m, {})[temp] = b

    def us(b):
        return b["us_per_call"] if "us_per_call" in b else b["real_time"]

    print()
    header = (f"{'shape/isa/level/threads':<34} {'M':>3} {'cold us':>9} {'GB/s':>6} {'roof':>5}"
              f" {'warm us':>9} {'GB/s':>6} {'roof':>5} {'cold/warm':>9}")
    print(header)
    print("-" * len(header))
    for key in sorted(groups):
        shape, isa, level, threads = key
        label = f"{shape}/{isa}/{level}/t:{threads}"
        for m in sorted(groups[key]):
            cell = groups[key][m]
            cold, warm = cell.get("cold"), cell.get("warm")

            def part(b):
                if b is None:
                    return f"{'-':>9} {'-':>6} {'-':>5}"
                return (f"{us(b):9.1f} {b.get('GB/s', 0):6.2f} "
                        f"{b.get('frac_of_read_bw', 0):5.2f}")
            ratio = f"{us(cold) / us(warm):9.2f}" if cold and warm else f"{'-':>9}"
            print(f"{label:<34} {m:>3} {part(cold)} {part(warm)} {ratio}")
            label = ""

    print()
    print("time(M) / time(M=1), cold weights:")
    for key in sorted(groups):
        shape, isa, level, threads = key
        by_m = {m: c["cold"] for m, c in groups[key].items() if "cold" in c}
        if 1 not in by_m or len(by_m) < 2:
            continue
        base = us(by_m[1])
        ratios = "  ".join(f"M={m}: {us(by_m[m]) / base:.2f}" for m in sorted(by_m) if m != 1)
        print(f"  {shape}/{isa}/{level}/t:{threads}  {ratios}")

    print()
    print("scalar / SIMD time at M=1:")
    for (shape, isa, level, threads, m, temp), b in sorted(rows.items()):
        if isa == "scalar" or m != 1:
            continue
        ref = rows.get((shape, "scalar", level, threads, m, temp))
        if ref is not None:
            print(f"  {shape}/{isa}/{level}/{temp}/t:{threads}  {us(ref) / us(b):.1f}x")

    print()
    print("Issue 3's bars (cold weights, this run's roof):")
    for what, level, threads, limit in FRACTION_BARS:
        print(f"  {what} >= {limit:.2f}:")
        for (shape, isa, lv, t, m, temp), b in sorted(rows.items()):
            if (lv, t, m, temp) != (level, threads, 1, "cold") or isa == "scalar":
                continue
            value = b.get("frac_of_read_bw")
            if value is not None:
                print(bar_line(shape + "/" + isa, value, limit, True))
    print(f"  fast M=4 / M=1 time, cold, 1 thread <= {M4_OVER_M1_LIMIT:.2f}:")
    for (shape, isa, level, threads), by_m in sorted(groups.items()):
        if level != "fast" or threads != "1":
            continue
        m1, m4 = by_m.get(1, {}).get("cold"), by_m.get(4, {}).get("cold")
        if m1 is not None and m4 is not None:
            value = us(m4) / us(m1)
            print(bar_line(shape + "/" + isa, value, M4_OVER_M1_LIMIT, False))
    print("  fast M=1 cold over read_only (the same pages read alone, same run), for reference:")
    for (shape, isa, threads), ref in sorted(read_only.items()):
        b = rows.get((shape, isa, "fast", threads, 1, "cold"))
        if b is not None and ref.get("frac_of_read_bw"):
            print(f"    {shape + '/' + isa:<20} t:{threads:<3} "
                  f"{b['frac_of_read_bw'] / ref['frac_of_read_bw']:5.2f}")


if __name__ == "__main__":
    main()
