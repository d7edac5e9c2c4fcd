import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

SAMPLES = Path(__file__).resolve().parent / "samples"


@pytest.fixture
def samples() -> Path:
    return SAMPLES


@pytest.fixture
def no_nvstack(monkeypatch):
    """No nvstack binary: every nvstack configuration is skipped, nothing is probed for real."""
    from nvbench import nvstack
    monkeypatch.setenv("NVSTACK_BIN", "/nonexistent/nvstack")
    nvstack.probe(refresh=True)
    yield
    nvstack._cache = None
