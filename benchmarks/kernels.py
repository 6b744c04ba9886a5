"""Kernels per decoded token of the fused graph, per architecture, against the Optimum graph.

A decode step runs every node of the ONNX Runtime-optimized graph once, so the node count of
that graph (``SessionOptions.optimized_model_filepath``, all optimizations on, as the engine
runs it) is the step's kernel count. Counted on the tiny random-weight models of
``tests/helpers/tiny_archs.py`` at two depths, it gives ``fixed + per_layer x layers`` for a
real model of any depth. The fused graph gets the ``fused-q8`` recipe's quantization, the
Optimum export the ``q8`` recipe's.

    python benchmarks/kernels.py
"""

from __future__ import annotations

import copy
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout, and the tiny models
from helpers.tiny_archs import ARCHITECTURES  # noqa: E402

from nbresponses.models.export import quiet_export  # noqa: E402
from nbresponses.models.fused import build_fused_model  # noqa: E402
from nbresponses.models.recipes import quantize_nbits  # noqa: E402

VOCAB = 1024


def deeper(config: Any, factor: int) -> Any:
    """The same architecture with ``factor`` times the layers (per-layer lists repeated)."""
    config = copy.deepcopy(config)
    for key in ("layer_types", "no_rope_layers"):
        if getattr(config, key, None):
            setattr(config, key, list(getattr(config, key)) * factor)
    config.num_hidden_layers *= factor
    return config


def optimized_ops(model_path: Path) -> Counter[str]:
    import onnx
    import onnxruntime as ort

    out = model_path.with_suffix(".opt.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(out)).graph.node)


def fused_q8(model: Any, folder: Path) -> Counter[str]:
    quantized = quantize_nbits(build_fused_model(model), 8, quantize_head=True)
    quantized.save_model_to_file(str(folder / "fused.onnx"), use_external_data_format=False)
    return optimized_ops(folder / "fused.onnx")


def optimum_q8(model: Any, folder: Path) -> Counter[str]:
    import onnx
    from optimum.exporters.onnx import main_export

    model.save_pretrained(str(folder / "hf"))
    main_export(
        str(folder / "hf"), output=str(folder / "optimum"), task="text-generation-with-past"
    )
    quantized = quantize_nbits(
        onnx.load(str(folder / "optimum" / "model.onnx")), 8, quantize_head=True
    )
    quantized.save_model_to_file(str(folder / "optimum.onnx"), use_external_data_format=False)
    return optimized_ops(folder / "optimum.onnx")


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    print("| architecture | fused-q8: fixed + per layer | Optimum q8: fixed + per layer |")
    print("|---|---|---|")
    for name, make in ARCHITECTURES.items():
        counts = {}
        for factor in (1, 2):
            config = deeper(make(VOCAB), factor)
            config.pad_token_id = 0
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            with tempfile.TemporaryDirectory() as tmp, quiet_export():
                fused, optimum = fused_q8(model, Path(tmp)), optimum_q8(model, Path(tmp))
            counts[factor] = (sum(fused.values()), sum(optimum.values()), config.num_hidden_layers)
        cells = []
        for graph in (0, 1):
            (n1, layers1), (n2, layers2) = ((counts[f][graph], counts[f][2]) for f in (1, 2))
            per_layer = (n2 - n1) // (layers2 - layers1)
            cells.append(f"{n1 - per_layer * layers1} + {per_layer}")
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
