#!/usr/bin/env python3
"""The result of scripts/int4_ab.sh: A and B side by side, as ratios within a round.

For each INT4 bar row: the median time of every round on each side, B over A per round (the two
sides of a round ran back to back on one machine), and B over A of each side's time over the
read_only row of the same shape and thread count in the same process (which takes out how fast
that process's pages were). Then the decodes: each side's ratio to its measured roof and its
checksum. Usage: benchmarks/int4_ab_compare.py OUT_DIR
"""
import glob
import json
import os
import re
import statistics
import sys


def medians(path):
    rows = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            rows[b["run_name"]] = b["real_time"]
    return rows


def over_read(rows):
    out = {}
    for name, t in rows.items():
        m = re.match(r"gemm_int4/([^/]+)/([^/]+)/[^/]+/m:\d/cold/threads:(\w+)/manual_time", name)
        if m:
            read = f"gemm_int4/{m[1]}/{m[2]}/read_only/cold/threads:{m[3]}/manual_time"
            out[name] = t / rows[read]
    return out


def short(name):
    return name.replace("gemm_int4/", "").replace("/manual_time", "").replace("/cold", "")


def main(out_dir):
    rounds = sorted({int(re.search(r"-(\d+)\.json$", f)[1])
                     for f in glob.glob(os.path.join(out_dir, "bars-a-*.json"))})
    per_round, norm_a, norm_b = {}, {}, {}
    for r in rounds:
        a = medians(os.path.join(out_dir, f"bars-a-{r}.json"))
        b = medians(os.path.join(out_dir, f"bars-b-{r}.json"))
        for name in a.keys() & b.keys():
            per_round.setdefault(name, []).append(b[name] / a[name])
        for name, v in over_read(a).items():
            norm_a.setdefault(name, []).append(v)
        for name, v in over_read(b).items():
            norm_b.setdefault(name, []).append(v)
    print(f"{len(rounds)} rounds; B/A of times per round, and of time over the process's read")
    print(f"{'row':52s} {'B/A per round':>30s} {'median':>7s} {'A/read':>7s} {'B/read':>7s} {'B/A':>6s}")
    pairs, normalised = [], []
    for name in sorted(norm_a):
        ratios = per_round[name]
        pairs += ratios
        a, b = statistics.median(norm_a[name]), statistics.median(norm_b[name])
        normalised.append(b / a)
        print(f"{short(name):52s} {' '.join(f'{x:.2f}' for x in ratios):>30s} "
              f"{statistics.median(ratios):7.3f} {a:7.3f} {b:7.3f} {b / a:6.3f}")
    reads = [x for name, v in per_round.items() if "read_only" in name for x in v]
    print(f"kernel rows: B/A per round geomean {statistics.geometric_mean(pairs):.3f} "
          f"(median {statistics.median(pairs):.3f}, {len(pairs)} pairs); over the read, geomean "
          f"{statistics.geometric_mean(normalised):.3f}")
    print(f"read_only rows alone (no kernel): B/A per round from {min(reads):.2f} to "
          f"{max(reads):.2f}, geomean {statistics.geometric_mean(reads):.3f}")
    print()
    for path in sorted(glob.glob(os.path.join(out_dir, "decode-*.json"))):
        d = json.load(open(path))
        print(f"{os.path.basename(path):24s} threads {d['threads']:2d}: "
              f"{d['timing']['ms_per_layer']:.3f} ms/layer, "
              f"ratio to roof {d['bandwidth_ratio']:.3f}, to the weights' pages "
              f"{d['weights_bandwidth_ratio']:.3f}, checksum {d['checksum']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
