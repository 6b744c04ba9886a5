"""Sessions of small graphs of our ONNX Runtime operators (``nbresponses.models.kernels``)."""

from __future__ import annotations

from typing import Any

from onnx import helper

from nbresponses.models import kernels


def operator_session(nodes, inputs, outputs, initializers, flags: tuple[str, ...] = ()) -> Any:
    """An ONNX Runtime session of a graph of ``nodes`` with our operators registered (built
    with ``flags``, e.g. ``-mno-avx512f`` for the AVX2 code)."""
    import onnxruntime as ort

    graph = helper.make_graph(nodes, "t", inputs, outputs, initializers)
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(kernels.DOMAIN, 1),
        ],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    kernels.register(options, flags)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
