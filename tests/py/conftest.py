"""Shared pytest fixtures: where the tern binary is, and fresh seeds for every run."""
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
