"""``/health`` reports what the C allocator holds beside the caches, so growth of a server
that no cache explains (freed chunks glibc keeps after churn) is visible."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

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
    assert after["mapped"] is None or after["mapped"]["libraries_bytes"] > 0
    memory = after["allocator"]
    assert set(memory) == {"in_use_bytes", "free_bytes", "mmapped_bytes", "mmap_threshold_bytes"}
    held = memory["in_use_bytes"] + memory["mmapped_bytes"]
    was = before["allocator"]["in_use_bytes"] + before["allocator"]["mmapped_bytes"]
    assert held - was >= 7 << 20  # the 8 MiB, give or take what else was freed meanwhile


_BOUND = """
import json, sys
from nbresponses.service.footprint import allocator_stats, bound_free_heap
def mapped_for(size, count=64):  # enough to outgrow the heap's top (glibc maps only then)
    before = allocator_stats()["mmapped_bytes"]
    blobs = [bytearray(size) for _ in range(count)]
    grown = allocator_stats()["mmapped_bytes"] - before
    del blobs
    return grown
plain = mapped_for(64 << 10)  # below glibc's dynamic threshold (128 KiB at start): the heap
bound = bound_free_heap()
print(json.dumps({"plain": plain, "bound": bound, "after": mapped_for(64 << 10),
                  "threshold": allocator_stats()["mmap_threshold_bytes"]}))
"""


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library to ask")
def test_serve_gives_buffers_from_16_kib_their_own_mapping():
    """``nbresponses serve`` bounds the heap's free part (service/footprint.py says why): 64
    buffers of 64 KiB come from the heap by glibc's default rule and from their own mappings, given
    back when freed, once ``bound_free_heap`` ran; ``/health`` reports the threshold. In a fresh
    interpreter: the setting is per process."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, "-c", _BOUND], capture_output=True, text=True, env=env, check=True
    )
    got = json.loads(out.stdout)
    assert got["plain"] == 0 and got["bound"] is True
    assert got["after"] >= 32 * (64 << 10) and got["threshold"] == 16 << 10


def test_mapped_files_count_the_pages_read_of_a_mapped_file(tmp_path):
    """A mapped file's pages count once read (as ONNX Runtime's mapping of the model's weights
    does), apart from the allocator's memory; /health reports them under ``mapped``."""
    import mmap

    from nbresponses.service.footprint import mapped_files

    if mapped_files() is None:
        pytest.skip("no /proc/self/smaps here")
    path = tmp_path / "weights.data"
    path.write_bytes(bytes(range(256)) * (16 << 12))  # 16 MiB
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        before = mapped_files()["files_bytes"]
        total = sum(mapped[i + 1] for i in range(0, 8 << 20, mmap.PAGESIZE))  # touch half of it
        after = mapped_files()["files_bytes"]
    assert total > 0
    assert (8 << 20) <= after - before <= (9 << 20)
