#!/usr/bin/env python3
"""What each kernel family costs a decode step in place, on a GPU: the step's time with it minus without it.

    scripts/step-costs.py [--tern build-gpu/tern] [--concurrency 1,8,16] [--parts in,gdn,...] [--repeats 2]
                          [--length 4K] [--decode-steps 64] [--json FILE]
    scripts/step-costs.py --speculative K --tern TERN [--parts ...] [--repeats 3] [--length 4K] [--json FILE]

Runs `tern bench --synthetic --device cuda --concurrency LIST` once as is and once per part with TERN_STEP_OMIT=PART
(src/cuda/common/step_omit.h: that part's kernels left out of every step; the values computed are then wrong, the
timing is what is wanted), then prints the step's ms at each stream count and each part's cost in place: ms and share
of the whole step. The kernels of a step overlap under programmatic dependent launch, so these costs need not add up
to the step (a neighbour absorbs part of a missing kernel's time), and a kernel's own duration (ncu) is larger than
its cost here. With the router left out, the MoE scratch holds a stand-in routing drawn once (k distinct experts a
token, as synthetic weights route: step_omit_routing), so gate_up and down read as many distinct experts as with it.
A part whose omission changes the values that reach the MoE router (in, out, prequant, the mixers) may change which
experts the step reads: its figure is an upper bound, not a cost (docs/benchmarks.md, thirty-first session:
prequant's 0.87 ms at 8 streams was ~0.11).
With --speculative K (a `tern` with the server, as `tern bench --speculative` needs) the same for the speculative
step: `tern bench --speculative --draft-max K` per configuration, its plain step (the one-token decode plan) and the
verify of 1 + k tokens for k = 0..K (the batched kernels over one session's tokens, its rollback included), so that a
part's cost in the verify stands beside its cost in the plain step (where the verify's overhead at 0 drafts goes);
the part `kept` (the verify's kept states) is there too. Standard library only.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_json  # noqa: E402 (beside this script)

PARTS = ["in", "gdn", "attention", "out", "router", "gate_up", "down", "head", "prequant"]
SPECULATIVE_PARTS = PARTS + ["kept"]


def bench(tern, length, concurrency, repeats, decode_steps, omit):
    """Median ms per step at each stream count, {streams: ms}, of one `tern bench` process."""
    rows = bench_json.concurrency_rows(tern, length, concurrency, repeats, decode_steps,
                                       {"TERN_STEP_OMIT": omit or None}, "step-costs")
    return {n: row["decode_ms_median"] / row["decode_steps"] for n, row in rows.items()}


def speculative_costs(a, parts):
    """The --speculative mode: per configuration the plain step's and each verify's ms, then each part's cost."""
    def point(omit):
        p = bench_json.speculative_point(a.tern, a.length, a.speculative, a.repeats, {"TERN_STEP_OMIT": omit or None},
                                         "step-costs")
        return {"plain": p["plain_ms_median"], "verify": {v["drafts"]: v["ms_median"] for v in p["verify"]}}

    base = point(None)
    without = {p: point(p) for p in parts}
    ks = sorted(base["verify"])
    print("| part left out | plain step: ms, cost ms | " +
          " | ".join("verify of %d: ms, cost ms" % (k + 1) for k in ks) + " |")
    print("|---|---:|" + "---:|" * len(ks))
    print("| none (the steps) | %.4f | %s |" % (base["plain"], " | ".join("%.4f" % base["verify"][k] for k in ks)))
    for p in parts:
        w = without[p]
        cells = ["%.4f, %.4f" % (w["plain"], base["plain"] - w["plain"])]
        cells += ["%.4f, %.4f" % (w["verify"][k], base["verify"][k] - w["verify"][k]) for k in ks]
        print("| %s | %s |" % (p, " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"length": a.length, "speculative": a.speculative, "plain_ms": base["plain"],
                       "verify_ms": base["verify"], "without": without}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tern", default="build-gpu/tern")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--parts", help="comma-separated (default: every part of the mode)")
    ap.add_argument("--length", default="4K")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--speculative", type=int, metavar="K",
                    help="the speculative step instead: the plain step and the verify of 1 + k tokens, k = 0..K")
    a = ap.parse_args()
    known = SPECULATIVE_PARTS if a.speculative is not None else PARTS
    parts = [p for p in (a.parts or ",".join(known)).split(",") if p]
    unknown = [p for p in parts if p not in known]
    if unknown:
        sys.exit("step-costs: unknown part(s) %s (parts: %s)" % (", ".join(unknown), ", ".join(known)))
    if a.speculative is not None:
        if not 0 <= a.speculative <= 8:
            sys.exit("step-costs: --speculative takes 0 to 8 drafts")
        return speculative_costs(a, parts)
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
