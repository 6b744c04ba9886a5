"""Ids shaped like OpenAI's (``resp_``, ``msg_``, ``rs_``, ``fc_``, ``call_``): prefix + hex."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A fresh random id; ``call_`` ids are shorter, as OpenAI's are."""
    return f"{prefix}_{secrets.token_hex(12 if prefix == 'call' else 24)}"
