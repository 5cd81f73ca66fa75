#!/usr/bin/env python3
"""Where a kernel's warps stall, instruction by instruction, from Nsight Compute's source page.

Input: the CSV of `ncu -i REPORT --page source --print-source sass --csv` for one kernel profiled
with the SourceCounters section (its first line names the kernel, its second is the header).
Output, as text:
  - the kernel, its stall samples and instructions executed;
  - the samples by stall reason (the "stall_*" columns, not their "(Not Issued)" twins),
    largest first, with their share;
  - with --split OFFSET,...: the instructions and samples between consecutive offsets (hex,
    from the kernel's first instruction; a region holds [start, next start), the last one runs
    to the end), e.g. the consumer loop, the epilogue and the producer loop;
  - the --top instructions by samples: offset, times executed, samples, the two largest
    reasons, the SASS.

Usage: ncu_source_stalls.py SOURCE_CSV [--top N] [--split 0,e90,1850]
"""

import argparse
import csv
import sys

ALL_SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(path):
    """(kernel name, [(offset, sass, executed, samples, {reason: samples})])."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if len(lines) < 3 or lines[1][:2] != ["Address", "Source"]:
        raise ValueError(f"{path}: not an ncu source-page CSV (Address, Source, ...)")
    kernel = lines[0][1] if len(lines[0]) > 1 else "?"
    header = lines[1]
    column = {name: i for i, name in enumerate(header)}
    for needed in (ALL_SAMPLES, EXECUTED):
        if needed not in column:
            raise ValueError(f"{path}: no '{needed}' column (profile with SourceCounters)")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    rows = []
    first = None
    for line in lines[2:]:
        if len(line) < len(header) or not line[0].startswith("0x"):
            continue
        address = int(line[0], 16)
        first = address if first is None else first
        number = lambda name: int(line[column[name]] or 0)
        rows.append((address - first, line[1].strip(), number(EXECUTED), number(ALL_SAMPLES),
                     {r: number(r) for r in reasons}))
    return kernel, rows


def report(kernel, rows, top, split):
    out = [f"kernel: {kernel}"]
    samples = sum(r[3] for r in rows)
    out.append(f"samples {samples}, instructions executed {sum(r[2] for r in rows)}")
    by_reason = {}
    for r in rows:
        for reason, n in r[4].items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    out.append("stall reasons:")
    for reason, n in sorted(by_reason.items(), key=lambda x: (-x[1], x[0])):
        if n:
            out.append(f"  {reason[len('stall_'):]:20s} {n:8d} {100.0 * n / samples:5.1f}%")
    if split:
        out.append("regions:")
        for i, start in enumerate(split):
            end = split[i + 1] if i + 1 < len(split) else None
            inside = [r for r in rows if r[0] >= start and (end is None or r[0] < end)]
            n = sum(r[3] for r in inside)
            span = f"{start:x}-{end:x}" if end is not None else f"{start:x}-end"
            out.append(f"  {span:12s} instructions {sum(r[2] for r in inside):10d} "
                       f"samples {n:7d} {100.0 * n / samples if samples else 0.0:5.1f}%")
    out.append(f"top {top} instructions by samples:")
    for r in sorted(rows, key=lambda x: (-x[3], x[0]))[:top]:
        worst = sorted(((n, reason) for reason, n in r[4].items() if n), reverse=True)[:2]
        why = " ".join(f"{reason[len('stall_'):]}={n}" for n, reason in worst)
        out.append(f"  {r[0]:6x} {r[2]:10d} {r[3]:6d}  {r[1]}  [{why}]")
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--split", default="", help="hex offsets, comma-separated, increasing")
    args = parser.parse_args(argv)
    try:
        split = [int(s, 16) for s in args.split.split(",") if s]
        if split != sorted(set(split)):
            raise ValueError("--split offsets must increase")
        kernel, rows = read_rows(args.csv)
    except (OSError, ValueError) as e:
        print(f"ncu_source_stalls: {e}", file=sys.stderr)
        return 2
    print("\n".join(report(kernel, rows, args.top, split)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
