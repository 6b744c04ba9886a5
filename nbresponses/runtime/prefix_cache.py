"""Reuse of earlier requests' KV for prompts that extend them (multi-turn chat), LRU-bounded.

The KV of a token depends only on the tokens before it, so any stored sequence that shares its
first k tokens with a new prompt supplies the KV of those k tokens; lookup takes the longest
common prefix over all entries. Entries are prompts, and finished requests' prompt + answer, all
computed by prefill runs (the scheduler never stores what decode steps computed): so the KV a
hit supplies is bit for bit the KV a cold prefill of the same tokens computes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from nbresponses.runtime.kv import RowKV, row_bytes


@dataclass(frozen=True)
class PrefixCacheStats:
    """What the cache holds and how often requests' prompts were served from it."""

    entries: int
    bytes: int
    budget_bytes: int
    prompts: int  # prompts looked up for a request (generation or scoring)
    hits: int  # of those, how many reused at least one token
    prompt_tokens: int
    reused_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.prompts if self.prompts else 0.0

    @property
    def token_reuse(self) -> float:
        """Share of prompt tokens whose KV came from the cache."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate, "token_reuse": self.token_reuse}


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens two sequences share from their start (compared in numpy: prompts of
    thousands of tokens)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(differ[0]) if differ.size else n


class PrefixCache:
    """Token sequences and their KV, evicted least recently used first beyond ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], RowKV] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._prompts = self._hits = self._prompt_tokens = self._reused_tokens = 0

    def served(self, prompt_tokens: int, reused_tokens: int) -> None:
        """Count one request's prompt and how many of its tokens the cache supplied."""
        with self._lock:
            self._prompts += 1
            self._hits += reused_tokens > 0
            self._prompt_tokens += prompt_tokens
            self._reused_tokens += reused_tokens

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                entries=len(self._entries),
                bytes=self._bytes,
                budget_bytes=self.budget_bytes,
                prompts=self._prompts,
                hits=self._hits,
                prompt_tokens=self._prompt_tokens,
                reused_tokens=self._reused_tokens,
            )

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: tuple[int, ...], *, leave: int = 1) -> tuple[int, RowKV | None]:
        """(k, KV of the first k tokens) for the best match, k <= len(prompt) - ``leave`` (by
        default one token remains to compute logits from). (0, None) when nothing matches."""
        if not prompt or self.budget_bytes <= 0:
            return 0, None
        best, best_key = 0, None
        with self._lock:
            for key in self._entries:
                n = min(len(key), len(prompt) - leave)
                if n <= best:
                    continue
                common = common_length(key[:n], prompt[:n])
                if common > best:
                    best, best_key = common, key
            if best_key is None:
                return 0, None
            self._entries.move_to_end(best_key)
            kv = self._entries[best_key]
        return best, [a[:, :best] for a in kv]

    def store(self, tokens: tuple[int, ...], kv: RowKV) -> None:
        """Remember ``tokens`` (KV length must match); drop entries it extends; evict LRU."""
        size = row_bytes(kv)
        if not tokens or size > self.budget_bytes:
            return
        with self._lock:
            extended = [k for k in self._entries if tokens[: len(k)] == k]
            for key in extended:
                self._bytes -= row_bytes(self._entries.pop(key))
            self._entries[tokens] = kv
            self._bytes += size
            while self._bytes > self.budget_bytes and self._entries:
                _, old = self._entries.popitem(last=False)
                self._bytes -= row_bytes(old)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
