#!/usr/bin/env python3
"""The batched decode step under several environment settings, alternating, on a GPU: an A/B in one call.

    scripts/ab-bench.py --config base: --config max:TERN_SMEM_CARVEOUT=max [--config NAME:VAR=V,VAR=V ...]
                        [--tern build-gpu/tern] [--concurrency 1,8,16] [--rounds 2] [--length 4K]
                        [--decode-steps 64] [--repeats 1] [--json FILE]

Each round runs `tern bench --synthetic --device cuda --concurrency LIST` once per configuration, in the order given
(so that a drift of the card's clocks or temperature falls on every configuration alike), the configuration's
variables set and nothing else changed. Prints, per stream count, each configuration's aggregate tok/s in every
round, their mean and its difference from the first configuration's mean. A configuration's name comes before the
colon; `base:` sets nothing. Standard library only.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_json  # noqa: E402 (beside this script)

VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_config(text):
    """'name:VAR=V,VAR=V' -> (name, {VAR: V}); exits on a malformed one."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        sys.exit("ab-bench: --config %r: expected NAME:VAR=VALUE,... (NAME: for none)" % text)
    env = {}
    for item in filter(None, rest.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not VAR.match(var):
            sys.exit("ab-bench: --config %r: %r is not VAR=VALUE" % (text, item))
        env[var] = value
    return name, env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", default=[], help="NAME:VAR=VALUE,... (repeat; the first is the base)")
    ap.add_argument("--tern", default="build-gpu/tern")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--length", default="4K")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", help="also write every round's figures to this file")
    a = ap.parse_args()
    configs = [parse_config(c) for c in a.config]
    if len(configs) < 2:
        sys.exit("ab-bench: give at least two --config (the first is the base)")
    names = [n for n, _ in configs]
    if len(set(names)) != len(names):
        sys.exit("ab-bench: configuration names must differ")
    if a.rounds < 1:
        sys.exit("ab-bench: --rounds must be at least 1")
    runs = {n: [] for n in names}  # name -> [{streams: aggregate tok/s}] per round
    for _ in range(a.rounds):
        for name, env in configs:
            rows = bench_json.concurrency_rows(a.tern, a.length, a.concurrency, a.repeats, a.decode_steps, env,
                                               "ab-bench")
            runs[name].append({n: row["aggregate_tok_s"] for n, row in rows.items()})
    streams = sorted(runs[names[0]][0])
    mean = {name: {n: sum(r[n] for r in runs[name]) / len(runs[name]) for n in streams} for name in names}
    print("| configuration | " + " | ".join("%d streams: tok/s by round; mean (vs %s)" % (n, names[0])
                                            for n in streams) + " |")
    print("|---|" + "---:|" * len(streams))
    for name, env in configs:
        cells = []
        for n in streams:
            rounds = " / ".join("%.1f" % r[n] for r in runs[name])
            delta = 100.0 * (mean[name][n] / mean[names[0]][n] - 1.0) if mean[names[0]][n] > 0 else float("nan")
            cells.append("%s; %.1f (%+.1f%%)" % (rounds, mean[name][n], delta))
        label = name + (" (" + ", ".join("%s=%s" % kv for kv in env.items()) + ")" if env else "")
        print("| %s | %s |" % (label, " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"length": a.length, "decode_steps": a.decode_steps,
                       "configs": {n: {"env": e, "aggregate_tok_s": runs[n]} for n, e in configs}}, f, indent=2)


if __name__ == "__main__":
    main()
