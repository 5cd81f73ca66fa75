#!/usr/bin/env python3
"""Tables from a qmoe_bench JSON run of the gemm_int4 benchmarks (docs/benchmarks.md).

  qmoe_bench --benchmark_filter='^gemm_int4/' --benchmark_format=json \
      --benchmark_out=gemm.json --benchmark_out_format=json
  python3 benchmarks/gemm_int4_summary.py gemm.json

Per shape, ISA, level and thread count, one line per M: cold and warm us/call, cold GB/s and
fraction of the read roof, warm GB/s and fraction, and cold/warm. Then the ratios the figures
are usually read for: time(M)/time(M=1) (cold, fast and exact), and scalar/SIMD at M=1.
Only the standard library is needed.
"""

import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^gemm_int4/(?P<shape>[^/]+)/(?P<isa>[^/]+)/(?P<level>exact|fast)/"
                  r"m:(?P<m>\d+)/(?P<temp>cold|warm)/threads:(?P<threads>1|all)")


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
    skipped = set()
    for b in data["benchmarks"]:
        match = NAME.match(b["name"])
        if not match or b.get("run_type", "iteration") != "iteration":
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


if __name__ == "__main__":
    main()
