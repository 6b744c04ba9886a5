"""The program inside the python sandbox's child process (run as a script, never imported).

Protocol: one JSON request per line on stdin ``{"code": ..., "nonce": ...}``; the code runs in
a namespace that persists across requests (like notebook cells; the value of a trailing
expression is printed). When it is done the driver writes ``\\x1e<nonce>\\x1e<json>\\n`` on
stdout and ``\\x1e<nonce>\\x1e\\n`` on stderr, so the parent knows where each run's output ends.
Tracebacks go to stderr. A ``{"interrupt": true}`` line interrupts the running code (the
parent's time limit; KeyboardInterrupt in the main thread) and is ignored between runs; it comes
on stdin rather than as a signal from the parent because, inside bubblewrap, the parent's child
is bwrap, not this process. A reader thread takes the lines so an interrupt gets through while
a cell runs.
"""

import ast
import contextlib
import errno
import json
import linecache
import os
import queue
import signal
import socket
import sys
import threading
import traceback

MAX_ERROR = 4000
_BLOCKED = {socket.AF_INET, socket.AF_INET6} | (
    {socket.AF_PACKET} if hasattr(socket, "AF_PACKET") else set()
)


class _NoNetworkSocket(socket.socket):
    """``socket.socket`` that refuses internet families (best effort: ``_socket`` bypasses it)."""

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and (socket.AF_INET if family == -1 else family) in _BLOCKED:
            raise OSError(errno.EACCES, "network access is disabled in this sandbox")
        super().__init__(family, type, proto, fileno)


def _no_network(*args, **kwargs):
    raise OSError(errno.EACCES, "network access is disabled in this sandbox")


def _guard_network():
    socket.socket = _NoNetworkSocket
    socket.SocketType = _NoNetworkSocket
    socket.create_connection = _no_network
    socket.getaddrinfo = _no_network


def _become_nobody():
    """Under a root kernel the sandbox starts as root (without a user namespace; see
    ``python_sandbox._bwrap_command``): become the user it names before any code runs."""
    uid = int(os.environ.pop("NBR_SANDBOX_USER", "-1"))
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # all capabilities go with root's uid


def _set_limits():
    """The parent's rlimits (soft = hard: the code cannot raise them again)."""
    import resource

    for name, value in json.loads(os.environ.pop("NBR_SANDBOX_LIMITS", "{}")).items():
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(getattr(resource, name), (int(value), int(value)))


_running = False


def _on_sigint(signum, frame):
    if _running:
        raise KeyboardInterrupt


def _run(code, namespace, cell):
    """Execute one cell; returns an error summary or None."""
    global _running
    filename = f"<cell {cell}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        _running = True
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
        return None
    except SystemExit as exc:
        return f"SystemExit: {exc.code}"
    except BaseException as exc:
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        frames = [f for f in report.stack if f.filename != __file__]  # hide the driver's own
        report.stack = traceback.StackSummary.from_list(frames)
        sys.stderr.write("".join(report.format()))
        return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:MAX_ERROR]
    finally:
        _running = False


def _read_requests(lines, requests, main_thread):
    """Queue each request; an interrupt goes straight to the main thread as SIGINT."""
    for line in lines:
        request = json.loads(line)
        if request.get("interrupt"):
            if _running:
                signal.pthread_kill(main_thread, signal.SIGINT)
        else:
            requests.put(request)
    requests.put(None)


def main():
    lines = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the code cannot read (or steal) the protocol
    sys.stdin = open(os.devnull)  # noqa: SIM115
    out, err = sys.stdout, sys.stderr
    signal.signal(signal.SIGINT, _on_sigint)
    _become_nobody()
    _set_limits()
    _guard_network()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    requests = queue.SimpleQueue()
    reader = threading.Thread(
        target=_read_requests, args=(lines, requests, threading.get_ident()), daemon=True
    )
    reader.start()
    cell = 0
    while (request := requests.get()) is not None:
        cell += 1
        error = _run(request["code"], namespace, cell)
        sys.stdout, sys.stderr = out, err
        for stream in (out, err):
            with contextlib.suppress(Exception):
                stream.flush()
        nonce = request["nonce"]
        result = json.dumps({"error": error})
        os.write(2, f"\x1e{nonce}\x1e\n".encode())
        os.write(1, f"\x1e{nonce}\x1e{result}\n".encode())


if __name__ == "__main__":
    main()
