#!/usr/bin/env python3
"""The CUDA decode benchmark rows as a short table: us per call and fraction of the read roof
from the first JSON (dependent launch on), us per call from the second (QMOE_CUDA_PDL=0).
   scripts/lib/cuda_bench_table.py cuda_bench.json cuda_bench_no_pdl.json"""
import json, sys
rows = {}
for i, path in enumerate(sys.argv[1:]):
    try:
        data = json.load(open(path))
    except Exception as e:
        print(f"{path}: {e}")
        continue
    if i == 0:
        print("roof GB/s", data["context"].get("hbm_read_roof_GBps"))
    for b in data["benchmarks"]:
        name = b["name"].split("/min_time")[0].split("/iterations")[0]
        if "us_per_call" in b:
            rows.setdefault(name, [None, None])[i] = (b["us_per_call"], b.get("frac_of_roof", 0))
print(f"{'row':52s} {'us':>8s} {'roof':>6s} {'us nopdl':>9s}")
for name, (pdl, nopdl) in rows.items():
    a = f"{pdl[0]:8.2f} {pdl[1]:6.3f}" if pdl else f"{'':8s} {'':6s}"
    b = f"{nopdl[0]:9.2f}" if nopdl else ""
    print(f"{name:52s} {a} {b}")
