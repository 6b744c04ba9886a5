"""The built-in python tool: model code runs in its own stateful, time-limited, isolated process.

The threat model: the code is written by a model, which may have read text an attacker wrote,
so it is treated as hostile. What is guaranteed, with the default ``isolation="bwrap"``:

* **A box of its own** (bubblewrap, from Debian's ``bubblewrap`` package): new user, PID,
  mount, IPC, UTS and network namespaces. The code runs as an unprivileged user in a fresh
  filesystem that holds only a read-only view of the system's ``/usr`` and of the Python
  installation the kernel uses (so numpy, pandas... import), a private ``/tmp`` and a writable
  working directory, deleted on close. It sees no ``/proc`` of other processes (the kernel's
  environment, memory and files stay out of reach), no home directory, no ``/etc`` beyond the
  dynamic linker's cache, no project, no model cache; it cannot signal the kernel.
* **No network**: an empty network namespace (no interface but a down loopback), and
  ``socket`` refusing internet families as a second layer.
* **Limits** (rlimits, per sandbox, with defaults): address space (``max_memory``, 1 GiB),
  processes (``max_processes`` more than this user already runs, threads counted as the kernel
  counts them), file size (256 MiB), open
  files (256), CPU seconds (``max_cpu``, 600 across the sandbox's runs).
* **Nothing outlives it**: closing the sandbox kills its PID namespace, so every process the
  code started (``setsid`` ones too) ends with it.
* **Time limit** per run: a run that exceeds ``timeout`` is interrupted (KeyboardInterrupt;
  state kept); if it does not stop within ``grace`` seconds the sandbox is killed and the next
  run starts a fresh one (state lost). Both are reported to the model.
* **Output cap**: at most ``max_output`` bytes of stdout and of stderr are kept per run; the
  rest is counted and dropped as it arrives, and the text says so.
* **State persists** across ``run`` calls of one sandbox (one sandbox per response), like
  notebook cells; a trailing expression's value is printed.

Where bubblewrap is missing or cannot create its namespaces (some containers forbid user
namespaces), starting a sandbox raises ``SandboxUnavailable`` naming what is missing. Passing
``isolation="none"`` opts out explicitly: a separate ``python -I`` process with a clean
environment and a temporary working directory, no network when ``unshare`` can make a network
namespace (else the ``socket`` guard alone, best effort), the rlimits above, and nothing else:
the code can then read what the kernel's user can read.
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
Isolation = Literal["bwrap", "none"]
DEFAULT_MEMORY = 1 << 30  # bytes of address space
DEFAULT_PROCESSES = 64  # processes beyond those this user already runs
DEFAULT_FILE_SIZE = 256 << 20  # bytes per file written
DEFAULT_OPEN_FILES = 256
DEFAULT_CPU = 600  # CPU seconds over the sandbox's life
TMP_SIZE = 256 << 20  # bytes of the sandbox's /tmp (memory, which RLIMIT_AS does not count)


class SandboxUnavailable(RuntimeError):
    """The isolation the sandbox was asked for cannot be had on this machine."""


SANDBOX_UID = 65534  # "nobody": the user model code runs as


def _as_root() -> bool:
    """A kernel running as root (containers, CI) gets a different bubblewrap set-up, below."""
    return os.geteuid() == 0


def _bwrap_command(workdir: Path, driver: Path, env: dict[str, str]) -> list[str]:
    """bubblewrap: new namespaces, a read-only system and Python, a private /tmp and working
    directory (see the module docstring).

    Run by an ordinary user, bwrap makes a user namespace in which the code is uid 65534 (the
    kernel's user outside, so rlimits on processes count that user's). Run by root, a user
    namespace would leave the code root outside, which the kernel exempts from the process
    limit; so bwrap makes the other namespaces without one, keeps only the capabilities to
    change user, and the driver becomes the real ``nobody`` before it reads any code (and
    no_new_privs, which bwrap sets, stops it from ever gaining them back).
    """
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    if _as_root():
        cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        cmd += ["--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            cmd += ["--ro-bind", top, top]
    for extra in ("/etc/ld.so.cache", "/etc/localtime"):
        cmd += ["--ro-bind-try", extra, extra]
    # /proc, /dev and the private /tmp first: a Python or working directory under /tmp (a
    # venv in a CI checkout there, mkdtemp's default) is then bound on top of it, not hidden
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]  # /tmp is memory
    binds = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(sys.exec_prefix).resolve()}  # fmt: skip
    binds = {prefix for prefix in binds if not prefix.is_relative_to("/usr")}
    made: set[Path] = {Path("/"), Path("/tmp")}
    for target in sorted(binds | {workdir}):
        for parent in reversed(target.parents):  # bwrap would make them 0700, root's
            if parent not in made:
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for prefix in sorted(binds):
        cmd += ["--ro-bind", str(prefix), str(prefix)]
    cmd += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir)]
    cmd += ["--ro-bind", str(driver), "/nbr/sandbox_driver.py"]
    cmd += ["--remount-ro", "/"]  # the root is a tmpfs: writable, it would be uncounted memory
    if _as_root():
        cmd += ["--setenv", "NBR_SANDBOX_USER", str(SANDBOX_UID)]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate a sandbox here (None when it can)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    workdir = _make_workdir()
    try:
        cmd = _bwrap_command(workdir, DRIVER, {"PATH": "/usr/bin:/bin"})
        probe = subprocess.run(
            [*cmd, "--", sys.executable, "-I", "-c", PROBE],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap failed to start: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if probe.returncode != 0:
        message = probe.stderr.decode(errors="replace").strip() or f"status {probe.returncode}"
        return f"bubblewrap cannot create the sandbox here: {message[-500:]}"
    return None


# what the probe checks: the driver's switch of user works and the working directory is
# writable by the user the code runs as
PROBE = (
    "import os\n"
    "uid = int(os.environ.get('NBR_SANDBOX_USER', '-1'))\n"
    "if uid >= 0: os.setgroups([]); os.setgid(uid); os.setuid(uid)\n"
    "open('probe', 'w').close()"
)


def _make_workdir() -> Path:
    """A private working directory the code's user owns (``nobody``'s when the kernel is root)."""
    workdir = Path(tempfile.mkdtemp(prefix="nbr-python-"))
    if _as_root():
        os.chown(workdir, SANDBOX_UID, SANDBOX_UID)
        workdir.chmod(0o711)  # bwrap, root without capabilities by then, must chdir into it
    return workdir


def _kernel() -> tuple[int, int]:
    release = os.uname().release.split(".")
    try:
        return int(release[0]), int("".join(c for c in release[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _user_tasks(uid: int) -> int:
    """Tasks whose real user is ``uid`` now: what RLIMIT_NPROC counts.

    The kernel counts threads, not processes, and by real uid; ``/proc/<pid>``'s owner is the
    effective uid, or root for a process made non-dumpable by a change of user (every sandbox's
    driver). Counting directories by owner missed both, so another process of ``nobody`` with
    threads (a daemon, a lingering sandbox) ate the sandbox's allowance and its forks failed.
    """
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry.name}/status", "rb") as status:
                fields = dict(line.split(b":", 1) for line in status if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                count += int(fields[b"Threads"])
    return count


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


def _ending(status: int | None) -> str:
    """How the driver ended: bwrap reports a signal as 128 + its number, Python as minus it."""
    if status is not None and (status < 0 or (status > 128)):
        number = -status if status < 0 else status - 128
        with contextlib.suppress(ValueError):
            name = signal.Signals(number).name
            limit = {"SIGKILL": "a limit (CPU time) or a kill", "SIGXCPU": "the CPU time limit",
                     "SIGSEGV": "a crash"}.get(name)  # fmt: skip
            return f"was killed by {name}" + (f" ({limit})" if limit else "")
    return f"exited (status {status})"


class PythonSandbox:
    """``async with PythonSandbox(timeout=10) as sb: result = await sb.run("print(1)")``."""

    def __init__(
        self,
        *,
        timeout: float = 120.0,
        max_output: int = 20_000,
        grace: float = 2.0,
        max_memory: int | None = DEFAULT_MEMORY,
        max_processes: int = DEFAULT_PROCESSES,
        max_cpu: int = DEFAULT_CPU,
        isolation: Isolation = "bwrap",
        isolate_network: bool = True,
    ) -> None:
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        self.timeout = timeout
        self.max_output = max_output
        self.grace = grace
        self.max_memory = max_memory
        self.max_processes = max_processes
        self.max_cpu = max_cpu
        self.isolation = isolation
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
            self._workdir = _make_workdir()
        if self._proc is None or self._proc.returncode is not None:
            await self._spawn()

    async def close(self) -> None:
        await self._kill()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    async def _spawn(self) -> None:
        assert self._workdir is not None
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self._workdir),
            "TMPDIR": str(self._workdir),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "MPLBACKEND": "Agg",
            "OPENBLAS_NUM_THREADS": "1",  # its thread buffers would use the address space up
            "OMP_NUM_THREADS": "1",
            "NBR_SANDBOX_LIMITS": json.dumps(self._limits()),
        }
        if self.isolation == "bwrap":
            problem = await asyncio.to_thread(bwrap_problem)
            if problem is not None:
                raise SandboxUnavailable(
                    f"the python sandbox cannot isolate model code: {problem}. Install it, or "
                    "opt out with isolation='none' (the code can then read what this user can)"
                )
            self.network = "namespace"
            argv = [*_bwrap_command(self._workdir, DRIVER, env), "--", sys.executable, "-I",
                    "-u", "/nbr/sandbox_driver.py"]  # fmt: skip
            env = {}
        else:
            prefix = await asyncio.to_thread(_unshare_prefix) if self._isolate else ()
            self.network = "namespace" if prefix else "python-guard"
            argv = [*prefix, sys.executable, "-I", "-u", str(DRIVER)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self._workdir,
            env=env,
            start_new_session=True,  # its own process group: a kill reaches what it started
        )
        self._leftover = {"stdout": b"", "stderr": b""}

    @property
    def _uid(self) -> int:
        """The user the code runs as, outside any namespace."""
        return SANDBOX_UID if self.isolation == "bwrap" and _as_root() else os.getuid()

    def _process_limit(self) -> int:
        """RLIMIT_NPROC counts a user's tasks: all of them for a uid outside any user
        namespace, and (Linux 5.14 on) only those inside one for a namespace's own user."""
        if self.isolation == "bwrap" and not _as_root() and _kernel() >= (5, 14):
            return self.max_processes
        return _user_tasks(self._uid) + self.max_processes

    def _limits(self) -> dict[str, int]:
        """rlimits the driver sets on itself before any model code runs (soft = hard)."""
        limits = {
            "RLIMIT_NPROC": self._process_limit(),
            "RLIMIT_FSIZE": DEFAULT_FILE_SIZE,
            "RLIMIT_NOFILE": DEFAULT_OPEN_FILES,
            "RLIMIT_CPU": self.max_cpu,
        }
        if self.max_memory:
            limits["RLIMIT_AS"] = int(self.max_memory)
        return limits

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
            with contextlib.suppress(OSError):  # (the driver may be gone)
                proc.stdin.write(b'{"interrupt": true}\n')
                await proc.stdin.drain()
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
            ending = _ending(proc.returncode)
            error = f"the python process {ending} and was restarted; variables are lost"
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
