"""One `tern bench --synthetic --device cuda --concurrency LIST` process and its JSON report, for the tools that run
it under different environments (step-costs.py, ab-bench.py). Standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile


def concurrency_rows(tern, length, concurrency, repeats, decode_steps, env_set, tool):
    """The report's concurrency rows ({streams: row}) of one bench process whose environment is this process's with
    env_set's variables set (a value of None removes the variable). Exits naming `tool` when the bench fails."""
    env = dict(os.environ)
    for k, v in env_set.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        cmd = [tern, "bench", "--synthetic", "--device", "cuda", "--lengths", length, "--repeats", str(repeats),
               "--decode-steps", str(decode_steps), "--concurrency", concurrency, "--json", path, "--quiet"]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            shown = " ".join("%s=%s" % kv for kv in env_set.items() if kv[1] is not None)
            sys.exit("%s: %s%s failed (exit %d):\n%s" % (tool, shown + " " if shown else "", " ".join(cmd),
                                                          r.returncode, r.stderr[-2000:]))
        with open(path) as f:
            report = json.load(f)
    finally:
        os.unlink(path)
    return {row["streams"]: row for row in report["concurrency"]}
