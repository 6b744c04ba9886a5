"""``/health`` reports what the C allocator holds beside the caches, so growth of a server
that no cache explains (freed chunks glibc keeps after churn) is visible."""

from __future__ import annotations

import ctypes.util

import pytest
from helpers.server import ThreadedServer, scripted

pytestmark = pytest.mark.timeout(60)


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library to ask")
def test_health_reports_the_allocator_beside_the_caches(tokenizer):
    client, _ = scripted(tokenizer, "A short answer.")
    with ThreadedServer(client) as server, server.http() as http:
        before = http.get("/health").json()
        blob = bytearray(8 << 20)  # 8 MiB held in this process while it is asked again
        after = http.get("/health").json()
        del blob
    assert {"store", "source"} <= set(after)
    memory = after["allocator"]
    assert set(memory) == {"in_use_bytes", "free_bytes", "mmapped_bytes"}
    held = memory["in_use_bytes"] + memory["mmapped_bytes"]
    was = before["allocator"]["in_use_bytes"] + before["allocator"]["mmapped_bytes"]
    assert held - was >= 7 << 20  # the 8 MiB, give or take what else was freed meanwhile
