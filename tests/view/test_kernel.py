"""The view in a real ipykernel: the cell returns at once, one display, the final HTML."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


SETUP = """
import asyncio, time
import nbresponses as nbr
nbr.show  # import the view before timing show()

def events(text):
    item = {"type": "message", "id": "m", "role": "assistant", "content": []}
    yield {"type": "response.created", "response": {"id": "r", "output": []}}
    yield {"type": "response.output_item.added", "output_index": 0, "item": item}
    for c in text:
        yield {"type": "response.output_text.delta", "output_index": 0, "delta": c}
    yield {"type": "response.completed", "response": {"id": "r", "status": "completed"}}

async def slow(text):
    for e in events(text):
        await asyncio.sleep(0.01)
        yield e
"""

SHOW = """
t0 = time.perf_counter()
view = nbr.show(slow("streamed <b>in</b> the kernel"))
returned_after = time.perf_counter() - t0
view
"""

AWAIT = """
response = await view
print(round(returned_after, 3) < 0.1, view.done, repr(response.output_text))
"""


def test_show_in_a_real_kernel() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, SHOW, AWAIT)]
    client = nbclient.NotebookClient(nb, timeout=60, kernel_name="python3")
    client.execute()
    shown = nb.cells[1].outputs
    assert len(shown) == 1  # show() displayed once; the returned view added no copy
    (output,) = shown
    assert output.output_type == "display_data"
    assert "application/vnd.jupyter.widget-view+json" in output.data
    html = output.data["text/html"]
    # awaiting the view refreshed the display: the saved notebook keeps the final answer
    assert "streamed &lt;b&gt;in&lt;/b&gt; the kernel" in html and "completed" in html
    printed = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert printed.strip() == "True True 'streamed <b>in</b> the kernel'"
