"""A Hugging Face folder's weights read one tensor at a time, never the whole model in memory.

Why: loading a 0.6B model in fp32 takes ~2 GB, and a prepare that holds it (plus the graph
being written, plus the fidelity reference) peaked at 2.8-3.7 GB: more than Binder's 2 GB.
Here the model is a skeleton (``accelerate.init_empty_weights``: parameters on the meta
device, so no memory; buffers such as the rotary frequencies computed as usual) and each
weight is read from its ``.safetensors`` file when asked for, converted to fp32 as
``from_pretrained(dtype=torch.float32)`` converts it (bf16 and fp16 widen exactly), and freed
when its reader lets go of it. The file is read, not memory-mapped: mapped pages would stay in
the process's resident set until the whole file is unmapped.

A folder streams only when its files hold exactly the skeleton's tensors (tied ones once),
with the skeleton's shapes, in fp32, fp16 or bf16, and the config asks for no quantization;
anything else (other names that ``from_pretrained`` would rename, ``.bin`` files, GGUF files,
quantized checkpoints) is loaded whole by ``from_pretrained`` as before.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# safetensors dtype -> how its bytes are read (bf16 as its 16 bits, widened below)
_READ: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}


class SafetensorsWeights(Mapping[str, Any]):
    """fp32 torch tensors by state-dict name, each read from disk when asked for (a fresh
    tensor every time: nothing is cached). ``aliases`` names tied parameters stored once."""

    def __init__(self, files: list[Path], aliases: Mapping[str, str] | None = None) -> None:
        self._where: dict[str, tuple[Path, str, tuple[int, ...], int]] = {}
        for path in files:
            for name, entry in read_header(path).items():
                self._where[name] = entry
        self.aliases = dict(aliases or {})

    def __getitem__(self, key: str) -> Any:
        import torch

        path, dtype, shape, offset = self._where[self.aliases.get(key, key)]
        count = int(np.prod(shape, dtype=np.int64))
        raw = np.fromfile(path, dtype=_READ[dtype], count=count, offset=offset)
        if dtype == "BF16":  # a bf16 number is the top half of the fp32 one: exact
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = raw.astype(np.float32, copy=False)
        return torch.from_numpy(array.reshape(shape))

    def __contains__(self, key: object) -> bool:  # Mapping's would read the tensor
        return key in self._where or key in self.aliases

    def __iter__(self) -> Iterator[str]:
        yield from self._where
        yield from self.aliases

    def __len__(self) -> int:
        return len(self._where) + len(self.aliases)

    def stored(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """(dtype, shape) of each tensor in the files, by name."""
        return {name: (dtype, shape) for name, (_, dtype, shape, _) in self._where.items()}


def read_header(path: Path) -> dict[str, tuple[Path, str, tuple[int, ...], int]]:
    """name -> (file, dtype, shape, byte offset of its data) from a safetensors header."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    return {
        name: (path, info["dtype"], tuple(info["shape"]), 8 + size + info["data_offsets"][0])
        for name, info in header.items()
    }


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files ``from_pretrained`` reads (the index's, or the single file)."""
    index = folder / INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / name for name in names]
        return files if all(f.is_file() for f in files) else None
    single = folder / SINGLE
    return [single] if single.is_file() else None


def skeleton(config: Any) -> Any:
    """The ``…ForCausalLM`` of ``config`` with its parameters on the meta device (no memory)
    and its buffers (rotary frequencies, embedding scales) real, in eval mode."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        # fp32 as from_pretrained(dtype=torch.float32) makes it: a bf16 config would make the
        # buffers bf16 (the parameters come from SafetensorsWeights, fp32)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # again outside: the context re-creates every parameter it registers, ties included
    model.tie_weights()
    return model.eval()


def open_streamed(folder: Path, config: Any) -> tuple[Any, SafetensorsWeights] | None:
    """(skeleton, its weights) when ``folder`` streams (module docstring), else None."""
    if getattr(config, "quantization_config", None) is not None:
        return None
    files = weight_files(folder)
    if files is None:
        return None
    model = skeleton(config)
    tensors = SafetensorsWeights(files)
    stored = tensors.stored()
    if any(dtype not in _READ for dtype, _ in stored.values()):
        return None
    params = model.state_dict(keep_vars=True)
    first: dict[int, str] = {}  # parameter -> the first name it has (tied ones have several)
    aliases: dict[str, str] = {}
    for name, param in params.items():
        if tuple(param.shape) != stored.get(name, (None, tuple(param.shape)))[1]:
            return None
        if name in stored and first.setdefault(id(param), name) != name:
            return None  # tied, yet stored twice: which copy wins is from_pretrained's call
    for name, param in params.items():
        if name not in stored:
            if id(param) not in first:
                return None  # a tensor the files do not hold: from_pretrained decides
            aliases[name] = first[id(param)]
    if set(stored) - set(params):
        return None  # names from_pretrained would rename or drop
    tensors.aliases = aliases
    return model, tensors
