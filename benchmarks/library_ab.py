"""Builds of our operators side by side: the package's sources, and the same with some files
replaced, timed on a prepared graph's ``GroupProduct`` nodes alone (``batch_floor.py``'s
sessions, 2 threads, random inputs): the products of a 16-row, an 8-row and a one-row step (the
LM head included) and of a 370-row prefill (without it), medians in ms.

A variant is a folder of files that replace the package's (``nbresponses/models/kernels``) by
name: the package's folder is copied beside the build, the variant's files laid over it, and the
copy's own ``library()`` compiles it (its own source digest, its own cache folder), so a variant
is built exactly as the package builds its library. Each build runs in a process of its own, one
process a build a round, the builds in turn, so that the machine's drift reaches all alike.

With ``--operator attention`` each build is timed instead on the graph's attention operator
alone (``KVAttention`` or ``KVAttentionInt8Values`` with the prepared graph's heads, head size,
scale, softcap, window and buffer types; the keys and values as given, random): a 256-token
prompt, a 114-token run after 256 (a 370-token document's second run), a 16-row step at 250
keys and two rows of a 5-token step, medians in ms; and a digest of every output, of those and
of cases with a softcap, a window, 7 query heads to a KV head, odd head sizes and padding
positions, so that a variant meant to change no bit shows it (the same digest as the
package's).

    python benchmarks/library_ab.py VARIANT_DIR [...] [--rounds 4] [--recipe fused-int8-kernel]
    python benchmarks/library_ab.py VARIANT_DIR --operator attention
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nbresponses.models import kernels
from nbresponses.models.prepare import prepare_model

CASES = {"16 rows": 16, "8 rows": 8, "1 row": 1}


def build(variant: Path, root: Path) -> Path:
    """The library of the package's operator sources with ``variant``'s files laid over them."""
    package = root / variant.name
    shutil.copytree(Path(kernels.__file__).parent, package)
    for source in variant.iterdir():
        shutil.copy(source, package / source.name)
    init = package / "__init__.py"
    spec = importlib.util.spec_from_file_location(f"variant_{variant.name}", init)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.library(cache_dir=root / f"{variant.name}-cache")


def child(library: str, model: str, operator: str) -> None:
    """One round of one build: its figures as a line of JSON."""
    import numpy as np
    from batch_floor import median_ms, product_sessions

    kernels.library = lambda *args, **kwargs: Path(library)  # every session of this process
    if operator == "attention":
        print(json.dumps(attention_figures(model)))
        return
    body, head = product_sessions(model)
    rng = np.random.default_rng(0)
    out = {
        name: median_ms(body, rows, 40, rng) + median_ms(head, rows, 40, rng)
        for name, rows in CASES.items()
    }
    out["370-row prefill"] = median_ms(body, 370, 7, rng)
    print(json.dumps(out))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", type=Path, help="folders of replacement sources")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--recipe", default="fused-int8-kernel")
    parser.add_argument("--operator", choices=["products", "attention"], default="products")
    args = parser.parse_args()
    model = str(prepare_model(None, args.recipe, progress=False).path / "model.onnx")
    with tempfile.TemporaryDirectory(prefix="library-ab-") as tmp:
        libraries = {"package": kernels.library()}
        for variant in args.variants:
            libraries[variant.name] = build(variant.resolve(), Path(tmp))
        figures: dict[str, list[dict[str, Any]]] = {name: [] for name in libraries}
        for number in range(1, args.rounds + 1):
            for name, library in libraries.items():
                command = [sys.executable, __file__, "--child", str(library), model, args.operator]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                figures[name].append(json.loads(done.stdout.splitlines()[-1]))
                row = ", ".join(_shown(k, v) for k, v in figures[name][-1].items())
                print(f"round {number}, {name}: {row}", flush=True)
    print("\nmedians, ms:")
    for name, rounds in figures.items():
        row = ", ".join(
            _shown(k, rounds[0][k] if k == "digest" else statistics.median(r[k] for r in rounds))
            for k in rounds[0]
        )
        print(f"{name}: {row}")


def _shown(key: str, value: float | str) -> str:
    return f"{key} {value}" if isinstance(value, str) else f"{key} {value:.3f}"


def attention_figures(model: str) -> dict[str, float | str]:
    """The graph's attention operator alone at prompt and step shapes (ms), and the digest of
    its outputs there and at odd shapes (see the module's docstring)."""
    import hashlib

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from nbresponses.runtime.runner import session_options

    graph = onnx.load(model, load_external_data=False).graph
    node = next(n for n in graph.node if n.op_type.startswith("KVAttention"))
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    past = {i.name: i.type.tensor_type for i in graph.input}
    keys, values = past["past_key_values.0.key"], past["past_key_values.0.value"]
    hd = keys.shape.dim[3].dim_value
    int8 = values.elem_type == TensorProto.INT8

    def session(heads: int, kv: int, hd: int, softcap: float, window: int, scale: float):
        info = helper.make_tensor_value_info
        inputs = [
            info("q", TensorProto.FLOAT, ["B", "S", heads * hd]),
            info("keys", keys.elem_type, ["B", kv, "W", hd]),
            info("values", values.elem_type, ["B", kv, "W", hd + 4 * int8]),
            info("positions", TensorProto.INT64, ["B", "S"]),
        ]
        made = helper.make_node(
            node.op_type,
            ["q", "keys", "values", "positions"],
            ["out"],
            domain=kernels.DOMAIN,
            heads=heads,
            scale=scale,
            softcap=softcap,
            window=window,
        )
        outputs = [info("out", TensorProto.FLOAT, ["B", "S", heads * hd])]
        built = helper.make_model(
            helper.make_graph([made], "attention", inputs, outputs),
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)],
        )
        options = session_options(2)
        kernels.register(options)
        return ort.InferenceSession(built.SerializeToString(), options)

    rng = np.random.default_rng(0)

    def feeds(heads: int, kv: int, hd: int, B: int, S: int, W: int, start: int):
        stored = helper.tensor_dtype_to_np_dtype(keys.elem_type)
        if int8:  # int8 columns, each its scale's 4 bytes after its values
            v = rng.integers(-127, 128, (B, kv, W, hd + 4)).astype(np.int8)
            scales = np.abs(rng.standard_normal((B, kv, W, 1))).astype(np.float32) * 0.02
            v[..., hd:] = scales.view(np.int8)
        else:
            v = rng.standard_normal((B, kv, W, hd)).astype(stored)
        return {
            "q": rng.standard_normal((B, S, heads * hd)).astype(np.float32),
            "keys": rng.standard_normal((B, kv, W, hd)).astype(stored),
            "values": v,
            "positions": (start + np.arange(S))[None].repeat(B, 0).astype(np.int64),
        }

    digest = hashlib.sha256()
    out: dict[str, float | str] = {}
    heads, kv = given["heads"], given["kv_heads"]
    timed = session(heads, kv, hd, given["softcap"], given["window"], given["scale"])
    shapes = {  # name: rows, positions, buffer width, first position, repeats
        "256-token prompt": (1, 256, 256, 0, 30),
        "114 after 256": (1, 114, 370, 256, 30),
        "16 rows x 250": (16, 1, 250, 249, 60),
        "2 rows x 5 tokens": (2, 5, 100, 95, 60),
    }
    for name, (B, S, W, start, repeats) in shapes.items():
        given_feeds = feeds(heads, kv, hd, B, S, W, start)
        for _ in range(3):
            timed.run(None, given_feeds)
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            (result,) = timed.run(None, given_feeds)
            times.append(time.perf_counter() - begin)
        digest.update(result.tobytes())
        out[name] = statistics.median(times) * 1000
    odd = [(9, 3, 64, 30.0, 0), (14, 2, 64, 0.0, 0), (8, 2, 128, 0.0, 5), (6, 2, 48, 0.0, 0)]
    for heads, kv, hd, softcap, window in odd:  # bits only
        checked = session(heads, kv, hd, softcap, window, hd**-0.5)
        for B, S, W, start in [(1, 37, 60, 3), (2, 17, 40, 0), (3, 33, 33, 0)]:
            given_feeds = feeds(heads, kv, hd, B, S, W, start)
            given_feeds["positions"][-1, -3:] = [0, 0, W + 4]  # padding positions
            digest.update(checked.run(None, given_feeds)[0].tobytes())
    out["digest"] = digest.hexdigest()[:16]
    return out


if __name__ == "__main__":
    main()
