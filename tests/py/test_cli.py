import subprocess


def test_version_lists_backends(tern_bin):
    out = subprocess.run([tern_bin, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("tern ") and "backends: cpu" in out


def test_unknown_subcommand_fails_cleanly(tern_bin):
    r = subprocess.run([tern_bin, "no-such-command"], capture_output=True, text=True)
    assert r.returncode != 0 and r.returncode < 128
