"""DataFrames of Responses API traffic: token logprobs, top-k alternatives, usage, timelines.

Depends on ``openai.types`` shapes (objects or their JSON dicts), pandas and numpy only (and
matplotlib, optional, for the plots), so it works on traffic from OpenAI, vLLM or this
package's engine alike.
"""

from .analysis import classification_confidence, perplexity, sequence_logprob
from .calibration import calibration_summary, reliability_table
from .choice import NORMALISATIONS, choice_accuracy, multiple_choice_frame, option_likelihoods
from .divergence import divergence_summary
from .events import EVENTS_COLUMNS, events_frame
from .heatmap import logprobs_heatmap, plot_logprobs
from .lens import LENS_COLUMNS, lens_frame, lens_heatmap, plot_lens
from .logprobs import LOGPROBS_COLUMNS, TOP_LOGPROBS_COLUMNS, logprobs_frame, top_logprobs_frame
from .plots import plot_divergence, plot_options, plot_reliability, plot_surprisal
from .samples import SAMPLES_COLUMNS, samples_frame
from .scoring import compare, compare_scorings, scorings_frame
from .usage import USAGE_COLUMNS, usage_frame
from .words import BOUNDARIES, WORDS_COLUMNS, span_surprisal, words_frame

__all__ = [
    "BOUNDARIES",
    "EVENTS_COLUMNS",
    "LENS_COLUMNS",
    "LOGPROBS_COLUMNS",
    "NORMALISATIONS",
    "SAMPLES_COLUMNS",
    "TOP_LOGPROBS_COLUMNS",
    "USAGE_COLUMNS",
    "WORDS_COLUMNS",
    "calibration_summary",
    "choice_accuracy",
    "classification_confidence",
    "compare",
    "compare_scorings",
    "divergence_summary",
    "events_frame",
    "lens_frame",
    "lens_heatmap",
    "logprobs_frame",
    "logprobs_heatmap",
    "multiple_choice_frame",
    "option_likelihoods",
    "perplexity",
    "plot_divergence",
    "plot_lens",
    "plot_logprobs",
    "plot_options",
    "plot_reliability",
    "plot_surprisal",
    "reliability_table",
    "samples_frame",
    "scorings_frame",
    "sequence_logprob",
    "span_surprisal",
    "top_logprobs_frame",
    "usage_frame",
    "words_frame",
]
