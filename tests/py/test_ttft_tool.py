"""scripts/ttft.py (time to first token through the server, docs/benchmarks.md) and scripts/load.py (clients at once)
against `tern serve --demo`: prompts of the asked length that no prefix cache resumes, sane JSON reports, bad
arguments refused; `--synthetic` refused clearly where there is no GPU (it generates full-size weights on one).
"""
import json
import pathlib
import subprocess
import sys

from test_server_helpers import demo_server_fixture

ROOT = pathlib.Path(__file__).resolve().parents[2]
server = demo_server_fixture("--ctx-size", "1024")


def test_ttft_tool_reports_prompts_of_the_asked_length(server, seed):
    r = subprocess.run([sys.executable, str(ROOT / "scripts/ttft.py"), "--url", server.base, "--tokens", "300",
                        "--repeats", "3", "--warmup", "1", "--seed", str(seed), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["runs"]) == 3 and out["median_ttft_ms"] > 0 and out["prefill_tok_s"] > 0
    for run in out["runs"]:
        assert abs(run["content_tokens"] - 300) <= 3, run  # calibrated with /tokenize
        assert run["prompt_tokens"] >= run["content_tokens"]  # plus the chat template's tokens
        assert run["cached_tokens"] < 20, run  # a fresh text each time: only the template's start is resumed


def test_ttft_tool_refuses_bad_arguments():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/ttft.py"), "--tokens", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--tokens" in r.stderr


def test_synthetic_needs_a_gpu(tern_bin):
    import shutil
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        import pytest
        pytest.skip("a GPU is visible: --synthetic would load 20 GB")
    for cmd in (["serve", "--port", "0"], ["generate", "-p", "Hi", "-n", "1"], ["run"]):
        r = subprocess.run([tern_bin, *cmd, "--synthetic"], capture_output=True, text=True, timeout=60, input="")
        assert r.returncode != 0 and "--synthetic" in r.stderr and ("cuda" in r.stderr.lower()), (cmd, r.stderr)
    r = subprocess.run([tern_bin, "generate", "--synthetic", "--demo", "-p", "Hi"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "--synthetic cannot be combined" in r.stderr, r.stderr


def test_load_tool_together_and_admit(server, seed):
    # scripts/load.py: N clients at once, each with its own answer and figures; a long prompt read while others
    # decode, the gaps of the running clients meanwhile counted.
    r = subprocess.run([sys.executable, str(ROOT / "scripts/load.py"), "--url", server.base, "--seed", str(seed),
                        "--json", "together", "--clients", "3", "--prompt-tokens", "40", "--max-tokens", "12"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [c["client"] for c in out["clients"]] == [0, 1, 2] and not any(c["error"] for c in out["clients"]), out
    for c in out["clients"]:
        assert c["ttft_ms"] > 0 and 1 <= c["tokens"] <= 12, c
    assert out["aggregate_tok_s"] > 0 and out["max_ttft_ms"] >= max(c["ttft_ms"] for c in out["clients"])
    assert out["gap_ms"]["p50"] <= out["gap_ms"]["p99"] <= out["gap_ms"]["max"], out
    r = subprocess.run([sys.executable, str(ROOT / "scripts/load.py"), "--url", server.base, "--seed", str(seed),
                        "--json", "admit", "--clients", "2", "--prompt-tokens", "20", "--max-tokens", "200",
                        "--long-tokens", "600"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["long_error"] is None and out["long_ttft_ms"] > 0 and not out["errors"], out
    # The long prompt came once both clients streamed (8 tokens each), so their earlier gaps were counted.
    assert out["running_clients"] == 2 and out["gaps_before_ms"]["p50"] > 0, out
    g = out["gaps_while_reading_ms"]
    assert g["count"] == 0 or g["p50"] <= g["p99"] <= g["max"], out


def test_load_tool_refuses_bad_arguments():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/load.py"), "together", "--clients", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "must be >= 1" in r.stderr
