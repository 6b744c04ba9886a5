"""The built-in python tool: model code runs in a separate, stateful, time-limited process.

What is guaranteed:

* **Never the user's kernel.** Code runs in a child ``python -I`` process (isolated mode: no
  user site, no ``PYTHONPATH``, no current directory on ``sys.path``) with a clean environment
  (no variables of the kernel's process, so no API keys) and a fresh temporary working
  directory (also its ``HOME`` and ``TMPDIR``) that is deleted on close. The installed packages of
  the kernel's interpreter (numpy, pandas, ...) are importable.
* **State persists** across ``run`` calls of one sandbox (one sandbox per response), like
  notebook cells; a trailing expression's value is printed.
* **Time limit.** A run that exceeds ``timeout`` is interrupted (KeyboardInterrupt; state kept);
  if it does not stop within ``grace`` seconds the whole process group is killed and the next run
  starts a fresh process (state lost). Both are reported to the model.
* **Output cap.** At most ``max_output`` bytes of stdout and of stderr are kept per run; the rest
  is counted and dropped as it arrives (a print loop cannot fill memory), and the text says so.
* **No network**, two layers: (1) when ``unshare`` can create a network namespace (root, or
  unprivileged user namespaces), the process and everything it starts see no network at all,
  not even a working loopback (``network == "namespace"``); (2) always, ``socket.socket`` refuses
  internet families and ``create_connection``/``getaddrinfo`` raise. Layer 2 alone
  (``network == "python-guard"``) is best effort: ``_socket`` or a subprocess such as ``curl``
  get around it.
* Optional ``max_memory`` (bytes) sets ``RLIMIT_AS`` in the child.

Not guaranteed: filesystem isolation (the child runs as the kernel's user and can read what the
user can read), CPU or process-count limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DRIVER = Path(__file__).with_name("sandbox_driver.py")
NetworkIsolation = Literal["namespace", "python-guard"]


@dataclass(frozen=True)
class SandboxResult:
    """One run's outcome; ``text`` is what goes back to the model."""

    stdout: str
    stderr: str
    error: str | None  # "ZeroDivisionError: division by zero", a timeout, a crash, or None
    timed_out: bool = False
    truncated: bool = False
    restarted: bool = False  # the process was replaced after this run: variables are gone
    duration: float = 0.0

    @property
    def text(self) -> str:
        """stdout, then stderr (tracebacks), then notes on timeouts / restarts."""
        parts = [self.stdout, self.stderr]
        if self.timed_out or self.restarted:
            parts.append(f"[{self.error}]\n" if self.error else "")
        return "".join(parts)

    @property
    def logs(self) -> str:
        return self.text

    def outputs(self) -> list[dict[str, Any]]:
        """``code_interpreter_call.outputs`` (one ``logs`` entry, none when silent)."""
        return [{"type": "logs", "logs": self.text}] if self.text else []


class _Capture:
    """A run's output on one stream: capped head, dropped count, and its end marker."""

    def __init__(self, marker: bytes, cap: int) -> None:
        self.marker = marker
        self.cap = cap
        self.head = bytearray()
        self.dropped = 0
        self.window = bytearray()  # unsearched tail (may hold a partial marker)
        self.trailer: bytes | None = None  # what followed the marker up to its newline
        self.rest = b""  # bytes after the trailer (the next run's, in theory)
        self.eof = False

    def _keep(self, data: bytes) -> None:
        room = self.cap - len(self.head)
        self.head += data[: max(room, 0)]
        self.dropped += max(len(data) - max(room, 0), 0)

    def add(self, chunk: bytes) -> None:
        self.window += chunk
        at = self.window.find(self.marker)
        if at >= 0:
            self._keep(bytes(self.window[:at]))
            after = bytes(self.window[at + len(self.marker) :])
            newline = after.find(b"\n")
            if newline >= 0:
                self.trailer, self.rest = after[:newline], after[newline + 1 :]
                self.window = bytearray()
            else:
                self.window = bytearray(self.window[at:])  # wait for the rest of the trailer
            return
        keep = len(self.marker)
        if len(self.window) > keep:
            self._keep(bytes(self.window[:-keep]))
            del self.window[:-keep]

    @property
    def done(self) -> bool:
        return self.trailer is not None or self.eof

    def text(self) -> str:
        if not self.done:  # killed: what arrived is all there is
            self._keep(bytes(self.window))
            self.window = bytearray()
        out = self.head.decode("utf-8", errors="replace")
        if self.dropped:
            out += f"\n[output truncated: {self.dropped} more bytes not shown]\n"
        return out


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
    """The ``unshare`` command that gives a child no network here, or () if none works."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    options: list[tuple[str, ...]] = [("--net",)] if os.geteuid() == 0 else []
    options.append(("--user", "--map-root-user", "--net"))
    for opts in options:
        cmd = (unshare, *opts, "--")
        try:
            probe = subprocess.run([*cmd, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return cmd
    return ()


class PythonSandbox:
    """``async with PythonSandbox(timeout=10) as sb: result = await sb.run("print(1)")``."""

    def __init__(
        self,
        *,
        timeout: float = 120.0,
        max_output: int = 20_000,
        grace: float = 2.0,
        max_memory: int | None = None,
        isolate_network: bool = True,
    ) -> None:
        self.timeout = timeout
        self.max_output = max_output
        self.grace = grace
        self.max_memory = max_memory
        self._isolate = isolate_network
        self._proc: asyncio.subprocess.Process | None = None
        self._workdir: Path | None = None
        self._lock = asyncio.Lock()
        self._leftover = {"stdout": b"", "stderr": b""}
        self.network: NetworkIsolation = "python-guard"

    @property
    def workdir(self) -> Path | None:
        return self._workdir

    async def __aenter__(self) -> PythonSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="nbr-python-"))
        if self._proc is None or self._proc.returncode is not None:
            await self._spawn()

    async def close(self) -> None:
        await self._kill()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    async def _spawn(self) -> None:
        assert self._workdir is not None
        prefix = await asyncio.to_thread(_unshare_prefix) if self._isolate else ()
        self.network = "namespace" if prefix else "python-guard"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._workdir),
            "TMPDIR": str(self._workdir),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "MPLBACKEND": "Agg",
        }
        if self.max_memory:
            env["NBR_SANDBOX_MAX_MEMORY"] = str(int(self.max_memory))
        self._proc = await asyncio.create_subprocess_exec(
            *prefix,
            sys.executable,
            "-I",
            "-u",
            str(DRIVER),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self._workdir,
            env=env,
            start_new_session=True,  # its own process group: a kill reaches what it started
        )
        self._leftover = {"stdout": b"", "stderr": b""}

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)

    async def run(self, code: str) -> SandboxResult:
        """Run one cell of model code; never raises for anything the code does."""
        async with self._lock:
            await self.start()
            return await self._run(code)

    async def _run(self, code: str) -> SandboxResult:
        proc = self._proc
        assert proc is not None and proc.stdin and proc.stdout and proc.stderr
        nonce = secrets.token_hex(8)
        out = _Capture(f"\x1e{nonce}\x1e".encode(), self.max_output)
        err = _Capture(f"\x1e{nonce}\x1e".encode(), self.max_output)
        for cap, name in ((out, "stdout"), (err, "stderr")):
            if self._leftover[name]:
                cap.add(self._leftover[name])
        started = time.perf_counter()
        proc.stdin.write(json.dumps({"code": code, "nonce": nonce}).encode() + b"\n")
        timed_out = restarted = False
        try:
            await proc.stdin.drain()
            await asyncio.wait_for(self._collect(proc, out, err), self.timeout)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process is gone; reported below
        except asyncio.TimeoutError:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(self._collect(proc, out, err), self.grace)
            except asyncio.TimeoutError:
                restarted = True
        error: str | None = None
        if out.trailer is not None:
            with contextlib.suppress(ValueError):
                error = json.loads(out.trailer).get("error")
            self._leftover = {"stdout": out.rest, "stderr": err.rest}
        elif not restarted:
            restarted = True  # the process died (os._exit, a crash, the memory limit)
        if timed_out:
            error = f"TimeoutError: execution exceeded the {self.timeout:g} s time limit" + (
                "; the python process was killed and restarted, variables are lost"
                if restarted
                else " and was interrupted"
            )
        elif restarted:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 1)
            status = proc.returncode
            error = (
                f"the python process exited (status {status}) and was restarted; variables are lost"
            )
        if restarted:
            await self._kill()
        return SandboxResult(
            stdout=out.text(),
            stderr=err.text(),
            error=error,
            timed_out=timed_out,
            truncated=bool(out.dropped or err.dropped),
            restarted=restarted,
            duration=time.perf_counter() - started,
        )

    @staticmethod
    async def _collect(proc: asyncio.subprocess.Process, out: _Capture, err: _Capture) -> None:
        async def pump(stream: asyncio.StreamReader, cap: _Capture) -> None:
            while not cap.done:
                chunk = await stream.read(65536)
                if not chunk:
                    cap.eof = True
                    return
                cap.add(chunk)

        assert proc.stdout is not None and proc.stderr is not None
        await asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err))
