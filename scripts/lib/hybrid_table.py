#!/usr/bin/env python3
"""A table of `qmoe run --gpu --json` results (scripts/hybrid_decode_check.sh): per run the
hybrid graph's ms per step and token, the resident layers alone, the CPU floor, the same cold
work on the CPU alone ("-" when nothing is cold), the hybrid over the CPU alone, the CPU read
roof the floor divides by (each run is its own process, and the host's bandwidth moves between
them), both ratios the offload issue's bars are stated in, and the offload's traffic per step."""
import json
import sys


def main(paths):
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                rows.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
    rows.sort(key=lambda r: (r["decode"]["batch"], r["decode"]["routing"],
                             r["decode"]["residency"]))
    print("| M | routing | resident | hybrid ms/step | ms/token | resident alone ms | "
          "CPU floor ms | CPU alone ms | / CPU alone | roof GB/s | / floor | / resident | hits | "
          "wakeups | requests | short circuits | host KB | conserved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r["decode"]
        # null at 100% residency, and absent from JSON written before the pass existed.
        alone = r.get("cpu_alone_ms_per_step")
        alone = "-" if alone is None else f"{alone:.3f}"
        over_alone = r.get("over_cpu_alone")
        over_alone = "-" if over_alone is None else f"{over_alone:.2f}"
        print(f"| {d['batch']} | {d['routing']} | {d['residency'] * 100:.0f}% | "
              f"{r['hybrid_ms_per_step']:.3f} | {r['hybrid_ms_per_token']:.3f} | "
              f"{r['resident_only_ms_per_step']:.3f} | {r['cpu_floor_ms_per_step']:.3f} | "
              f"{alone} | {over_alone} | {r['cpu_read_gbps']:.0f} | "
              f"{r['over_cpu_floor']:.2f} | {r['over_resident_only']:.3f} | "
              f"{r['resident_hit_rate'] * 100:.0f}% | {r['wakeups_per_step']:.2f} | "
              f"{r['requests_per_step']:.1f} | {r['short_circuits_per_step']:.1f} | "
              f"{r['host_bytes_per_step'] / 1024:.0f} | {r['conservation']} |")
    if rows:
        r = rows[0]
        print(f"\n{r['device']}, {r['cpu']}, {r['threads']} CPU threads; {r['model']['layers']} "
              f"layers, {r['decode']['steps']} timed steps; the roof is each run's best read "
              f"(the buffer before and after the passes, the weights' pages)")


if __name__ == "__main__":
    main(sys.argv[1:])
