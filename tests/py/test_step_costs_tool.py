"""scripts/step-costs.py (each kernel family's cost in place, docs/benchmarks.md): against a stand-in for `tern bench`
that writes the JSON report with step times set by TERN_STEP_OMIT, the table it prints and the JSON it keeps carry
each part's cost (the step without it subtracted from the step); unknown parts and a failing bench are reported.
"""
import json
import pathlib
import subprocess
import sys

import fake_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts/step-costs.py"

# ms per step at 1 / 8 streams: the whole step, and what leaving out each part takes off it.
STEP = {1: 1.7, 8: 3.6}
SAVED = {"gdn": {1: 0.15, 8: 0.5}, "down": {1: 0.2, 8: 0.7}}

FAKE_BODY = """
omit = os.environ.get("TERN_STEP_OMIT", "")
if omit == "attention":
    sys.stderr.write("tern: out of memory\\n")
    sys.exit(1)
step, saved = {step}, {saved}
steps = int(args[args.index("--decode-steps") + 1])
streams = [int(n) for n in args[args.index("--concurrency") + 1].split(",")]
rows = [{{"streams": n, "decode_steps": steps,
          "decode_ms_median": steps * (step[n] - saved.get(omit, {{}}).get(n, 0.0))}} for n in streams]
json.dump({{"concurrency": rows}}, open(args[args.index("--json") + 1], "w"))
"""


def fake_tern(tmp_path):
    return fake_bench.write(tmp_path, FAKE_BODY.format(step=repr(STEP),
                                                       saved=repr({p: dict(v) for p, v in SAVED.items()})))


def test_each_part_costs_what_leaving_it_out_saves(tmp_path):
    out = tmp_path / "costs.json"
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--concurrency", "1,8",
                        "--parts", "gdn,down", "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2] == "| none (the step) | 1.7000 | 3.6000 |"
    assert lines[3] == "| gdn | 1.5500, 0.1500 (8.8%) | 3.1000, 0.5000 (13.9%) |"
    assert lines[4] == "| down | 1.5000, 0.2000 (11.8%) | 2.9000, 0.7000 (19.4%) |"
    kept = json.loads(out.read_text())
    assert kept["step_ms"] == {"1": 1.7, "8": 3.6}
    assert abs(kept["without_ms"]["down"]["8"] - 2.9) < 1e-9


def test_refuses_an_unknown_part(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--parts", "gdn,moe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown part(s) moe" in r.stderr


def test_reports_a_failing_bench(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_tern(tmp_path)), "--concurrency", "1",
                        "--parts", "attention"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "TERN_STEP_OMIT" not in r.stdout
    assert "failed (exit 1)" in r.stderr and "out of memory" in r.stderr
