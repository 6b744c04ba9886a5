"""Our ONNX Runtime operators (domain ``ai.nbresponses``), compiled from source on first use.

Why compiled here: ONNX Runtime loads custom operators from a shared library built against its
C API headers, and no wheel ships those; the source is small, so the first session that needs
it builds it for this CPU (``-march=native``: AVX-512 or AVX2 with F16C and FMA) into the model
cache, keyed by source, compiler, headers and CPU, and every later session loads it.

The headers: ``$NBRESPONSES_ORT_INCLUDE``, else ``<venv>/include/onnxruntime`` (``make`` puts
Debian's ``libonnxruntime-dev`` headers there), else the system's include folders. The C API is
versioned and ONNX Runtime serves older versions, so headers older than the runtime work.

Operators (``register.cc`` adds them to the domain):

- ``KVAttention`` (``kv_attention.cc``): the step's keys and values written into the KV
  buffers in place, then attention read straight from them (``attention.attention(kernel=True)``
  puts it in a graph);
- ``QuantizeRows`` (``quantize_rows.cc``) and ``OutlierProduct`` (``outlier_product.cc``): the
  integer products' row quantization and outlier channels, one node each
  (``fused._IntegerGraph(quantizer="kernel")``);
- ``GroupProduct`` (``group_product.cc``): an integer product with a scale per group of input
  channels, weights and rows alike, in VNNI's vpdpbusd, or AVX2's byte products without it
  (``fused._IntegerGraph(grouped=...)``: ``fused-int8-kernel``'s products);
- ``GatedSilu`` (``gated_silu.cc``): an MLP's silu(gate) * up in one node, the bits of ONNX
  Runtime's QuickGelu and Mul (the kernel recipes' Llama-style MLPs).

Besides the operators, one plain C function (``token_stats.cc``, called through ``ctypes``:
``token_stats``): a row of logits to a token's logprob, rank and entropy, which the engine
computes for every scored or reported token of a model that uses the operators.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import mmap
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from nbresponses.models.cache import MANIFEST, build_once, cache_root, write_manifest

DOMAIN = "ai.nbresponses"
INCLUDE_ENV = "NBRESPONSES_ORT_INCLUDE"
_SOURCES = (
    "kv_attention.cc",
    "quantize_rows.cc",
    "outlier_product.cc",
    "group_product.cc",
    "gated_silu.cc",
    "skip_norm.cc",
    "token_stats.cc",
    "register.cc",
)
_HEADERS = ("simd.h",)  # included by the sources: part of their digest
_LIBRARY = "libnbresponses_kernels.so"
_HEADER = "onnxruntime_cxx_api.h"
_SYSTEM_INCLUDES = ("/usr/include/onnxruntime", "/usr/local/include/onnxruntime")
# what the source needs of the CPU (besides x86-64); -march=native picks the widest it has
_NEEDED = ("avx512f", "avx2", "f16c", "fma")


class KernelsUnavailable(RuntimeError):
    """The operators cannot be built here (no compiler, no headers, or an unsuited CPU)."""


def uses_kernels(model_path: str | os.PathLike[str], operator: str | None = None) -> bool:
    """Whether an ONNX file names our domain, or with ``operator``, that operator of ours (a
    byte search: the protobuf need not be parsed, and a model's inline weights are only
    scanned, not copied)."""
    with open(model_path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = data.find(DOMAIN.encode()) >= 0
            return found and (operator is None or data.find(operator.encode()) >= 0)


@functools.cache  # the files do not change under a running process; read and hashed once
def source_digest() -> str:
    """The operators' source, hashed: the kernel recipes' params hold it, so a changed operator
    (other sums, other bits) prepares their models again and measures their fidelity again."""
    digest = hashlib.sha256()
    for name in (*_SOURCES, *_HEADERS):
        digest.update(Path(__file__).with_name(name).read_bytes())
    return digest.hexdigest()[:12]


def register(options: Any, flags: tuple[str, ...] = ()) -> None:
    """Register the operators with an ``onnxruntime.SessionOptions`` (built on first use;
    ``flags``: extra compiler flags, e.g. ``-mno-avx512f`` for the AVX2 code on a CPU that
    has both, as the tests do)."""
    options.register_custom_ops_library(str(library(flags=flags)))


def for_model(options: Any, model_path: str | os.PathLike[str]) -> Any:
    """``options``, with the operators registered if the model uses them (every session of a
    model file goes through here: the engine's runner, the lens, prepare's fidelity check)."""
    if uses_kernels(model_path):
        register(options)
    return options


def headers() -> Path:
    """The folder holding ONNX Runtime's C and C++ API headers."""
    candidates = [os.environ.get(INCLUDE_ENV)]
    candidates += [str(Path(sys.prefix) / "include" / "onnxruntime")]
    candidates += list(_SYSTEM_INCLUDES)
    for folder in candidates:
        if folder and (Path(folder) / _HEADER).is_file():
            return Path(folder)
    raise KernelsUnavailable(
        f"ONNX Runtime's C++ API headers ({_HEADER}) were not found: set ${INCLUDE_ENV} to the "
        "folder holding them, or run `make kernel-deps` (it unpacks Debian's libonnxruntime-dev "
        "into the venv)"
    )


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelsUnavailable("no C++ compiler (g++) to build nbresponses' ONNX operators")
    return compiler


def _cpu_flags() -> list[str]:
    """Every instruction-set flag of this CPU, sorted: -march=native may use any of them, so a
    cache shared by machines must not hand one machine's build to another."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return sorted(set(line.split(":", 1)[-1].split()))


def _commands(
    compiler: str, include: Path, output: Path, flags: tuple[str, ...]
) -> tuple[list[list[str]], list[str]]:
    """(one compile command per source, each writing its object beside ``output``; the link
    command). The sources compile to the objects one ``g++ a.cc b.cc -shared`` would make, so
    the library's code is the same; apart, they can run at once."""
    options = ["-O3", "-march=native", "-std=c++17", "-fPIC", f"-I{include}", *flags]
    sources = [Path(__file__).with_name(name) for name in _SOURCES]
    objects = [output.with_name(f"{source.stem}.o") for source in sources]
    compiles = [
        [compiler, *options, "-c", str(source), "-o", str(obj)]
        for source, obj in zip(sources, objects, strict=True)
    ]
    link = [compiler, "-shared", "-fPIC", *flags, *map(str, objects), "-o", str(output)]
    return compiles, link


def _run_all(commands: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Every command's result, in order; run as many at a time as this process has cores, the
    largest source first: ``kv_attention.cc`` alone takes 20 s of the 30 the sources take one
    after another (2 cores, AVX-512), so the others compile beside it, in 16 s in all where
    one ``g++`` command took 25."""
    size = [Path(c[c.index("-c") + 1]).stat().st_size for c in commands]
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        runs = {
            i: pool.submit(_run, commands[i])
            for i in sorted(range(len(commands)), key=lambda i: -size[i])
        }
        return [runs[i].result() for i in range(len(commands))]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True)


def _succeeded(command: list[str], done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise KernelsUnavailable(
            f"building nbresponses' ONNX operators failed:\n{' '.join(command)}\n"
            f"{done.stderr[-4000:]}"
        )


@functools.cache  # once a process: it runs the compiler and reads the headers and the CPU
def _key(compiler: str, include: Path, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256(source_digest().encode() + b" manifest 2")  # 2: names the source
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    header = (include / "onnxruntime_c_api.h").read_bytes()
    for part in (version.encode(), header, " ".join([*_cpu_flags(), *flags]).encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def _suited_cpu() -> list[str]:
    """The flags the source needs that this CPU has; raises where they do not suffice."""
    cpu = [flag for flag in _cpu_flags() if flag in _NEEDED]
    if not ({"avx512f"} <= set(cpu) or {"avx2", "f16c", "fma"} <= set(cpu)):
        raise KernelsUnavailable(
            f"nbresponses' ONNX operators need AVX-512 or AVX2 with F16C and FMA (CPU: {cpu})"
        )
    return cpu


def buildable() -> bool:
    """Whether the operators can be had here without building them now: a suited CPU, and a
    compiler with the headers, or a library this machine built already (``_built``). ``auto``
    puts the recipes that use them first only where they can be."""
    try:
        _suited_cpu()
        _compiler(), headers()
    except KernelsUnavailable:
        return _built() is not None
    return True


def _built(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """A library already built in the cache for this source and this CPU (all its flags), with
    no extra flags: what an environment without a compiler or the headers loads (an engine-only
    venv, a notebook server, sharing the cache of one that prepared the model). The same file
    gives the same bits wherever it is loaded; only building needs the tools."""
    want = {"source": source_digest(), "cpu": _cpu_flags(), "flags": []}
    for manifest in sorted((cache_root(cache_dir) / "kernels").glob(f"*/{MANIFEST}")):
        try:
            made = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        library = manifest.with_name(_LIBRARY)
        if {key: made.get(key) for key in want} == want and library.is_file():
            return library
    return None


def library(
    cache_dir: str | os.PathLike[str] | None = None, *, flags: tuple[str, ...] = ()
) -> Path:
    """The compiled operators for this machine: built once into the cache, then reused."""
    cpu = _suited_cpu()
    try:
        compiler, include = _compiler(), headers()
    except KernelsUnavailable:
        built = None if flags else _built(cache_dir)
        if built is None:
            raise
        return built
    folder = cache_root(cache_dir) / "kernels" / _key(compiler, include, flags)

    def build(tmp: Path) -> None:
        compiles, link = _commands(compiler, include, tmp / _LIBRARY, flags)
        for command, done in zip(compiles, _run_all(compiles), strict=True):
            _succeeded(command, done)
        _succeeded(link, _run(link))
        for obj in tmp.glob("*.o"):
            obj.unlink()
        write_manifest(
            tmp,
            {
                "command": [*compiles, link],
                "cpu_flags": cpu,
                "source": source_digest(),
                "cpu": _cpu_flags(),
                "flags": list(flags),
            },
        )

    return build_once(folder, build) / _LIBRARY


class TokenStats:
    """``token_stats.cc`` through ``ctypes``: ``stats(logits, token) -> (logprob, rank,
    entropy)`` of a float32 row, writing the row's whole log-softmax into ``logp`` when given
    (NaN throughout for a row with a NaN or no finite maximum, as numpy's); ``stats.top(logp,
    k)``: its k best (token, logprob) pairs, as ``sampling.top_k`` orders them.

    The definition is ``runtime/sampling.py``'s (numpy's float32 log-softmax with its sum in
    float64); three passes over the row instead of eight (~35 us a row of 49k logits against
    ~110). The logprob and the log-softmax are numpy's bits but for the last bit of values near
    0 (the normalizer's float64 sum differs in its ~16th digit); the entropy is nearer a float64
    computation than numpy's (tests/models/test_token_stats.py)."""

    def __init__(self, path: Path) -> None:
        loaded = ctypes.CDLL(str(path))
        function = loaded.nbr_token_stats
        function.restype = ctypes.c_int64
        function.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_float),
            ctypes.POINTER(ctypes.c_double),
        ]
        self._function = function
        top = loaded.nbr_top  # (logp, vocab, k, ids out, values out) -> how many
        top.restype = ctypes.c_int64
        top.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self._top = top
        rows = loaded.nbr_token_stats_rows  # (see token_stats.cc)
        rows.restype = None
        rows.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
        ]
        self._rows = rows
        self.path = path

    def __call__(
        self, logits: np.ndarray, token: int, logp: np.ndarray | None = None
    ) -> tuple[float, int, float]:
        row = np.ascontiguousarray(logits, np.float32)
        vocab = row.shape[0]
        if row.ndim != 1 or not 0 <= token < vocab:
            raise ValueError(f"one row of logits and a token in [0, {vocab}): got {token}")
        if logp is not None and (
            logp.shape != row.shape or logp.dtype != np.float32 or not logp.flags.c_contiguous
        ):
            raise ValueError("logp must be a contiguous float32 array of the row's shape")
        logprob, entropy = ctypes.c_float(), ctypes.c_double()
        rank = self._function(
            row.ctypes.data,
            vocab,
            int(token),
            None if logp is None else logp.ctypes.data,
            ctypes.byref(logprob),
            ctypes.byref(entropy),
        )
        return logprob.value, int(rank), entropy.value

    def top(self, logp: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
        """The ``k`` largest values of a float32 row with their indices, largest first, equal
        values by lower index, NaNs left out (``sampling.top_k``'s order)."""
        row = np.ascontiguousarray(logp, np.float32)
        if row.ndim != 1:
            raise ValueError(f"one row of logprobs: got shape {row.shape}")
        k = max(0, min(int(k), row.shape[0]))
        # fresh (20 values): ctypes lets go of the GIL, and two engines' threads share this
        ids, values = np.empty(k, np.int64), np.empty(k, np.float32)
        count = self._top(row.ctypes.data, row.shape[0], k, ids.ctypes.data, values.ctypes.data)
        return tuple(zip(ids[:count].tolist(), values[:count].tolist(), strict=True))

    def rows(
        self,
        logits: np.ndarray,
        tokens: Sequence[int],
        k: int = 0,
        logp: np.ndarray | None = None,
        threads: int = 1,
    ) -> RowStats:
        """Every row of ``logits`` [R, vocab] (float32, rows contiguous, any distance apart)
        with its token ``tokens[r]``: what ``__call__`` and ``top`` give a row alone, the same
        bits, on up to ``threads`` threads. ``logp`` [R, vocab] (contiguous float32) receives
        the log-softmaxes; ``k`` > 0 needs it (the best are read from it)."""
        if (
            logits.ndim != 2
            or logits.dtype != np.float32
            or logits.strides[1] != 4
            or logits.strides[0] < 0
            or logits.strides[0] % 4
        ):
            raise ValueError(f"rows of float32 logits: got {logits.dtype} {logits.shape}")
        count, vocab = logits.shape
        targets = np.asarray(tokens, np.int64)
        if targets.shape != (count,) or not ((targets >= 0) & (targets < vocab)).all():
            raise ValueError(f"one token in [0, {vocab}) a row: got {targets.tolist()}")
        if logp is None and k > 0:
            raise ValueError("the best k are read from the log-softmaxes: give logp")
        if logp is not None and (
            logp.shape != logits.shape or logp.dtype != np.float32 or not logp.flags.c_contiguous
        ):
            raise ValueError("logp must be a contiguous float32 array of the logits' shape")
        k = max(0, min(int(k), vocab))
        out = RowStats(
            logprob=np.empty(count, np.float32),
            rank=np.empty(count, np.int64),
            entropy=np.empty(count, np.float64),
            ids=np.empty((count, k), np.int64),
            values=np.empty((count, k), np.float32),
            counts=np.zeros(count, np.int64),
        )
        if count:
            self._rows(
                logits.ctypes.data,
                count,
                vocab,
                logits.strides[0] // 4,
                targets.ctypes.data,
                None if logp is None else logp.ctypes.data,
                out.logprob.ctypes.data,
                out.entropy.ctypes.data,
                out.rank.ctypes.data,
                k,
                out.ids.ctypes.data,
                out.values.ctypes.data,
                out.counts.ctypes.data,
                max(1, int(threads)),
            )
        return out


class RowStats(NamedTuple):
    """``TokenStats.rows``' numbers, row r at index r: the token's logprob, rank and entropy,
    and the k best (``ids[r, :counts[r]]``, ``values[r, :counts[r]]``)."""

    logprob: np.ndarray
    rank: np.ndarray
    entropy: np.ndarray
    ids: np.ndarray
    values: np.ndarray
    counts: np.ndarray


def token_stats(flags: tuple[str, ...] = ()) -> TokenStats:
    """The compiled ``nbr_token_stats`` of this machine's library (built on first use; one
    loaded library a process, and a set of ``flags``)."""
    return _token_stats(tuple(flags))


@functools.cache
def _token_stats(flags: tuple[str, ...]) -> TokenStats:
    return TokenStats(library(flags=flags))
