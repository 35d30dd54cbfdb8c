"""scripts/gtest_failures.py: each failed test's seeds and the first lines of its failures, from a GoogleTest log,
for gpu-verify's summary; passing tests and the log's closing list of failures add nothing."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "scripts/gtest_failures.py"

LOG = """\
[ RUN      ] CudaA.Passes
[seed] CudaA: 11
[       OK ] CudaA.Passes (5 ms)
[ RUN      ] CudaB.Fails
[seed] CudaB.first: 22
[seed] CudaB.second: 33
noise before the failure
/src/b_test.cpp:10: Failure
Expected: rms <= 0.01
  actual: 0.5
case T=7
more
[  FAILED  ] CudaB.Fails (139 ms)
[ RUN      ] CudaC.FailsTwice
/src/c_test.cpp:1: Failure
one
/src/c_test.cpp:2: Failure
two
[  FAILED  ] CudaC.FailsTwice (1 ms)
[ RUN      ] CudaD.Fails
/src/d_test.cpp:1: Failure
[  FAILED  ] CudaD.Fails (2 ms)
[==========] 4 tests ran.
[  FAILED  ] 3 tests, listed below:
[  FAILED  ] CudaB.Fails
[  FAILED  ] CudaC.FailsTwice
[  FAILED  ] CudaD.Fails
"""


def run(tmp_path, *args, text=LOG):
    log = tmp_path / "test_cuda.log"
    log.write_text(text)
    r = subprocess.run([sys.executable, str(TOOL), str(log), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_seeds_and_failures_of_each_failed_test(tmp_path):
    out = run(tmp_path, "--lines", "3")
    assert out == [
        "CudaB.Fails: [seed] CudaB.first: 22",
        "CudaB.Fails: [seed] CudaB.second: 33",
        "CudaB.Fails: /src/b_test.cpp:10: Failure",
        "CudaB.Fails: Expected: rms <= 0.01",
        "CudaB.Fails: actual: 0.5",
        "CudaC.FailsTwice: /src/c_test.cpp:1: Failure",
        "CudaC.FailsTwice: one",
        "CudaC.FailsTwice: /src/c_test.cpp:2: Failure",
        "CudaC.FailsTwice: two",
        "CudaD.Fails: /src/d_test.cpp:1: Failure",
    ]
    assert not any("CudaA" in line or "noise" in line for line in out)


def test_at_most_the_first_failed_tests(tmp_path):
    out = run(tmp_path, "--tests", "1")
    assert out and all(line.startswith("CudaB.Fails: ") for line in out)


def test_nothing_when_every_test_passed(tmp_path):
    assert run(tmp_path, text="[ RUN      ] A.B\n[seed] A: 1\n[       OK ] A.B (1 ms)\n") == []


def test_an_unreadable_log_is_an_error(tmp_path):
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "missing.log")], capture_output=True, text=True)
    assert r.returncode != 0 and "gtest_failures" in r.stderr
