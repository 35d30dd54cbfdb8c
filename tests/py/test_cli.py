import json
import subprocess


def test_version_lists_backends(tern_bin):
    out = subprocess.run([tern_bin, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("tern ") and "backends: cpu" in out


def test_unknown_subcommand_fails_cleanly(tern_bin):
    r = subprocess.run([tern_bin, "no-such-command"], capture_output=True, text=True)
    assert r.returncode != 0 and r.returncode < 128


# --- Usage errors exit 2 everywhere; bench --demo fits the demo's context; generate -q; sampling flags checked ---

def run_tern(tern_bin, *args, timeout=300):
    import os
    env = dict(os.environ)
    env.setdefault("TERN_THREADS", "2")
    return subprocess.run([tern_bin, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_usage_errors_exit_2(tern_bin):
    cases = [
        (["serve", "--no-such-flag"], "--no-such-flag"),
        (["generate", "--bogus"], "--bogus"),
        (["serve", "--port", "abc"], "--port"),
        (["serve", "--port", "70000"], "--port"),
        (["generate", "--demo", "-p"], "-p"),  # a missing value
        (["bench", "--repeats", "0"], "--repeats"),
        (["bench", "--demo", "--device", "tpu"], "--device"),
        (["inspect", "-m", "/nonexistent", "--no-such-flag"], "--no-such-flag"),
        (["inspect"], "--model"),  # a missing required option
        (["serve", "--demo", "--alias", ""], "--alias"),
        (["generate", "--demo", "-n", "5"], "exactly one of"),  # no prompt
        (["generate", "--demo", "-p", "x", "--system", "s"], "--chat"),
        (["generate", "--demo", "-p", "x", "-n", "-3"], "--max-tokens"),
        (["run", "--demo", "-n", "0"], "--max-tokens"),
        (["bench", "--demo", "--lengths", "32K"], "positions"),  # 32K + 32 decode steps > the demo's 32768
        (["serve", "--demo", "--port", "0", "--ctx-size", "999999"], "--ctx-size"),
    ]
    for args, word in cases:
        r = run_tern(tern_bin, *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
        assert word in r.stderr, (args, r.stderr[-2000:])
    assert run_tern(tern_bin, "--help").returncode == 0
    assert run_tern(tern_bin, "serve", "--help").returncode == 0


def test_sampling_flags_validated_like_the_api(tern_bin):
    bad = [("--temperature", "-1"), ("--temperature", "nan"), ("--temperature", "2.5"), ("--temperature", "inf"),
           ("--top-p", "0"), ("--top-p", "1.5"), ("--top-p", "NaN"), ("--min-p", "-0.1"), ("--top-k", "-2"),
           ("--presence-penalty", "3"), ("--frequency-penalty", "nan"), ("--repetition-penalty", "0"),
           ("--seed", "-5"), ("--temperature", "warm")]
    for command in (["serve", "--demo", "--port", "0"], ["generate", "--demo", "-p", "x", "-n", "1"],
                    ["run", "--demo"]):
        for flag, value in bad:
            r = run_tern(tern_bin, *command, flag, value)
            assert r.returncode == 2, (command, flag, value, r.returncode, r.stderr[-1000:])
            assert flag in r.stderr, (command, flag, r.stderr[-1000:])
    # Values at the ends of the ranges are accepted.
    r = run_tern(tern_bin, "generate", "--demo", "-p", "x", "-n", "1", "--temperature", "0", "--top-p", "1",
                 "--min-p", "0", "--top-k", "-1", "--presence-penalty", "-2", "--repetition-penalty", "10", "-q")
    assert r.returncode == 0, r.stderr


def test_generate_quiet_prints_only_the_answer(tern_bin):
    args = ["generate", "--demo", "-p", "Hello", "-n", "6", "--temperature", "0", "--ignore-eos"]
    quiet = run_tern(tern_bin, *args, "-q")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    full = run_tern(tern_bin, *args, "--json")
    assert full.returncode == 0 and "demo model" in full.stderr  # the banner, without -q
    assert quiet.stdout == json.loads(full.stdout)["text"] + "\n"


def test_bench_demo_default_lengths_fit_the_context(tern_bin):
    # The whole default run takes minutes on two cores (16K-token prefills): read the lengths it chose, then stop it.
    import os
    import signal
    env = dict(os.environ)
    env.setdefault("TERN_THREADS", "2")
    p = subprocess.Popen([tern_bin, "bench", "--demo"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    try:
        line = p.stderr.readline()
        while line and "tern bench: lengths" not in line:
            line = p.stderr.readline()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    assert "lengths 256,512,1K,2K,4K,8K,16K (" in line and "32768 positions with 32 decode steps" in line, line


def test_bench_defaults_run_within_a_small_context(tern_bin, tmp_path):
    """A model whose context is 2048 positions: the default lengths are cut to 256, 512, 1K and the run succeeds."""
    import pathlib
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    model = tmp_path / "model"
    subprocess.run([sys.executable, str(root / "tests/oracles/make_model.py"), "--out", str(model), "--seed", "7",
                    "--preset", "tiny", "--layout", "hf", "--dtype", "float32"], check=True, capture_output=True)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 2048
    (model / "config.json").write_text(json.dumps(config))
    r = run_tern(tern_bin, "bench", "-m", str(model), "--device", "cpu", "--repeats", "1", "--warmup", "0",
                 timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in r.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["256", "512", "1K"], r.stdout  # rows[0] is the header
    r = run_tern(tern_bin, "bench", "-m", str(model), "--device", "cpu", "--lengths", "2K")
    assert r.returncode == 2 and "2048 positions" in r.stderr, r.stderr


# --- The memory plan (issue 33): printed at start; --gpu-memory checked everywhere; the CPU keeps its context ---

def test_memory_plan_is_printed_at_start_on_the_cpu(tern_bin):
    """On the CPU there is no GPU memory to plan: the plan line says so and names the context taken."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from test_server_helpers import Server
    s = Server(tern_bin, "--device", "cpu", "-q")
    try:
        log = s.log_text()
    finally:
        s.stop()
    assert "tern serve: memory plan: none on the CPU: context 32,768 tokens (the CPU's default" in log, log
    assert "context 32768 tokens" in log, log  # the ready line
    s = Server(tern_bin, "--device", "cpu", "--ctx-size", "1024", "-q")
    try:
        log = s.log_text()
    finally:
        s.stop()
    assert "tern serve: memory plan: none on the CPU: context 1,024 tokens (--ctx-size)" in log, log
    # tern run takes the same context as tern serve (it used to take 16K).
    r = subprocess.run([tern_bin, "run", "--demo", "--device", "cpu", "--no-history"], input="", capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "TERN_THREADS": "2"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tern run: memory plan: none on the CPU: context 32,768 tokens" in r.stderr, r.stderr


def test_bad_gpu_memory_values_are_usage_errors(tern_bin):
    bad = {"-1": "must be more than 0", "0": "must be more than 0", "0.0": "must be more than 0",
           "nan": "not a finite size", "inf": "not a finite size", "abc": "is not a size",
           "24TB": "unknown unit", "24 potatoes": "unknown unit", "1e9": "more than any GPU holds",
           "": "is not a size"}
    commands = (["serve", "--demo", "--port", "0"], ["run", "--demo"], ["generate", "--demo", "-p", "x", "-n", "1"],
                ["bench", "--demo", "--lengths", "256"])
    for command in commands:
        for value, why in bad.items():
            r = run_tern(tern_bin, *command, "--gpu-memory", value)
            assert r.returncode == 2, (command, value, r.returncode, r.stderr[-1000:])
            assert "--gpu-memory" in r.stderr and why in r.stderr, (command, value, r.stderr[-1000:])


def test_gpu_memory_on_the_cpu_is_ignored_with_a_note(tern_bin):
    for value in ("24", "23.5GB", "24GiB", "24576MiB"):
        r = run_tern(tern_bin, "generate", "--demo", "--device", "cpu", "-p", "Hello", "-n", "2", "--gpu-memory", value)
        assert r.returncode == 0, (value, r.stderr[-2000:])
        assert "--gpu-memory" in r.stderr and "is ignored: the model runs on the CPU" in r.stderr, r.stderr
    r = run_tern(tern_bin, "generate", "--demo", "--device", "cpu", "-p", "Hello", "-n", "2", "--gpu-memory", "24",
                 "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # -q: nothing but the answer
