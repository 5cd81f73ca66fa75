#!/usr/bin/env python3
"""Summary of one ctest run from its JUnit file (ctest --output-junit): the counts, the time, and
every skipped test with the reason it printed. Used by scripts/test.sh after each suite and by
.ci/run, which also names the tests that must have run and passed.

Usage: test_summary.py JUNIT_XML --suite NAME [--require TEST]... [--strict]

Reasons are read from each test's output: GoogleTest's "file:line: Skipped" followed by the
message, a Python test's "SKIP: ..." line, or else ctest's own note (SKIP_RETURN_CODE=77...).

Exit status 1 when the file is missing or unreadable, when it holds no test (a suite that did
not run), when a --require'd test is absent, skipped or failed, and with --strict (CI) when a
skipped test gave no reason. Failed tests are listed but left to ctest's own exit status.
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET

GTEST_SKIP = re.compile(r":\d+: Skipped\s*$")


def skip_reason(output, message):
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if GTEST_SKIP.search(line):
            reason = []
            for follow in lines[i + 1:]:
                if follow.startswith("[  SKIPPED ]") or follow.startswith("[       OK ]"):
                    break
                if follow.strip():
                    reason.append(follow.strip())
            return " ".join(reason)
    for line in lines:
        if line.startswith("SKIP:"):
            return line[len("SKIP:"):].strip()
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("junit")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--require", action="append", default=[])
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args()

    try:
        root = ET.parse(args.junit).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"{args.suite}: FAILED: no test results ({error}): the suite did not run")
        return 1
    cases = root.iter("testcase")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    total_time = 0.0
    skipped, failed, status_of = [], [], {}
    for case in cases:
        name = case.get("name", "?").split("  #")[0]
        total_time += float(case.get("time", "0") or 0)
        out = case.find("system-out")
        output = out.text if out is not None and out.text else ""
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            note = case.find("skipped")
            message = note.get("message", "") if note is not None else case.get("status", "")
            counts["skipped"] += 1
            skipped.append((name, skip_reason(output, message), message))
            status_of[name] = "skipped"
        elif case.find("failure") is not None or case.get("status") == "fail":
            counts["failed"] += 1
            failed.append(name)
            status_of[name] = "failed"
        else:
            counts["passed"] += 1
            status_of[name] = "passed"
    total = sum(counts.values())
    print(f"{args.suite}: {total} tests, {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped ({total_time:.0f} s of test time)")
    rc = 0
    if total == 0:
        print(f"{args.suite}: FAILED: no test ran")
        rc = 1
    if skipped:
        print(f"{args.suite}: skipped, with the reason each printed:")
        for name, reason, message in skipped:
            shown = reason or f"(no reason printed; ctest: {message})"
            print(f"  {name}: {shown}")
            if args.strict and not reason:
                print(f"{args.suite}: FAILED: {name} skipped without a reason")
                rc = 1
    for name in failed:
        print(f"{args.suite}: failed: {name}")
    for name in args.require:
        status = status_of.get(name, "not registered")
        if status != "passed":
            what = "failed" if status == "failed" else f"was {status}"
            print(f"{args.suite}: FAILED: {name} must run and pass here, but {what}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
