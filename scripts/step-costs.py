#!/usr/bin/env python3
"""What each kernel family costs a decode step in place, on a GPU: the step's time with it minus without it.

    scripts/step-costs.py [--tern build-gpu/tern] [--concurrency 1,8,16] [--parts in,gdn,...] [--repeats 2]
                          [--length 4K] [--decode-steps 64] [--json FILE]

Runs `tern bench --synthetic --device cuda --concurrency LIST` once as is and once per part with TERN_STEP_OMIT=PART
(src/cuda/common/step_omit.h: that part's kernels left out of every step; the values computed are then wrong, the
timing is what is wanted), then prints the step's ms at each stream count and each part's cost in place: ms and share
of the whole step. The kernels of a step overlap under programmatic dependent launch, so these costs need not add up
to the step (a neighbour absorbs part of a missing kernel's time), and a kernel's own duration (ncu) is larger than
its cost here. With the router left out, the MoE scratch holds a stand-in routing drawn once (k distinct experts a
token, as synthetic weights route: step_omit_routing), so gate_up and down read as many distinct experts as with it.
A part whose omission changes the values that reach the MoE router (in, out, prequant, the mixers) may change which
experts the step reads: its figure is an upper bound, not a cost (docs/benchmarks.md, thirty-first session:
prequant's 0.87 ms at 8 streams was ~0.11). Standard library only.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_json  # noqa: E402 (beside this script)

PARTS = ["in", "gdn", "attention", "out", "router", "gate_up", "down", "head", "prequant"]


def bench(tern, length, concurrency, repeats, decode_steps, omit):
    """Median ms per step at each stream count, {streams: ms}, of one `tern bench` process."""
    rows = bench_json.concurrency_rows(tern, length, concurrency, repeats, decode_steps,
                                       {"TERN_STEP_OMIT": omit or None}, "step-costs")
    return {n: row["decode_ms_median"] / row["decode_steps"] for n, row in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tern", default="build-gpu/tern")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--length", default="4K")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        sys.exit("step-costs: unknown part(s) %s (parts: %s)" % (", ".join(unknown), ", ".join(PARTS)))
    base = bench(a.tern, a.length, a.concurrency, a.repeats, a.decode_steps, None)
    streams = sorted(base)
    without = {p: bench(a.tern, a.length, a.concurrency, a.repeats, a.decode_steps, p) for p in parts}
    print("| part left out | " + " | ".join("%d streams: ms/step, cost ms (share)" % n for n in streams) + " |")
    print("|---|" + "---:|" * len(streams))
    print("| none (the step) | " + " | ".join("%.4f" % base[n] for n in streams) + " |")
    for p in parts:
        cells = []
        for n in streams:
            cost = base[n] - without[p][n]
            cells.append("%.4f, %.4f (%.1f%%)" % (without[p][n], cost, 100.0 * cost / base[n]))
        print("| %s | %s |" % (p, " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"length": a.length, "decode_steps": a.decode_steps, "step_ms": base, "without_ms": without},
                      f, indent=2)


if __name__ == "__main__":
    main()
