import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

SAMPLES = Path(__file__).resolve().parent / "samples"


@pytest.fixture
def samples() -> Path:
    return SAMPLES
