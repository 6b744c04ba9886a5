"""One vocabulary for reading Responses API traffic, shared by ``view/`` and ``frames/``.

Which event types start, advance and end a response (``events.py``) and how to read a field
from an SDK object or its JSON dict alike (``access.py``). It imports nothing of this package
and nothing but the standard library: traffic from OpenAI, vLLM or our own engine reads the same.
"""
