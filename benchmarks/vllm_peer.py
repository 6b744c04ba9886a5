"""vLLM's CPU build as a peer of benchmarks/decode.py: its model folder, its server, its client.

vLLM runs in its own venv (benchmarks/install_vllm.sh) as an OpenAI-compatible server that this
module starts as a subprocess, waits for, and stops. Requests go to ``/v1/completions`` with
the prompt as token ids (the very tokens the engine gets, chat template applied), greedy,
``ignore_eos``, streaming with ``return_token_ids`` so every chunk says which tokens it carries:
that times TTFT and decode per token and lets the benchmark compare the output with the
engine's. Prefix caching is off (every prompt is cold, as for the engine and llama.cpp) and
``--generation-config vllm`` keeps the model folder's sampling defaults out.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from nbresponses.models.cache import build_once, cache_root, write_manifest
from nbresponses.models.export import materialize_hf_folder
from nbresponses.models.sources import resolve_source

LAUNCHER = Path(__file__).resolve().with_name("vllm_launcher.py")
SERVED_NAME = "smollm2-135m-instruct"
Trace = tuple[float, list[tuple[float, int]], list[int]]  # start, (time, tokens) per chunk, ids


def vllm_model_folder(cache_dir: str | None = None) -> Path:
    """The bundled GGUF as a Hugging Face folder vLLM can serve (made once, cached).

    The model and the repaired tokenizer (eos = pad = ``<|im_end|>``, no BOS) come from the
    project's own GGUF conversion; a tokenizer saved by transformers 4.57 is misread by vLLM's
    transformers 5 unless its config names ``PreTrainedTokenizerFast``.
    """
    source = resolve_source(None)
    final = cache_root(cache_dir) / "benchmarks" / f"vllm-{source.name}"

    def build(tmp: Path) -> None:
        materialize_hf_folder(source, tmp)
        config_file = tmp / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2))
        write_manifest(tmp, {"kind": "vllm-hf-folder", "source": source.describe()})

    return build_once(final, build)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """``vllm serve`` on loopback with both cores, from start to stop (a context manager)."""

    def __init__(
        self, python: Path, model: Path, log: Path, *, max_model_len: int = 2048, timeout=900
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.timeout = timeout
        self.command = [
            str(python),
            str(LAUNCHER),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            "bfloat16",
            "--no-enable-prefix-caching",
            "--generation-config",
            "vllm",
        ]
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # both cores for the model ...
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # ... none kept back for the server
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VllmServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,  # its own process group: stopped whole, and only it
            )  # fmt: skip
        start = time.perf_counter()
        while time.perf_counter() - start < self.timeout:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    self.startup_s = time.perf_counter() - start
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.__exit__()
        raise TimeoutError(f"vllm serve did not answer within {self.timeout} s (log: {self.log})")

    def pause(self) -> None:
        """Stop every process of the server until ``resume``: idle, vLLM's CPU worker threads
        keep spinning on the cores the other systems are measured on (an engine row measured
        right after vLLM read 78.8 tok/s against 143-154 alone)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)
            time.sleep(0.5)  # let its threads settle before the clock starts

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


async def _stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> Trace:
    body: dict[str, Any] = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    events: list[tuple[float, int]] = []
    ids: list[int] = []
    start = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                new = choice.get("token_ids") or []
                if new:
                    events.append((time.perf_counter(), len(new)))
                    ids.extend(new)
    return start, events, ids


def vllm_runner(
    server: VllmServer, prompts: list[list[int]], max_tokens: int, stagger_s: float
) -> Callable[[], list[Trace]]:
    """One round: every prompt as a streaming request, the i-th sent after ``i * stagger_s``."""

    async def run() -> list[Trace]:
        limits = httpx.Limits(max_connections=len(prompts) + 1)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:

            async def one(i: int, prompt: list[int]) -> Trace:
                await asyncio.sleep(i * stagger_s)
                return await _stream(client, prompt, max_tokens)

            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    def paused_between() -> list[Trace]:
        server.resume()
        try:
            return asyncio.run(run())
        finally:
            server.pause()

    return paused_between
