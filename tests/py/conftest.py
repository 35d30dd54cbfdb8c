"""Shared pytest fixtures: where the tern binary and its helper tools are, and fresh seeds for every run."""
import os
import pathlib
import random

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tern_bin() -> str:
    path = os.environ.get("TERN_BIN", str(ROOT / "build" / "tern"))
    if not os.path.exists(path):
        pytest.fail(f"tern binary not found at {path}; build first (scripts/build)")
    return path


@pytest.fixture
def seed() -> int:
    """A fresh seed each run (printed on failure so a run can be repeated with TERN_TEST_SEED)."""
    s = int(os.environ.get("TERN_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed={s}")
    return s


@pytest.fixture(scope="session")
def fresh_seed():
    """fresh_seed(what): a fresh seed for one case, printed with its name (TERN_TEST_SEED repeats a run)."""
    def make(what: str) -> int:
        s = int(os.environ.get("TERN_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
        print(f"[seed] {what}: TERN_TEST_SEED={s}")
        return s
    return make


@pytest.fixture(scope="session")
def tern_tool():
    """tern_tool(name): a helper binary built beside tern (tern_vision_probe, tern_mrope_probe, ...)."""
    def find(name: str) -> pathlib.Path:
        path = pathlib.Path(os.environ.get("TERN_BIN", ROOT / "build" / "tern")).parent / name
        if not path.exists():
            pytest.fail(f"{path} not found; build it (scripts/build)")
        return path
    return find
