#!/usr/bin/env python3
"""benchmarks/ncu_source_stalls.py on a hand-written Nsight Compute source-page CSV.

Why: the results files quote its shares (which stall, which region of the kernel), so a
plausible mistake must change a line:
  - every stall column has a "(Not Issued)" twin with other numbers: counting those shows;
  - addresses are absolute and the regions are offsets from the first instruction: using the
    address shows;
  - an instruction sits exactly on a region boundary (offset 0x20): it belongs to the region
    that starts there, not the one that ends there;
  - two instructions tie on samples: the lower offset comes first;
  - a line that is not an instruction (no 0x address) is skipped;
  - a CSV without the SourceCounters columns is refused with status 2.

Usage: ncu_source_stalls_test.py path/to/ncu_source_stalls.py
Exit status: 0 pass, 1 failure (the missing and unexpected lines printed).
"""

import os
import subprocess
import sys
import tempfile

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
          "stall_long_sb", "stall_wait", "stall_barrier",
          "stall_long_sb (Not Issued)", "stall_wait (Not Issued)", "stall_barrier (Not Issued)"]

# (address, sass, all samples, executed, long_sb, wait, barrier); the not-issued twins get
# 1000 + the value, so counting them would change every share.
ROWS = [
    ("0x7f0000001000", "S2R R0, SR_TID.X", 2, 100, 0, 2, 0),
    ("0x7f0000001010", "LDS R1, [R0]", 10, 400, 0, 10, 0),
    ("0x7f0000001020", "@!P0 BRA 0x7f0000001010", 30, 400, 30, 0, 0),
    ("0x7f0000001030", "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR8], R24", 10, 400, 0, 4, 6),
    ("0x7f0000001040", "EXIT", 8, 100, 0, 0, 8),
]

EXPECTED = """kernel: void kernel<4>(Params)
samples 60, instructions executed 1400
stall reasons:
  long_sb                    30  50.0%
  wait                       16  26.7%
  barrier                    14  23.3%
regions:
  0-20         instructions        500 samples      12  20.0%
  20-40        instructions        800 samples      40  66.7%
  40-end       instructions        100 samples       8  13.3%
top 3 instructions by samples:
      20        400     30  @!P0 BRA 0x7f0000001010  [long_sb=30]
      10        400     10  LDS R1, [R0]  [wait=10]
      30        400     10  HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR8], R24  [barrier=6 wait=4]
""".splitlines()


def csv_text(rows, header):
    def q(cells):
        return ",".join(f'"{c}"' for c in cells)
    lines = [q(["Kernel Name", "void kernel<4>(Params)"]), q(header)]
    for address, sass, samples, executed, long_sb, wait, barrier in rows:
        values = [long_sb, wait, barrier]
        lines.append(q([address, "      " + sass, samples, samples // 2, executed] + values +
                       [1000 + v for v in values]))
    lines.append(q(["", "(a summary line, not an instruction)"] + [""] * (len(header) - 2)))
    return "\n".join(lines) + "\n"


def run(script, path, *args):
    return subprocess.run([sys.executable, script, path] + list(args), capture_output=True,
                          text=True)


def main():
    script = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "source.csv")
        with open(good, "w") as f:
            f.write(csv_text(ROWS, HEADER))
        result = run(script, good, "--top", "3", "--split", "0,20,40")
        got = result.stdout.splitlines()
        if result.returncode != 0 or got != EXPECTED:
            failures += 1
            print(f"status {result.returncode}; stderr: {result.stderr}")
            for line in EXPECTED:
                if line not in got:
                    print(f"missing:    {line}")
            for line in got:
                if line not in EXPECTED:
                    print(f"unexpected: {line}")
            if set(got) == set(EXPECTED):
                print("the lines are right but their order is not")

        bare = os.path.join(tmp, "no_counters.csv")
        with open(bare, "w") as f:
            f.write(csv_text(ROWS, HEADER[:2] + ["Something Else"] + HEADER[3:]))
        result = run(script, bare)
        if result.returncode != 2 or "SourceCounters" not in result.stderr:
            failures += 1
            print(f"a CSV without the sample column: status {result.returncode}, "
                  f"stderr {result.stderr!r} (want 2 and a message naming SourceCounters)")
    print("PASS" if failures == 0 else f"FAIL ({failures})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
