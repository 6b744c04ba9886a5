"""gpt-oss models through openai-harmony: offline vocabulary, prompt rendering, streaming parse.

``harmony_encoding()`` loads the encoding without internet; ``render_request`` turns a
Responses-style request into prompt ids and stop ids; ``HarmonyStreamParser`` turns generated
ids into typed segment events (reasoning, text, function / code interpreter / web search calls).
"""

from nbresponses.families.harmony.encoding import harmony_encoding, prepare_vocab
from nbresponses.families.harmony.parser import (
    Event,
    HarmonyStreamParser,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    Stray,
)
from nbresponses.families.harmony.render import (
    HarmonyPrompt,
    build_conversation,
    builtin_namespaces,
    continuation_ids,
    render_request,
)
from nbresponses.families.harmony.vocab import HarmonyVocabularyError

__all__ = [
    "Event",
    "HarmonyPrompt",
    "HarmonyStreamParser",
    "HarmonyVocabularyError",
    "SegmentDelta",
    "SegmentEnd",
    "SegmentKind",
    "SegmentStart",
    "Stray",
    "build_conversation",
    "builtin_namespaces",
    "continuation_ids",
    "harmony_encoding",
    "prepare_vocab",
    "render_request",
]
