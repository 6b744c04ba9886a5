"""The python sandbox's isolation in tests: skipped where bubblewrap cannot run, unless required.

CI sets ``NBRESPONSES_REQUIRE_SANDBOX=1`` (``.ci/run``) so that a machine without bubblewrap
fails the escape tests instead of skipping them.
"""

from __future__ import annotations

import os

import pytest

from nbresponses.tools.python_sandbox import bwrap_problem

PROBLEM = bwrap_problem()
REQUIRED = os.environ.get("NBRESPONSES_REQUIRE_SANDBOX") == "1"

needs_bwrap = pytest.mark.skipif(
    PROBLEM is not None and not REQUIRED, reason=f"no sandbox isolation here: {PROBLEM}"
)
