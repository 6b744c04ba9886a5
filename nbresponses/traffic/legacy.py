"""The legacy Completions API's logprobs, read as Responses logprob entries.

A ``text_completion`` choice carries ``logprobs`` as four parallel lists: ``tokens``,
``token_logprobs``, ``top_logprobs`` (per token a ``{token: logprob}`` dict that holds the
chosen token too, so ``logprobs=k`` gives up to ``k + 1`` entries) and ``text_offset``. With
``echo=True`` the prompt's tokens come first, the very first one with a null logprob (nothing
predicts it). vLLM (and ``nbresponses serve``) may add ``prompt_logprobs`` to the choice: per
prompt position null or ``{token id: {"logprob", "rank", "decoded_token"}}``, the prompt's own
token first.

Entries come out in the Responses shape (``token``, ``logprob``, ``bytes``, ``top_logprobs``)
as plain dicts; ``bytes`` is None (frames rebuild it from the token, ``bytes:\\xe2\\x80``
included). Prompt tokens carry ``given: True``, and the ``rank`` (and ``entropy``) vLLM's
prompt logprobs give, as nbresponses' scorings do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .access import field

__all__ = ["echoed_prompt", "legacy_entries", "mark_prompt", "prompt_entries", "trim_alternatives"]


def _alternatives(tops: Any) -> list[dict[str, Any]]:
    """A ``{token: logprob}`` dict as Responses alternatives, most likely first."""
    if not tops:
        return []
    items = tops.items() if hasattr(tops, "items") else ()
    ranked = sorted(items, key=lambda kv: -kv[1] if kv[1] is not None else float("inf"))
    return [{"token": token, "logprob": value, "bytes": None} for token, value in ranked]


def legacy_entries(logprobs: Any) -> list[dict[str, Any]]:
    """Entries of a choice's (or a stream chunk's) legacy ``logprobs``; [] when there are none."""
    if logprobs is None:
        return []
    tokens = field(logprobs, "tokens", [])
    values = field(logprobs, "token_logprobs", [])
    tops = field(logprobs, "top_logprobs", [])
    entries = []
    for i, token in enumerate(tokens):
        value = values[i] if i < len(values) else None
        entries.append(
            {
                "token": token,
                "logprob": value,
                "bytes": None,
                "top_logprobs": _alternatives(tops[i] if i < len(tops) else None),
            }
        )
    return entries


def trim_alternatives(entries: list[dict[str, Any]]) -> None:
    """Drop the chosen token from alternatives it joined only because it was chosen.

    ``logprobs=k`` sends the top ``k`` plus the chosen token when it ranks lower, so an entry
    with more alternatives than the fewest any entry has (``k``), whose chosen token is the
    least likely of them, lists it as an extra: what a Responses ``top_logprobs=k`` leaves out.
    """
    sizes = [len(e["top_logprobs"]) for e in entries if e["top_logprobs"]]
    if not sizes:
        return
    k = min(sizes)
    for entry in entries:
        tops = entry["top_logprobs"]
        if len(tops) > k and tops[-1]["token"] == entry["token"]:
            entry["top_logprobs"] = tops[:-1]


def echoed_prompt(entries: Sequence[dict[str, Any]]) -> bool:
    """Whether the entries start with an echoed prompt: the first token has no logprob."""
    return bool(entries) and entries[0]["logprob"] is None


def mark_prompt(entries: list[dict[str, Any]], count: int, prompt_logprobs: Any) -> None:
    """Mark the first ``count`` entries as the prompt's, with vLLM's rank and entropy."""
    positions = prompt_logprobs if isinstance(prompt_logprobs, list) else []
    for i, entry in enumerate(entries[:count]):
        entry["given"] = True
        own = _own(positions[i]) if i < len(positions) else None
        if own is not None:
            _add_details(entry, own)


def _own(position: Any) -> Any:
    """The prompt token's entry of one ``prompt_logprobs`` position: the first, as vLLM and
    nbresponses write it."""
    if not position or not hasattr(position, "values"):
        return None
    return next(iter(position.values()), None)


def _add_details(entry: dict[str, Any], own: Any) -> None:
    for name in ("rank", "entropy"):
        value = field(own, name)
        if value is not None:
            entry[name] = value


def _top_count(positions: list[Any]) -> int:
    """The ``k`` of vLLM's ``prompt_logprobs=k``, which the answer does not state. A position
    of ``n`` entries lists the prompt token first, then the top ``k`` without it: a prompt
    token ranked below ``n`` and filling a rank the others miss is one of the top ``k = n``;
    one ranked past ``n``, or tied with a listed one, is not (``k = n - 1``). A token ranked
    exactly ``n`` could be either; when every position is such, ``k = n - 1``."""
    known, unsure = [], []
    for position in positions:
        entries = list(position.values())
        n, rank = len(entries), field(entries[0], "rank", 0)
        others = {field(v, "rank", 0) for v in entries[1:]}
        if rank == n and rank not in others:
            unsure.append(n - 1)
        else:
            known.append(n if rank < n and rank not in others else n - 1)
    return max(known or unsure or [0])


def prompt_entries(prompt_logprobs: Any) -> list[dict[str, Any]]:
    """Entries of vLLM's ``prompt_logprobs`` alone (no echo): the positions that have one
    (not the first), the alternatives the top ``k`` listed (see :func:`_top_count`; the
    prompt token among them when it is one, not when it only ties with them)."""
    positions = [p for p in prompt_logprobs or () if p] if isinstance(prompt_logprobs, list) else []
    k = _top_count(positions)
    entries: list[dict[str, Any]] = []
    for position in positions:
        own = _own(position)
        if own is None:
            continue
        listed = list(position.values())
        if len(listed) > k:
            listed = listed[1:]  # the prompt token comes first
        listed.sort(key=lambda v: field(v, "rank", 0))
        entry = {
            "token": field(own, "decoded_token", ""),
            "logprob": field(own, "logprob"),
            "bytes": None,
            "top_logprobs": [
                {
                    "token": field(v, "decoded_token", ""),
                    "logprob": field(v, "logprob"),
                    "bytes": None,
                }
                for v in listed
            ],
            "given": True,
        }
        _add_details(entry, own)
        entries.append(entry)
    return entries
