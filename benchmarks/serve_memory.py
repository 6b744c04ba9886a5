"""Memory of ``nbresponses serve`` over many sequential stored requests: RSS beyond the caches
``/health`` reports, at every ``--step`` requests.

What a server holds on purpose is bounded and reported on ``/health`` (the store's records,
the decoding KV, the prefix cache, the other caches under ``caches``); everything else should
stay flat once the caches are full. The server runs in its own process on 127.0.0.1 (the
bundled model unless ``--model``); before each reading it is sent SIGUSR1, on which it
collects garbage and trims the allocator's free arenas (``malloc_trim``), so the RSS read is
what is held, not what glibc keeps for reuse. Growth is measured from the first step on
(the caches fill during the first ~1,000 requests).

    python benchmarks/serve_memory.py [--requests 10000] [--step 1000] [--store memory]

Measured (December 2026, AMD EPYC with AVX512-VNNI, no AMX; bundled model, ``--store
memory``, max_output_tokens=4; the machine shared with a test run, load 3-4). Before: from
request 1,000 on the caches are full (prefix cache 511 MB, store 17 MB) and Python's blocks and
glibc's heap in use stay flat; what grew was (a) the heap glibc keeps free after the prefix
cache's LRU churn (60 arrays of ~30 KB an entry, below glibc's dynamic mmap threshold): free
heap 31 -> 93 MB, RSS beyond the caches 421.0 -> 451.9 MB (+7.3%) by request 3,750; and (b) the
resident pages of ONNX Runtime's mapping of the model's weights file, read for the first time
request after request (a diff of /proc/PID/smaps: all of the growth left once (a) was fixed).
Now ``serve`` sets glibc's mmap threshold to 16 KiB (free heap 4-9 MB) and ``/health`` reports
the mapped files; RSS beyond everything it reports, 10,000 requests: 293.8 MB at 1,000, 296.4
MB at 10,000 (+0.88%), while the weights file's resident pages went 65.9 -> 91.1 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx2 as httpx

# The server, with a SIGUSR1 handler that collects and trims (glibc) before a reading, then
# writes where its memory is: Python's allocated blocks, and glibc's heap (in use, free) and
# mmapped chunks (``mallinfo2``), to tell the interpreter's objects from native buffers.
SERVER = """
import ctypes, gc, json, os, signal, sys
from nbresponses.cli import main

libc = ctypes.CDLL("libc.so.6")

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2

def trim(signum, frame):
    gc.collect()
    libc.malloc_trim(0)
    info = libc.mallinfo2()
    with open(os.environ["NBR_MEMORY_REPORT"], "w") as f:
        json.dump({"py_blocks": sys.getallocatedblocks(), "heap_used": info.uordblks,
                   "heap_free": info.fordblks, "mmapped": info.hblkhd}, f)

signal.signal(signal.SIGUSR1, trim)
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cached_bytes(health: dict[str, Any]) -> dict[str, int]:
    """Every cache ``/health`` reports, in bytes."""
    source = health.get("source", {})
    found = {
        "store": int(health["store"]["bytes"]),
        "kv": int(source.get("kv_bytes", 0)),
        "prefix_cache": int(source.get("prefix_cache", {}).get("bytes", 0)),
    }
    for name, cache in health.get("caches", {}).items():
        found[name] = int(cache["bytes"])
    # resident pages of mapped files (the model's weights, libraries): bounded by the files
    for name, size in (health.get("mapped") or {}).items():
        found[f"mapped_{name.removesuffix('_bytes')}"] = int(size)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=1_000)
    parser.add_argument("--store", default="memory", help="the server's --store (a file, memory)")
    parser.add_argument("--model", default=None, help="model source (default: bundled)")
    parser.add_argument("-q", "--quantization", default=None, metavar="RECIPE")
    parser.add_argument("--cache-dir", default=None, help="the model cache to serve from")
    parser.add_argument("--max-output-tokens", type=int, default=4)
    args = parser.parse_args()

    port = free_port()
    command = [sys.executable, "-c", SERVER]
    if args.cache_dir:
        command += ["--cache-dir", args.cache_dir]
    command += ["serve", "--port", str(port), "--store", args.store]
    if args.quantization:
        command += ["-q", args.quantization]
    if args.model:
        command.append(args.model)
    log = open(os.devnull, "w")  # noqa: SIM115 - the server's access log, one line a request
    report = os.path.join(tempfile.mkdtemp(prefix="nbr-serve-memory-"), "memory.json")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NBR_MEMORY_REPORT": report}
    server = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=120) as http:
            deadline = time.monotonic() + 600
            while True:
                try:
                    health = http.get("/health").json()
                    break
                except httpx.TransportError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the server did not start") from None
                    time.sleep(0.5)
            model = health["model"]
            print(f"model {model}, store {args.store}, {os.cpu_count()} cpus, "
                  f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
            head = f"{'requests':>8} {'rss MB':>8} {'caches MB':>9} {'beyond MB':>9} {'s':>6}"
            print(f"{head}  caches")
            first_beyond = None
            started = time.perf_counter()
            for i in range(1, args.requests + 1):
                answer = http.post(
                    "/v1/responses",
                    json={"model": model, "input": f"Say the number {i}.", "store": True,
                          "max_output_tokens": args.max_output_tokens},
                )  # fmt: skip
                answer.raise_for_status()
                if i % args.step == 0:
                    server.send_signal(signal.SIGUSR1)
                    time.sleep(1.0)  # the handler runs between the loop's callbacks
                    caches = cached_bytes(http.get("/health").json())
                    held = rss(server.pid)
                    beyond = held - sum(caches.values())
                    first_beyond = beyond if first_beyond is None else first_beyond
                    growth = 100 * (beyond - first_beyond) / first_beyond
                    with open(report) as f:
                        where = {k: v if k == "py_blocks" else round(v / 2**20, 1)
                                 for k, v in json.load(f).items()}  # fmt: skip
                    print(
                        f"{i:>8} {held / 2**20:>8.1f} {sum(caches.values()) / 2**20:>9.1f} "
                        f"{beyond / 2**20:>9.1f} {time.perf_counter() - started:>6.0f}  "
                        f"{json.dumps({k: round(v / 2**20, 1) for k, v in caches.items()})} "
                        f"growth {growth:+.2f}% load {os.getloadavg()[0]:.1f} {json.dumps(where)}",
                        flush=True,
                    )
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
