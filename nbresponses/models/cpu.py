"""CPU feature detection: which int8 kernels ONNX Runtime can use here, recorded in manifests."""

from __future__ import annotations

import functools
import os
import platform

# Flags (as /proc/cpuinfo names them) that decide which quantized kernels are fast.
_INTERESTING = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_bf16",
)


@functools.cache
def cpu_features() -> dict[str, object]:
    """Machine, model name, core count and the SIMD flags that matter for int8 inference."""
    flags: set[str] = set()
    model_name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name" and not model_name:
                    model_name = value.strip()
    except OSError:  # not Linux: leave the flags empty, recipes still work (slower kernels)
        pass
    return {
        "machine": platform.machine(),
        "model_name": model_name,
        "logical_cores": os.cpu_count() or 1,
        "flags": sorted(f for f in _INTERESTING if f in flags),
    }


def has_vnni() -> bool:
    """True when the CPU has AVX512-VNNI (or AVX-VNNI): int8 dot products in one instruction."""
    flags = cpu_features()["flags"]
    assert isinstance(flags, list)
    return "avx512_vnni" in flags or "avx_vnni" in flags


def physical_cores() -> int:
    """Physical cores (threads per core folded); ONNX Runtime scales best on these."""
    try:
        cores: set[tuple[str, str]] = set()
        physical_id = core_id = ""
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical_id = value.strip()
                elif key == "core id":
                    core_id = value.strip()
                    cores.add((physical_id, core_id))
        if cores:
            return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1
