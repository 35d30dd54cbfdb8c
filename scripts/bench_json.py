"""One `tern bench --synthetic --device cuda` process and its JSON report (of `--concurrency LIST` or of
`--speculative`), for the tools that run it under different environments (step-costs.py, ab-bench.py). Standard
library only.
"""
import json
import os
import subprocess
import sys
import tempfile


def run_report(tern, bench_args, env_set, tool):
    """The JSON report of one `tern bench --synthetic --device cuda BENCH_ARGS --json FILE --quiet` process whose
    environment is this process's with env_set's variables set (a value of None removes the variable). Exits naming
    `tool` when the bench fails."""
    env = dict(os.environ)
    for k, v in env_set.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        cmd = [tern, "bench", "--synthetic", "--device", "cuda"] + bench_args + ["--json", path, "--quiet"]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            shown = " ".join("%s=%s" % kv for kv in env_set.items() if kv[1] is not None)
            sys.exit("%s: %s%s failed (exit %d):\n%s" % (tool, shown + " " if shown else "", " ".join(cmd),
                                                          r.returncode, r.stderr[-2000:]))
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def concurrency_rows(tern, length, concurrency, repeats, decode_steps, env_set, tool):
    """The report's concurrency rows ({streams: row}) of one `tern bench --concurrency LIST` process (run_report)."""
    report = run_report(tern, ["--lengths", length, "--repeats", str(repeats), "--decode-steps", str(decode_steps),
                               "--concurrency", concurrency], env_set, tool)
    return {row["streams"]: row for row in report["concurrency"]}


def speculative_point(tern, length, drafts, repeats, env_set, tool):
    """The report's point at `length` of one `tern bench --speculative --draft-max DRAFTS` process (run_report): its
    plain step (plain_ms_median) and the verify of 1 + k tokens for k = 0..DRAFTS (verify: [{drafts, ms_median, ...}]).
    The end-to-end rows it also runs are kept short (one draft count, 8 tokens)."""
    report = run_report(tern, ["--speculative", "--lengths", length, "--draft-max", str(drafts), "--draft-counts",
                               "1", "--acceptance", "0.5", "--decode-steps", "8", "--repeats", str(repeats)],
                        env_set, tool)
    return report["points"][0]
