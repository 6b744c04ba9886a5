"""Constrained decoding: JSON schemas and grammars compiled to per-token masks (llguidance).

``schema`` checks a JSON schema against what the engine enforces (and OpenAI's strict-mode
rules); ``matcher`` compiles grammars for a tokenizer and gives each generation a
``TokenConstraint`` (``tokens.contract``) that the engine applies to its row of logits.
"""

from nbresponses.grammar.matcher import Grammar, GrammarError, GrammarTokenizer, Guard, Matcher
from nbresponses.grammar.schema import SchemaError, best_effort, check_schema, closed

__all__ = [
    "Grammar",
    "GrammarError",
    "GrammarTokenizer",
    "Guard",
    "Matcher",
    "SchemaError",
    "best_effort",
    "check_schema",
    "closed",
]
