"""A stand-in for `tern bench --synthetic --device cuda ... --json FILE --quiet`, for the tests of the tools that run
it (scripts/step-costs.py, scripts/ab-bench.py): an executable script that checks the call's form, then runs `body`
(Python with json, os, sys imported and `args` the bench's arguments), which writes the report.
"""
import sys

PREAMBLE = """#!{python}
import json, os, sys
args = sys.argv[1:]
assert args[0] == "bench" and "--synthetic" in args and "--quiet" in args, args
"""


def write(tmp_path, body):
    """The stand-in at tmp_path/tern, executable."""
    path = tmp_path / "tern"
    path.write_text(PREAMBLE.format(python=sys.executable) + body)
    path.chmod(0o755)
    return path
