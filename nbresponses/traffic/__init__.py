"""One vocabulary for reading Responses API traffic, shared by ``view/`` and ``frames/``.

Which event types start, advance and end a response (``events.py``), how to read a field from
an SDK object or its JSON dict alike (``access.py``), and where stored responses are found by
id (``lookup.py``: stores register there, frames read through it). It imports nothing of this
package and nothing but the standard library: traffic from OpenAI, vLLM or our own engine
reads the same.
"""
