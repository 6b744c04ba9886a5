"""The python sandbox: separate process, state, time limit, output cap, no network.

The default isolation (bubblewrap) runs these; ``test_sandbox_escapes.py`` attacks it.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from helpers.sandbox import needs_bwrap
from openai.types.responses.response_code_interpreter_tool_call import OutputLogs

from nbresponses.tools import PythonSandbox, PythonTool, python_sandbox
from nbresponses.tools.python_sandbox import SandboxUnavailable

SECRET_IN_KERNEL = "kernel-only-value"
pytestmark = needs_bwrap


async def test_state_persists_and_trailing_expressions_print() -> None:
    async with PythonSandbox(timeout=10) as sb:
        assert (await sb.run("x = 41\ndef f(v):\n    return v + 1")).text == ""
        result = await sb.run("f(x)")
        assert result.stdout == "42\n" and result.error is None
        assert result.outputs() == [{"type": "logs", "logs": "42\n"}]
        OutputLogs.model_validate(result.outputs()[0])


async def test_kernel_variables_and_environment_are_invisible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBR_TEST_SECRET", "api-key")
    async with PythonSandbox(timeout=10) as sb:
        result = await sb.run("SECRET_IN_KERNEL")
        assert result.error == "NameError: name 'SECRET_IN_KERNEL' is not defined"
        assert "NameError" in result.stderr
        probe = await sb.run("import os, sys; (os.getpid(), os.environ.get('NBR_TEST_SECRET'))")
        pid, secret = eval(probe.stdout)
        assert pid != os.getpid() and secret is None
        assert SECRET_IN_KERNEL == "kernel-only-value"  # it exists here


async def test_clean_temporary_working_directory() -> None:
    async with PythonSandbox(timeout=10) as sb:
        workdir = sb.workdir
        assert workdir is not None
        result = await sb.run("import os; print(os.getcwd()); print(os.listdir('.'))")
        assert result.stdout == f"{os.path.realpath(workdir)}\n[]\n"
        await sb.run("open('out.txt', 'w').write('hi')")
        assert (workdir / "out.txt").read_text() == "hi"
    assert not workdir.exists()


async def test_infinite_loop_is_interrupted_and_state_kept() -> None:
    async with PythonSandbox(timeout=1, grace=2) as sb:
        await sb.run("kept = 7")
        started = time.perf_counter()
        result = await sb.run("while True:\n    pass")
        assert time.perf_counter() - started < 2.5
        assert result.timed_out and not result.restarted
        assert "time limit" in (result.error or "") and "time limit" in result.text
        assert (await sb.run("kept")).stdout == "7\n"


async def test_uninterruptible_loop_is_killed_and_restarted() -> None:
    async with PythonSandbox(timeout=1, grace=0.5) as sb:
        await sb.run("kept = 7")
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
        started = time.perf_counter()
        result = await sb.run(code)
        assert time.perf_counter() - started < 3
        assert result.timed_out and result.restarted and "restarted" in result.text
        after = await sb.run("print('alive'); kept")
        assert after.stdout == "alive\n" and after.error is not None  # fresh process, state gone


async def test_a_dying_process_is_reported_and_replaced() -> None:
    async with PythonSandbox(timeout=10) as sb:
        result = await sb.run("import os; os._exit(3)")
        assert result.restarted and "status 3" in (result.error or "")
        assert (await sb.run("1 + 1")).stdout == "2\n"


async def test_huge_output_is_capped() -> None:
    async with PythonSandbox(timeout=20, max_output=1000) as sb:
        result = await sb.run("for i in range(30000):\n    print('line', i)")
        assert result.truncated and result.error is None
        assert len(result.stdout) < 1200
        assert result.stdout.startswith("line 0\nline 1\n")
        assert "output truncated" in result.stdout
        assert (await sb.run("print('next')")).stdout == "next\n"  # no leftovers


async def test_errors_and_stderr_are_reported_without_driver_frames() -> None:
    async with PythonSandbox(timeout=10) as sb:
        result = await sb.run("import sys\nprint('to err', file=sys.stderr)\n1/0")
        assert result.error == "ZeroDivisionError: division by zero"
        assert result.stderr.startswith("to err\nTraceback")
        assert "sandbox_driver" not in result.stderr and '<cell 1>", line 3' in result.stderr


@pytest.mark.parametrize(
    ("isolation", "isolate"),
    [("bwrap", True), ("none", True), ("none", False)],
    ids=["bwrap", "none-namespace-if-possible", "none-guard-only"],
)
async def test_socket_connect_to_localhost_fails(isolation: str, isolate: bool) -> None:
    connections = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sandbox = PythonSandbox(timeout=10, isolation=isolation, isolate_network=isolate)  # type: ignore[arg-type]
        async with sandbox as sb:
            assert sb.network == ("python-guard" if not isolate else sb.network)
            assert isolation == "none" or sb.network == "namespace"
            code = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))"
            result = await sb.run(code)
            assert result.error is not None and "Error" in result.error
            urllib_code = (
                f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/')"
            )
            assert (await sb.run(urllib_code)).error is not None
            if sb.network == "namespace":  # the guarantee holds below Python too
                raw = f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))"
                error = ((await sb.run(raw)).error or "").lower()  # nothing listens in there
                assert "unreachable" in error or "refused" in error
        await asyncio.sleep(0.1)
        assert connections == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_concurrent_runs_are_serialised() -> None:
    async with PythonSandbox(timeout=10) as sb:
        await sb.run("n = 0")
        await asyncio.gather(*(sb.run("n += 1") for _ in range(5)))
        assert (await sb.run("n")).stdout == "5\n"


async def test_blocking_calls_are_interrupted_too() -> None:
    """The interrupt reaches the code's thread even inside a C call (``time.sleep``)."""
    async with PythonSandbox(timeout=1, grace=3) as sb:
        started = time.perf_counter()
        result = await sb.run("import time\ntime.sleep(100)")
        assert result.timed_out and not result.restarted
        assert "KeyboardInterrupt" in result.stderr and time.perf_counter() - started < 3


async def test_missing_isolation_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_sandbox, "bwrap_problem", lambda: "bubblewrap is not installed")
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap is not installed.*isolation='none'"):
        async with PythonSandbox(timeout=10):
            pass
    assert "python_isolation='none'" in (PythonTool.unavailable() or "")
    assert PythonTool.unavailable(isolation="none") is None
    async with PythonSandbox(timeout=10, isolation="none") as sb:  # the explicit opt-out
        assert (await sb.run("1 + 1")).stdout == "2\n"
