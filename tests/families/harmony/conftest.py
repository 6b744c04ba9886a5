"""The harmony encoding (o200k, offline from the test cache) every harmony test renders with."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from nbresponses.families.harmony import harmony_encoding


@pytest.fixture(scope="session")
def enc(cache_dir: Path) -> HarmonyEncoding:
    return harmony_encoding(cache_dir)
