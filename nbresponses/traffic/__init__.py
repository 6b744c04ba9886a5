"""One vocabulary for reading OpenAI API traffic, shared by ``view/`` and ``frames/``.

Which event types start, advance and end a response (``events.py``), how to read a field from
an SDK object or its JSON dict alike (``access.py``), where stored responses are found by id
(``lookup.py``: stores register there, frames read through it), and how Chat Completions and
legacy Completions answers and streams read as the Responses stream of the same answer
(``chat.py``, ``legacy.py``), so the view and the frames read every shape one way. It imports
nothing of this package and nothing but the standard library: traffic from OpenAI, vLLM or our
own engine reads the same.
"""
