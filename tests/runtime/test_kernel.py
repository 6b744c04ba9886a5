"""In a real IPython kernel: a cell runs (and sees progress) while a request generates."""

from __future__ import annotations

import json

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


SETUP = """
import asyncio
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams
from nbresponses.models.prepared import PreparedModel
engine = TokenGenerator(PreparedModel.open({model!r}))
got = []

async def consume(i):
    params = SamplingParams(max_tokens=480, temperature=0)
    async for step in engine.generate([1, 9690, 198, 2683 + i], params):
        got.extend(step.token_ids)

task = asyncio.gather(*(consume(i) for i in range(8)))
"""

WHILE_GENERATING = """
await asyncio.sleep(0.05)
before = len(got)
await asyncio.sleep(0.3)
state = {"before": before, "after": len(got), "done": task.done(), "running": engine.running}
print(json.dumps(state))
"""

FINISH = """
await task
print(len(got))
await engine.aclose()
"""


@pytest.mark.slow
def test_cell_runs_while_a_request_generates(tiny_model):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP.format(model=str(tiny_model.path))),
        nbformat.v4.new_code_cell("import json\n" + WHILE_GENERATING),
        nbformat.v4.new_code_cell(FINISH),
    ]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    client.km_kwargs = {}
    client.execute()
    state = json.loads(nb.cells[1].outputs[0]["text"])
    assert not state["done"] and state["running"] > 0  # the cell ran mid-generation
    assert state["after"] > state["before"]  # and generation went on while it ran
    assert nb.cells[2].outputs[0]["text"].strip() == str(8 * 480)
