"""DataFrames of Responses API traffic: token logprobs, top-k alternatives, usage, timelines.

Depends on ``openai.types`` shapes (objects or their JSON dicts), pandas and numpy only, so it
works on traffic from OpenAI, vLLM or this package's engine alike.
"""

from .analysis import classification_confidence, perplexity, sequence_logprob
from .events import EVENTS_COLUMNS, events_frame
from .heatmap import logprobs_heatmap
from .lens import LENS_COLUMNS, lens_frame, lens_heatmap
from .logprobs import LOGPROBS_COLUMNS, TOP_LOGPROBS_COLUMNS, logprobs_frame, top_logprobs_frame
from .samples import SAMPLES_COLUMNS, samples_frame
from .scoring import compare, option_likelihoods
from .usage import USAGE_COLUMNS, usage_frame

__all__ = [
    "EVENTS_COLUMNS",
    "LENS_COLUMNS",
    "LOGPROBS_COLUMNS",
    "SAMPLES_COLUMNS",
    "TOP_LOGPROBS_COLUMNS",
    "USAGE_COLUMNS",
    "classification_confidence",
    "compare",
    "events_frame",
    "lens_frame",
    "lens_heatmap",
    "logprobs_frame",
    "logprobs_heatmap",
    "option_likelihoods",
    "perplexity",
    "samples_frame",
    "sequence_logprob",
    "top_logprobs_frame",
    "usage_frame",
]
