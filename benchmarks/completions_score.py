"""Scoring through HTTP against scoring in the kernel, on the same engine, in one run.

The corpus of ``score.py`` (8 documents, ~2,900 tokens) is scored as plain text, every
token's logprob given the ones before it, by the same loaded engine three ways, round-robin,
medians of ``--rounds``:

- in the kernel: ``engine.score_many(method="prefill")``;
- ``nbr.RemoteEngine`` against ``nbresponses serve`` (uvicorn on a thread of this process,
  loopback): ``/tokenize`` per text, then one ``/v1/completions`` per document with
  ``echo=True, max_tokens=0, prompt_logprobs``;
- one lm-evaluation-harness-shaped request: all documents' token ids in one ``prompt``,
  ``echo=True, max_tokens=1, logprobs=1`` (``local-completions``' body).

It also checks that the three give the same logprobs, float for float.

With ``--vllm PYTHON`` (the python of a vLLM CPU venv, benchmarks/install_vllm.sh) a fourth
path scores the same texts with ``nbr.RemoteEngine`` against ``vllm serve`` of the same model
in bf16 (``vllm_peer.VllmServer``: loopback, both cores, started once, 80-140 s). vLLM is
paused (SIGSTOP) while the other paths are timed, so its idle threads leave the two cores
alone. bf16 is not fp32 or int8: that path is checked for the same token ids and its
|Δ logprob| against the kernel's, not for float equality.

    python benchmarks/completions_score.py --rounds 3
    python benchmarks/completions_score.py --rounds 2 --vllm /work/venvs/vllm/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).parent))
from score import corpus

import nbresponses as nbr
from nbresponses.server.serve import make_server


class Server:
    """``nbresponses serve`` for an engine already loaded, on a thread, on a free port."""

    def __init__(self, engine: nbr.Engine) -> None:
        self.server = make_server(engine.client(), port=0, log_level="warning")
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--recipe", default=None, help="the engine's recipe (default: Engine.load's default)"
    )
    parser.add_argument(
        "--vllm", type=Path, default=None, metavar="PYTHON",
        help="the python of a vLLM CPU venv: adds RemoteEngine against vLLM CPU (bf16)",
    )  # fmt: skip
    args = parser.parse_args()
    engine = await nbr.Engine.load(quantization=args.recipe, progress=False)
    texts = corpus()
    start_id = engine.generator.eos_token_ids[0]
    family = engine.client().family
    documents = [[start_id, *family.encode(t)] for t in texts]
    tokens = sum(len(d) - 1 for d in documents)
    print(f"{engine!r}\n{len(texts)} documents, {tokens} scored tokens")

    with contextlib.ExitStack() as stack:
        vllm = start_vllm(args.vllm, stack) if args.vllm else None
        server = stack.enter_context(Server(engine))
        remote = nbr.RemoteEngine(server.base_url, document_start=start_id)
        http = httpx2.AsyncClient(base_url=server.base_url, timeout=600)
        got: dict[str, list[list[float]]] = {}

        def values(scorings: list[Any]) -> list[list[float]]:
            return [[lp.logprob for lp in s.output[0].content[0].logprobs] for s in scorings]

        async def kernel() -> None:
            many = engine.score_many(texts, method="prefill", progress=False)
            got["kernel"] = values([s async for s in many])

        async def remote_engine() -> None:
            got["RemoteEngine"] = values(
                [s async for s in remote.score_many(texts, progress=False)]
            )

        async def lm_eval_body() -> None:
            body = {"model": engine.model, "prompt": documents, "max_tokens": 1, "echo": True,
                    "logprobs": 1, "temperature": 0, "seed": 1234}  # fmt: skip
            response = (await http.post("/completions", json=body)).json()
            choices = sorted(response["choices"], key=lambda c: c["index"])
            got["lm-eval body"] = [c["logprobs"]["token_logprobs"][1:-1] for c in choices]

        systems: dict[str, Callable[[], Awaitable[None]]] = {
            "in the kernel (score_many, prefill)": kernel,
            "RemoteEngine over HTTP": remote_engine,
            "one lm-eval-shaped request over HTTP": lm_eval_body,
        }
        if vllm is not None:
            peer = nbr.RemoteEngine(vllm.url + "/v1", document_start=start_id)

            async def remote_vllm() -> None:
                got[VLLM] = values([s async for s in peer.score_many(texts, progress=False)])

            systems[VLLM] = remote_vllm
        times: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds + 1):  # the first round warms up, and is not counted
            for name, run in systems.items():
                if name == VLLM:  # awake only for its own path, outside the clock
                    vllm.resume()
                t0 = time.perf_counter()
                await run()
                times[name].append(time.perf_counter() - t0)
                if name == VLLM:
                    vllm.pause()
        if vllm is not None:
            vllm.resume()
            vllm_ids = [await peer.scoring.tokenize(t) for t in texts]  # vLLM's /tokenize
            await peer.aclose()
        await remote.aclose()
        await http.aclose()
    base = statistics.median(times["in the kernel (score_many, prefill)"][1:])
    print("\n| path | tokens/s | vs in the kernel |\n|---|---|---|")
    for name, spent in times.items():
        median = statistics.median(spent[1:])
        print(f"| {name} | {tokens / median:.0f} | {base / median:.2f}x |")
    same = all(v == got["kernel"] for k, v in got.items() if k != VLLM)
    print(f"\nthe same logprobs, float for float, on all three paths: {same}")
    if vllm is not None:
        recipe = engine.generator.prepared.recipe
        print(f"{VLLM} against the kernel ({recipe}): {agreement(vllm_ids, documents, got)}")
    await engine.aclose()


VLLM = "RemoteEngine against vLLM CPU (bf16)"


def agreement(ids: list[list[int]], documents: list[list[int]], got: dict[str, Any]) -> str:
    """vLLM's token ids against the kernel's, then |Δ logprob| over every token."""
    if ids != [d[1:] for d in documents]:
        return "the same token ids: False"
    delta = [
        abs(a - b)
        for far, near in zip(got[VLLM], got["kernel"], strict=True)
        for a, b in zip(far, near, strict=True)
    ]
    mean, worst = statistics.fmean(delta), max(delta)
    spread = f"|Δ logprob| over {len(delta)} tokens: mean {mean:.4f}, max {worst:.4f}"
    return f"the same token ids: True; {spread}"


def start_vllm(python: Path, stack: contextlib.ExitStack) -> Any:
    """``vllm serve`` of the bundled model (benchmarks/vllm_peer.py), answering, paused."""
    from vllm_peer import VllmServer, vllm_model_folder

    log = Path("/tmp") / "vllm-serve.log"
    print(f"starting vLLM (log: {log}) ...", flush=True)
    server = stack.enter_context(VllmServer(python, vllm_model_folder(), log))
    print(f"vLLM answered after {server.startup_s:.0f} s", flush=True)
    server.pause()
    return server


if __name__ == "__main__":
    asyncio.run(main())
