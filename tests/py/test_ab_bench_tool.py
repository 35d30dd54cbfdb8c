"""scripts/ab-bench.py (an A/B of environment settings in one GPU call): against a stand-in for `tern bench` that
writes the JSON report with an aggregate set by an environment variable and logs each run, the configurations run
alternating, round by round, each with its own variables only; the table carries every round, the mean and the
difference from the first configuration; malformed configurations and a failing bench are refused.
"""
import json
import pathlib
import subprocess
import sys

import fake_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts/ab-bench.py"

FAKE_BODY = """
speed = os.environ.get("FAKE_SPEED", "")
if speed == "crash":
    sys.stderr.write("tern: out of memory\\n")
    sys.exit(1)
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(speed + "\\n")
runs = sum(1 for _ in open(log))
factor = float(speed or "1.0")
streams = [int(n) for n in args[args.index("--concurrency") + 1].split(",")]
rows = [{"streams": n, "decode_steps": 64, "decode_ms_median": 100.0,
         "aggregate_tok_s": 100.0 * n * factor + runs} for n in streams]
json.dump({"concurrency": rows}, open(args[args.index("--json") + 1], "w"))
"""


def run(tmp_path, *args):
    env = {"PATH": "/usr/bin:/bin", "FAKE_LOG": str(tmp_path / "log")}
    return subprocess.run([sys.executable, str(TOOL), "--tern", str(fake_bench.write(tmp_path, FAKE_BODY)), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_configurations_alternate_and_the_table_compares_with_the_first(tmp_path):
    out = tmp_path / "ab.json"
    r = run(tmp_path, "--config", "base:", "--config", "fast:FAKE_SPEED=1.1", "--concurrency", "1,8",
            "--rounds", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    # Runs in order base, fast, base, fast (the log holds each run's FAKE_SPEED; base sets none).
    assert (tmp_path / "log").read_text().splitlines() == ["", "1.1", "", "1.1"]
    lines = r.stdout.splitlines()
    assert lines[2] == "| base | 101.0 / 103.0; 102.0 (+0.0%) | 801.0 / 803.0; 802.0 (+0.0%) |"
    # fast: 110 + run number 2 and 4 at one stream (mean 113: +10.8% on 102), 880 + 2 and 4 at eight (+10.1%).
    assert lines[3] == "| fast (FAKE_SPEED=1.1) | 112.0 / 114.0; 113.0 (+10.8%) | 882.0 / 884.0; 883.0 (+10.1%) |"
    kept = json.loads(out.read_text())
    assert kept["configs"]["fast"]["env"] == {"FAKE_SPEED": "1.1"}
    assert kept["configs"]["base"]["aggregate_tok_s"] == [{"1": 101.0, "8": 801.0}, {"1": 103.0, "8": 803.0}]


def test_refuses_malformed_configurations(tmp_path):
    r = run(tmp_path, "--config", "base:")
    assert r.returncode != 0 and "at least two --config" in r.stderr
    r = run(tmp_path, "--config", "base:", "--config", "nocolon")
    assert r.returncode != 0 and "expected NAME:VAR=VALUE" in r.stderr
    r = run(tmp_path, "--config", "base:", "--config", "x:1BAD=2")
    assert r.returncode != 0 and "is not VAR=VALUE" in r.stderr
    r = run(tmp_path, "--config", "a:", "--config", "a:FAKE_SPEED=2")
    assert r.returncode != 0 and "names must differ" in r.stderr


def test_reports_a_failing_bench(tmp_path):
    r = run(tmp_path, "--config", "base:", "--config", "bad:FAKE_SPEED=crash", "--concurrency", "1")
    assert r.returncode != 0 and r.stdout == ""
    assert "FAKE_SPEED=crash" in r.stderr and "failed (exit 1)" in r.stderr and "out of memory" in r.stderr
