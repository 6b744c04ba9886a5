"""Builds of our operators side by side: the package's sources, and the same with some files
replaced, timed on a prepared graph's ``GroupProduct`` nodes alone (``batch_floor.py``'s
sessions, 2 threads, random inputs): the products of a 16-row, an 8-row and a one-row step (the
LM head included) and of a 370-row prefill (without it), medians in ms.

A variant is a folder of files that replace the package's (``nbresponses/models/kernels``) by
name: the package's folder is copied beside the build, the variant's files laid over it, and the
copy's own ``library()`` compiles it (its own source digest, its own cache folder), so a variant
is built exactly as the package builds its library. Each build runs in a process of its own, one
process a build a round, the builds in turn, so that the machine's drift reaches all alike.

    python benchmarks/library_ab.py VARIANT_DIR [...] [--rounds 4] [--recipe fused-int8-kernel]
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
from pathlib import Path

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


def child(library: str, model: str) -> None:
    """One round of one build: its figures as a line of JSON."""
    import numpy as np
    from batch_floor import median_ms, product_sessions

    kernels.library = lambda *args, **kwargs: Path(library)  # every session of this process
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
        return child(*sys.argv[2:4])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", type=Path, help="folders of replacement sources")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--recipe", default="fused-int8-kernel")
    args = parser.parse_args()
    model = str(prepare_model(None, args.recipe, progress=False).path / "model.onnx")
    with tempfile.TemporaryDirectory(prefix="library-ab-") as tmp:
        libraries = {"package": kernels.library()}
        for variant in args.variants:
            libraries[variant.name] = build(variant.resolve(), Path(tmp))
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in libraries}
        for number in range(1, args.rounds + 1):
            for name, library in libraries.items():
                command = [sys.executable, __file__, "--child", str(library), model]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                figures[name].append(json.loads(done.stdout.splitlines()[-1]))
                row = ", ".join(f"{k} {v:.2f}" for k, v in figures[name][-1].items())
                print(f"round {number}, {name}: {row}", flush=True)
    print("\nmedians, ms:")
    for name, rounds in figures.items():
        row = ", ".join(f"{k} {statistics.median(r[k] for r in rounds):.2f}" for k in rounds[0])
        print(f"{name}: {row}")


if __name__ == "__main__":
    main()
