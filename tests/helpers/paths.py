"""Where the repository, its test fixtures and the persistent test model cache are."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
FIXTURES = ROOT / "tests" / "fixtures"  # everything the tests read lives inside the checkout
TEST_CACHE = Path(
    os.environ.get("NBRESPONSES_TEST_CACHE", Path.home() / ".cache" / "nbresponses-test")
)
