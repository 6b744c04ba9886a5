"""What a prepared graph tells the runner: its KV layout (metadata) and its optional inputs.

Written by the graph builders (``fused.py``), read by ``runtime/runner.py``, the lens graph
(``lens.py``) and the fidelity runs (``fidelity.py``): one low module, so none of them imports
another for a name.
"""

from __future__ import annotations

__all__ = ["END_PADDED_IN_PLACE", "KV_LAYOUT", "LOGITS_TO_KEEP", "SCATTER_IN_PLACE"]

KV_LAYOUT = "nbresponses.kv_layout"  # metadata read by nbresponses.runtime.runner
END_PADDED_IN_PLACE = "end-padded-in-place"  # rows padded at the end; past and present shared
# the same buffers, written at position_ids by standard-op attention (``attention.py``): any
# number of new tokens per row in any batch; the past buffers must have room for them
SCATTER_IN_PLACE = "scatter-in-place"
LOGITS_TO_KEEP = "num_logits_to_keep"  # optional input [1]: logits of the last N positions
