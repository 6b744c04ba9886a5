"""What model code must not do from the python sandbox: each test makes the attempt, asserts it
is blocked under the default isolation, and, where the attempt could succeed at all, shows it
succeeding with ``isolation="none"`` (so the probe is real, not a test that cannot fail).

Run as root (CI) and as an ordinary user (the two set-ups of ``_bwrap_command``): as a user,
``NBRESPONSES_REQUIRE_SANDBOX=1 setpriv --reuid=65534 ... pytest tests/tools``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT
from helpers.sandbox import needs_bwrap

from nbresponses.tools import PythonSandbox

pytestmark = needs_bwrap
NONE: dict[str, Any] = {"isolation": "none", "isolate_network": False}  # the control: a process


async def run(sb: PythonSandbox, code: str) -> str:
    result = await sb.run(code)
    assert result.error is None, result.text
    return result.stdout


async def test_other_processes_and_their_environments_are_out_of_sight() -> None:
    """The kernel's /proc (environ, mem, fds) is the way to its API keys: it must not exist."""
    secret = f"sk-{secrets.token_hex(8)}"
    env = {**os.environ, "NBR_ESCAPE_SECRET": secret}
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    probe = (
        "import os\n"
        "seen = found = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    seen += 1\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            with open(f'/proc/{pid}/{name}', 'rb') as f:\n"
        f"                found += {secret!r}.encode() in f.read()\n"
        "        except OSError:\n"
        "            pass\n"
        f"print(seen, found, os.path.exists('/proc/{holder.pid}'), "
        f"os.path.exists('/proc/{os.getpid()}/mem'))"
    )
    try:
        async with PythonSandbox(timeout=10) as sb:
            seen, found, holder_visible, kernel_visible = (await run(sb, probe)).split()
            assert int(seen) <= 3  # bwrap's init, the driver, at most one helper
            assert (found, holder_visible, kernel_visible) == ("0", "False", "False")
        async with PythonSandbox(timeout=10, **NONE) as sb:
            assert (await run(sb, probe)).split()[1:] == ["1", "True", "True"]
    finally:
        holder.kill()
        holder.wait()


async def test_the_kernel_cannot_be_signalled() -> None:
    code = f"import os\ntry:\n    os.kill({os.getpid()}, 0)\nexcept OSError as e:\n"
    code += "    print(type(e).__name__)"
    async with PythonSandbox(timeout=10) as sb:
        assert await run(sb, code) == "ProcessLookupError\n"
    async with PythonSandbox(timeout=10, **NONE) as sb:
        assert await run(sb, code) == ""  # signal 0 reached the kernel: it could have been a kill


@pytest.mark.parametrize("where", ["etc", "home", "project", "model_cache", "outside_tmp"])
async def test_files_outside_the_sandbox_are_invisible(where: str, tmp_path: Path) -> None:
    path = {
        "etc": Path("/etc/passwd"),
        "home": Path.home(),
        "project": ROOT / "pyproject.toml",
        "model_cache": Path(os.environ.get("NBRESPONSES_TEST_CACHE", Path.home() / ".cache")),
        "outside_tmp": tmp_path / "secret.txt",
    }[where]
    if where == "outside_tmp":
        path.write_text("kernel-only")
    assert path.exists()
    code = f"import os\nprint(os.path.exists({str(path)!r}) and os.listdir({str(path)!r}) "
    code += f"if os.path.isdir({str(path)!r}) else os.path.exists({str(path)!r}))"
    async with PythonSandbox(timeout=10) as sb:
        seen = await run(sb, code)
    if where == "home":  # it may hold the Python installation (pyenv): that alone is bound
        prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
        allowed = {part.name for p in prefixes for part in [p, *p.parents] if part.parent == path}
        assert seen in ("False\n", *(f"{sorted(allowed)!r}\n",) * bool(allowed)), seen
    else:
        assert seen == "False\n"
    async with PythonSandbox(timeout=10, **NONE) as sb:
        assert (await run(sb, code)) != "False\n"


@pytest.mark.parametrize("target", ["system", "python", "driver", "root"])
async def test_nothing_outside_the_working_directory_is_writable(target: str) -> None:
    path = {
        "system": "/usr/nbr-escape",
        "python": str(Path(sys.prefix) / "nbr-escape"),
        "driver": "/nbr/nbr-escape",
        "root": "/nbr-escape",
    }[target]
    code = f"try:\n    open({path!r}, 'w').write('x')\n    print('written')\n"
    code += "except OSError as e:\n    print(type(e).__name__)"
    async with PythonSandbox(timeout=10) as sb:
        assert (await run(sb, code)) in ("PermissionError\n", "OSError\n")
        assert (
            await run(sb, "open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())")
            == "ok\n"
        )
        assert await run(sb, "open('/tmp/scratch', 'w').write('ok')") == "2\n"
    assert not Path(path).exists()


FORKS = (
    "import os, time\n"
    "children = []\n"
    "try:\n"
    "    for _ in range(500):\n"
    "        pid = os.fork()\n"
    "        if pid == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        children.append(pid)\n"
    "except OSError as e:\n"
    "    print(len(children), type(e).__name__)\n"
    "for pid in children:\n"
    "    os.kill(pid, 9)\n"
    "    os.waitpid(pid, 0)\n"
)


async def test_process_count_is_limited() -> None:
    async with PythonSandbox(timeout=20, max_processes=16) as sb:
        count, error = (await run(sb, FORKS)).split()
        assert 0 < int(count) < 16 and error == "BlockingIOError"
        assert await run(sb, "print('alive')") == "alive\n"


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not shutil.which("setpriv"),
    reason="starts a process as the sandbox's user (root, setpriv and a system python)",
)
async def test_the_users_threads_elsewhere_leave_the_allowance() -> None:
    """RLIMIT_NPROC counts every thread of ``nobody`` on the machine: a daemon of that user with
    80 threads, counted as one process, once left the sandbox no fork at all (a CI failure)."""
    holder = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
         "import threading, sys\n"
         "done = threading.Event()\n"
         "for _ in range(80):\n"
         "    threading.Thread(target=done.wait, daemon=True).start()\n"
         "print('ready', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        async with PythonSandbox(timeout=20, max_processes=16) as sb:
            count, error = (await run(sb, FORKS)).split()
            assert 0 < int(count) < 16 and error == "BlockingIOError"
    finally:
        holder.kill()
        holder.wait()


async def test_memory_is_limited_by_default() -> None:
    async with PythonSandbox(timeout=20) as sb:
        result = await sb.run("blob = bytearray(4 * 2**30)")
        assert result.error == "MemoryError" and not result.restarted
        assert (
            await run(sb, "blob = bytearray(100 * 2**20)\nprint(len(blob))") == f"{100 * 2**20}\n"
        )
        assert await run(sb, "import numpy, pandas\nprint(int(numpy.arange(4).sum()))") == "6\n"


async def test_file_size_open_files_and_tmp_are_limited() -> None:
    async with PythonSandbox(timeout=30) as sb:
        big = await sb.run("open('big', 'wb').write(b'x' * (300 * 2**20))")
        assert (big.error or "").startswith("OSError: [Errno 27] File too large"), big.text
        many = await sb.run("files = [open(f'f{i}', 'w') for i in range(400)]")
        assert (many.error or "").startswith("OSError: [Errno 24] Too many open files"), many.text
        tmp = await sb.run(
            "for i in range(3):\n    open(f'/tmp/t{i}', 'wb').write(b'x' * (200 * 2**20))"
        )
        assert "No space left" in (tmp.error or ""), tmp.text


async def test_cpu_time_is_limited() -> None:
    async with PythonSandbox(timeout=20, max_cpu=1) as sb:
        result = await sb.run("while True:\n    pass")
        assert result.restarted and not result.timed_out
        assert "SIGKILL" in (result.error or "") or "SIGXCPU" in (result.error or ""), result.error
        assert result.duration < 10


async def test_no_process_outlives_the_sandbox() -> None:
    """A setsid'd, double-forked child is still in the sandbox's PID namespace: it dies too."""
    token = f"nbr-orphan-{secrets.token_hex(6)}"
    code = (
        "import subprocess, sys\n"
        "argv = ['setsid', sys.executable, '-c', 'import time; time.sleep(120)', "
        f"{token!r}]\n"
        "subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,"
        " stderr=open('setsid.err', 'w'))\n"
    )

    def alive() -> int:
        count = 0
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                count += token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes()
        return count

    async def until(done: Callable[[], bool]) -> None:
        """Poll until ``done()``, for up to 30 s: a process starting or dying on a loaded
        machine (the suite's two workers) once took more than the 2.5 s this test gave it."""
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async with PythonSandbox(timeout=10) as sb:
        await run(sb, code)
        await until(lambda: alive() > 0)
        # the probe sees it while the sandbox is open (else: what setsid said, e.g. a fork refused)
        assert alive() == 1, await run(sb, "print(open('setsid.err').read())")
    await until(lambda: alive() == 0)
    assert alive() == 0
