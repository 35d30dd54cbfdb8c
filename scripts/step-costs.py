#!/usr/bin/env python3
"""What each kernel family costs a decode step in place, on a GPU: the step's time with it minus without it.

    scripts/step-costs.py [--tern build-gpu/tern] [--concurrency 1,8,16] [--parts in,gdn,...] [--repeats 2]
                          [--length 4K] [--decode-steps 64] [--live-routing] [--json FILE]
    scripts/step-costs.py --speculative K --tern TERN [--parts ...] [--repeats 3] [--length 4K] [--live-routing]
                          [--json FILE]

Runs `tern bench --synthetic --device cuda --concurrency LIST` once as is and once per part with TERN_STEP_OMIT=PART
(src/cuda/common/step_omit.h: that part's kernels left out of every step; the values computed are then wrong, the
timing is what is wanted), then prints the step's ms at each stream count and each part's cost in place: ms and share
of the whole step. The kernels of a step overlap under programmatic dependent launch, so these costs need not add up
to the step (a neighbour absorbs part of a missing kernel's time), and a kernel's own duration (ncu) is larger than
its cost here. With the router left out, the MoE scratch holds a stand-in routing drawn once (k distinct experts a
token, as synthetic weights route: step_omit_routing), so gate_up and down read as many distinct experts as with it.

Every part but the router changes the values that reach the router when it is left out (the LM head's logits stay
as they were, so every stream samples the same token again; the products, the mixers and the experts change the
hidden state), and the router then changes which experts the step reads: at 16 streams the LM head "cost" 0.45 to
0.58 ms that way and 0.18 to 0.24 ms with the routing fixed (H200 and H100 runs, docs/benchmarks.md, thirty-seventh
and thirty-eighth sessions; the thirty-first session's prequant: 0.87 ms at 8 streams, ~0.11). So by default each part but the router is measured with the routing fixed:
its cost is the step with the router left out minus the step with the router and the part left out, and the router's
is the whole step minus the step without it (the table shows both references). --live-routing measures every part
against the whole step, as before.
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


def omissions(parts, live_routing):
    """Per part, (what TERN_STEP_OMIT leaves out, the reference it is measured against: None for the whole step,
    "router" for the step with the routing fixed)."""
    if live_routing:
        return {p: (p, None) for p in parts}
    return {p: (p, None) if p == "router" else ("router," + p, "router") for p in parts}


def measure(parts, live_routing, run):
    """run(omit) for the whole step, the reference with the routing fixed (when a part needs it) and each part:
    (plan, {reference: figures}, {part: figures without it}); the router's run is the reference's, not repeated."""
    plan = omissions(parts, live_routing)
    refs = {None: run(None)}
    if any(ref for _, ref in plan.values()):
        refs["router"] = run("router")
    without = {p: (refs["router"] if omit == "router" and "router" in refs else run(omit))
               for p, (omit, _) in plan.items()}
    return plan, refs, without


def speculative_costs(a, parts):
    """The --speculative mode: per configuration the plain step's and each verify's ms, then each part's cost."""
    def point(omit):
        p = bench_json.speculative_point(a.tern, a.length, a.speculative, a.repeats, {"TERN_STEP_OMIT": omit or None},
                                         "step-costs")
        return {"plain": p["plain_ms_median"], "verify": {v["drafts"]: v["ms_median"] for v in p["verify"]}}

    plan, refs, without = measure(parts, a.live_routing, point)
    base = refs[None]
    ks = sorted(base["verify"])
    print("| part left out | plain step: ms, cost ms | " +
          " | ".join("verify of %d: ms, cost ms" % (k + 1) for k in ks) + " |")
    print("|---|---:|" + "---:|" * len(ks))
    print("| none (the steps) | %.4f | %s |" % (base["plain"], " | ".join("%.4f" % base["verify"][k] for k in ks)))
    if "router" in refs:
        r = refs["router"]
        print("| router (the reference of the parts below: the routing fixed) | %.4f | %s |" %
              (r["plain"], " | ".join("%.4f" % r["verify"][k] for k in ks)))
    for p in parts:
        w, ref = without[p], refs[plan[p][1]]
        cells = ["%.4f, %.4f" % (w["plain"], ref["plain"] - w["plain"])]
        cells += ["%.4f, %.4f" % (w["verify"][k], ref["verify"][k] - w["verify"][k]) for k in ks]
        print("| %s | %s |" % (p, " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"length": a.length, "speculative": a.speculative, "plain_ms": base["plain"],
                       "verify_ms": base["verify"], "routing_fixed": not a.live_routing,
                       "router_omitted": refs.get("router"), "without": without}, f, indent=2)


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
    ap.add_argument("--live-routing", action="store_true",
                    help="measure every part against the whole step (the router choosing from the changed values)")
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
    plan, refs, without = measure(parts, a.live_routing,
                                  lambda omit: bench(a.tern, a.length, a.concurrency, a.repeats, a.decode_steps, omit))
    base = refs[None]
    streams = sorted(base)
    print("| part left out | " + " | ".join("%d streams: ms/step, cost ms (share)" % n for n in streams) + " |")
    print("|---|" + "---:|" * len(streams))
    print("| none (the step) | " + " | ".join("%.4f" % base[n] for n in streams) + " |")
    if "router" in refs:
        print("| router (the reference of the parts below: the routing fixed) | " +
              " | ".join("%.4f" % refs["router"][n] for n in streams) + " |")
    for p in parts:
        ref, cells = refs[plan[p][1]], []
        for n in streams:
            cost = ref[n] - without[p][n]
            cells.append("%.4f, %.4f (%.1f%%)" % (without[p][n], cost, 100.0 * cost / base[n]))
        print("| %s | %s |" % (p, " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"length": a.length, "decode_steps": a.decode_steps, "step_ms": base,
                       "routing_fixed": not a.live_routing, "router_omitted_ms": refs.get("router"),
                       "without_ms": without}, f, indent=2)


if __name__ == "__main__":
    main()
