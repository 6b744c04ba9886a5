"""The analyses: scoring given text, multiple choice, divergence, word starts, rescoring a
Response's own tokens and the logit lens, written once on one scorer interface
(``backend.py``: tokenize, prepare, score) that the in-kernel engine (``local.py``) and a
server (``remote.py``) implement. ``nbr.Engine`` and ``nbr.RemoteEngine`` expose them by
inheriting ``Analyses`` (``analyses.py``). The DataFrames are built in ``nbresponses.frames``.
"""
