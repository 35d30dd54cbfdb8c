#!/usr/bin/env python3
"""Each failed test of a GoogleTest log, with what reproduces and explains it: its `[seed]` lines (the tests draw
fresh seeds; TERN_TEST_SEED replays one) and the first lines of each failure. For summaries that travel where the
whole log does not (scripts/gpu-verify: a device call brings back a few files).

    scripts/gtest_failures.py LOG [--tests 3] [--lines 6]

Prints `NAME: LINE` for each kept line, in the log's order; nothing when no test failed. Standard library only.
"""
import argparse
import re
import sys

RUN = re.compile(r"^\[ RUN      \] (\S+)")
FAILED = re.compile(r"^\[  FAILED  \] (\S+) \(\d+ ms\)")


def failures(lines, most_tests=3, context=6):
    """[(test, [kept lines])] for the first most_tests failed tests, in the order they ran."""
    failed = []
    for line in lines:
        m = FAILED.match(line)
        if m and m.group(1) not in failed:
            failed.append(m.group(1))
    wanted = set(failed[:most_tests])
    out, current, kept, left = [], None, [], 0
    for line in lines:
        m = RUN.match(line)
        if m:
            current, kept, left = (m.group(1) if m.group(1) in wanted else None), [], 0
            continue
        if current is None:
            continue
        if FAILED.match(line):
            out.append((current, kept))
            current = None
            continue
        if line.startswith("[seed]"):
            kept.append(line)
        elif "Failure" in line:
            left = context
        if left > 0:
            kept.append(line)
            left -= 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--tests", type=int, default=3, help="the first N failed tests (default 3)")
    ap.add_argument("--lines", type=int, default=6, help="lines from each failure on (default 6)")
    a = ap.parse_args()
    try:
        with open(a.log, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit("gtest_failures: %s" % e)
    for test, kept in failures(lines, a.tests, a.lines):
        for line in kept:
            print("%s: %s" % (test, line.strip()))


if __name__ == "__main__":
    main()
