"""scripts/step-costs.py (each kernel family's cost in place, docs/benchmarks.md): against a stand-in for `tern bench`
that writes the JSON report with step times set by TERN_STEP_OMIT, the table it prints and the JSON it keeps carry
each part's cost (the step without it subtracted from its reference: by default the step with the routing fixed, the
router left out, for every part but the router; with --live-routing the whole step), for the batched step
(--concurrency) and for the speculative step (--speculative: the plain step and each verify); a part whose omission
changes the routing (the stand-in's LM head) costs only its own time with the routing fixed; unknown parts and a
failing bench are reported.
"""
import json
import pathlib
import subprocess
import sys

import fake_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts/step-costs.py"

# ms per step at 1 / 8 streams: the whole step, and what leaving out each part takes off it (the parts left out
# together: the sum). Leaving out the LM head while the router runs also takes ROUTED_AWAY off the step (the stand-in
# for the experts the step no longer reads once every stream samples the same token again).
STEP = {1: 1.7, 8: 3.6}
SAVED = {"gdn": {1: 0.15, 8: 0.5}, "down": {1: 0.2, 8: 0.7}, "router": {1: 0.1, 8: 0.3}, "head": {1: 0.05, 8: 0.2}}
ROUTED_AWAY = {1: 0.0, 8: 0.4}

FAKE_BODY = """
omit = [p for p in os.environ.get("TERN_STEP_OMIT", "").split(",") if p]
if "attention" in omit:
    sys.stderr.write("tern: out of memory\\n")
    sys.exit(1)
step, saved, routed_away = {step}, {saved}, {routed_away}
steps = int(args[args.index("--decode-steps") + 1])
streams = [int(n) for n in args[args.index("--concurrency") + 1].split(",")]
def ms(n):
    v = step[n] - sum(saved.get(p, {{}}).get(n, 0.0) for p in omit)
    return v - (routed_away[n] if "head" in omit and "router" not in omit else 0.0)
rows = [{{"streams": n, "decode_steps": steps, "decode_ms_median": steps * ms(n)}} for n in streams]
json.dump({{"concurrency": rows}}, open(args[args.index("--json") + 1], "w"))
"""


def fake_tern(tmp_path):
    return fake_bench.write(tmp_path, FAKE_BODY.format(step=repr(STEP),
                                                       saved=repr({p: dict(v) for p, v in SAVED.items()}),
                                                       routed_away=repr(ROUTED_AWAY)))


def test_each_part_costs_what_leaving_it_out_saves(tmp_path):
    out = tmp_path / "costs.json"
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--concurrency", "1,8",
                        "--parts", "gdn,down,router", "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2] == "| none (the step) | 1.7000 | 3.6000 |"
    assert lines[3] == "| router (the reference of the parts below: the routing fixed) | 1.6000 | 3.3000 |"
    assert lines[4] == "| gdn | 1.4500, 0.1500 (8.8%) | 2.8000, 0.5000 (13.9%) |"
    assert lines[5] == "| down | 1.4000, 0.2000 (11.8%) | 2.6000, 0.7000 (19.4%) |"
    assert lines[6] == "| router | 1.6000, 0.1000 (5.9%) | 3.3000, 0.3000 (8.3%) |"
    kept = json.loads(out.read_text())
    assert kept["step_ms"] == {"1": 1.7, "8": 3.6} and kept["routing_fixed"] is True
    assert abs(kept["router_omitted_ms"]["8"] - 3.3) < 1e-9
    assert abs(kept["without_ms"]["down"]["8"] - 2.6) < 1e-9


def test_the_routing_fixed_keeps_a_changed_routing_out_of_a_parts_cost(tmp_path):
    tern = str(fake_tern(tmp_path))
    r = subprocess.run([sys.executable, str(TOOL), "--tern", tern, "--concurrency", "1,8", "--parts", "head"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[4] == "| head | 1.5500, 0.0500 (2.9%) | 3.1000, 0.2000 (5.6%) |"
    # --live-routing: against the whole step, the experts no longer read counted as the head's (0.2 + 0.4 at 8)
    r = subprocess.run([sys.executable, str(TOOL), "--tern", tern, "--concurrency", "1,8", "--parts", "head",
                        "--live-routing"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not any(line.startswith("| router (the reference") for line in lines)
    assert lines[3] == "| head | 1.6500, 0.0500 (2.9%) | 3.0000, 0.6000 (16.7%) |"


def test_refuses_an_unknown_part(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--parts", "gdn,moe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown part(s) moe" in r.stderr


def test_reports_a_failing_bench(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--concurrency", "1",
                        "--parts", "attention"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "TERN_STEP_OMIT" not in r.stdout
    assert "failed (exit 1)" in r.stderr and "out of memory" in r.stderr


# The speculative step: the plain step's ms and the verify's ms for 1 + k tokens, and what each part takes off them.
PLAIN, VERIFY = 1.8, {0: 2.05, 1: 2.3, 2: 2.5}
SPEC_SAVED = {"gdn": (0.15, {0: 0.2, 1: 0.25, 2: 0.3}), "kept": (0.0, {0: 0.01, 1: 0.04, 2: 0.07}),
              "router": (0.1, {0: 0.1, 1: 0.1, 2: 0.1})}

SPEC_BODY = """
assert "--speculative" in args and "--concurrency" not in args, args
omit = [p for p in os.environ.get("TERN_STEP_OMIT", "").split(",") if p]
plain, verify, saved = {plain}, {verify}, {saved}
k_max = int(args[args.index("--draft-max") + 1])
p_saved = sum(saved.get(p, (0.0, {{}}))[0] for p in omit)
rows = [{{"drafts": k, "ms_median": verify[k] - sum(saved.get(p, (0.0, {{}}))[1].get(k, 0.0) for p in omit)}}
        for k in range(k_max + 1)]
json.dump({{"points": [{{"plain_ms_median": plain - p_saved, "verify": rows}}]}},
          open(args[args.index("--json") + 1], "w"))
"""


def test_speculative_mode_costs_each_part_in_the_plain_step_and_every_verify(tmp_path):
    tern = fake_bench.write(tmp_path, SPEC_BODY.format(plain=repr(PLAIN), verify=repr(VERIFY), saved=repr(SPEC_SAVED)))
    out = tmp_path / "spec.json"
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(tern), "--speculative", "2", "--parts", "gdn,kept",
                        "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| part left out | plain step: ms, cost ms | verify of 1: ms, cost ms |")
    assert lines[2] == "| none (the steps) | 1.8000 | 2.0500 | 2.3000 | 2.5000 |"
    assert lines[3] == ("| router (the reference of the parts below: the routing fixed) | 1.7000 | 1.9500 | 2.2000 | "
                        "2.4000 |")
    assert lines[4] == "| gdn | 1.5500, 0.1500 | 1.7500, 0.2000 | 1.9500, 0.2500 | 2.1000, 0.3000 |"
    assert lines[5] == "| kept | 1.7000, 0.0000 | 1.9400, 0.0100 | 2.1600, 0.0400 | 2.3300, 0.0700 |"
    kept = json.loads(out.read_text())
    assert kept["speculative"] == 2 and abs(kept["plain_ms"] - 1.8) < 1e-9
    assert abs(kept["without"]["gdn"]["verify"]["2"] - 2.1) < 1e-9


def test_kept_is_a_part_of_the_speculative_step_only(tmp_path):
    tern = fake_bench.write(tmp_path, SPEC_BODY.format(plain=repr(PLAIN), verify=repr(VERIFY), saved=repr(SPEC_SAVED)))
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(tern), "--parts", "kept"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "unknown part(s) kept" in r.stderr
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(tern), "--speculative", "9"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "0 to 8 drafts" in r.stderr
