"""scripts/gpu-verify (one device call that verifies a tree: docs/benchmarks.md): what it refuses before it starts
anything (unknown steps or arguments, a deadline that is not seconds), and that without a GPU it stops before the
build with the reason in its summary, rather than reporting steps it could not run.
"""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts/gpu-verify"


def run(*args, out):
    return subprocess.run(["bash", str(TOOL), "--out", str(out), *args], capture_output=True, text=True, timeout=120)


def test_refuses_unknown_steps_and_arguments(tmp_path):
    r = run("--steps", "suite,speedd", out=tmp_path)
    assert r.returncode == 2 and "unknown step speedd" in r.stderr
    r = run("--fast", out=tmp_path)
    assert r.returncode == 2 and "unknown argument --fast" in r.stderr
    r = run("--deadline", "soon", out=tmp_path)
    assert r.returncode == 2 and "--deadline needs seconds" in r.stderr
    # every step the help lists is known (refused only later, for want of a GPU, if none is visible)
    r = run("--steps", "suite,fidelity,scan,speed,concurrency,server,speculative", "--deadline", "0", out=tmp_path)
    assert r.returncode != 2 and "unknown step" not in r.stderr


def test_without_a_gpu_it_stops_before_the_build(tmp_path):
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is visible: the build would run")
    r = run("--steps", "suite", out=tmp_path)
    assert r.returncode == 1
    summary = (tmp_path / "summary.txt").read_text()
    assert "no NVIDIA GPU visible" in summary and "build" not in summary and "suite:" not in summary
