"""The built-in conversations fidelity is measured on: varied, and written for this purpose.

Each sample is a conversation whose assistant turns are reference continuations (scored
teacher-forced), and whose prompt (every turn before the last assistant one) also seeds a greedy
continuation by the candidate model (scored too: the tokens a user of that model sees). The
samples span what people ask a small chat model: explanations, lists, code, arithmetic, JSON,
summaries of a given text, non-English text and multi-turn chat. About 1,140 reference tokens
with the SmolLM2 tokenizer; the texts are our own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class Sample:
    kind: str  # what the sample exercises (reported per kind)
    messages: tuple[Message, ...]  # ends with an assistant turn (the reference continuation)


def _chat(kind: str, *turns: str) -> Sample:
    roles = ("user", "assistant")
    return Sample(kind, tuple({"role": roles[i % 2], "content": t} for i, t in enumerate(turns)))


FIDELITY_SET: tuple[Sample, ...] = (
    _chat(
        "explain",
        "What is the capital of France, and why did it become the capital?",
        "The capital of France is Paris. It became the capital because it sat at the heart of "
        "the lands held by the early Capetian kings, on an island in the Seine that was easy to "
        "defend and well placed for trade. Over the centuries the royal court, the university "
        "and the main institutions of government gathered there, so Paris grew into the "
        "political, economic and cultural centre of the country.",
    ),
    _chat(
        "explain",
        "How does a rainbow form?",
        "A rainbow forms when sunlight passes through raindrops. Each drop acts like a tiny "
        "prism: light bends as it enters the water, reflects off the back of the drop and bends "
        "again as it leaves. Because each colour bends by a slightly different amount, white "
        "light spreads into its colours, with red on the outside of the arc and violet on the "
        "inside. You see a rainbow when the sun is behind you and the rain is in front of you.",
    ),
    _chat(
        "list",
        "Give me three tips for sleeping better.",
        "1. Keep a regular schedule: go to bed and wake up at the same time every day, even on "
        "weekends.\n2. Make your bedroom dark, quiet and cool, and keep screens out of it for "
        "the last hour before sleep.\n3. Avoid caffeine in the afternoon and heavy meals late "
        "in the evening, and try to get some daylight and exercise during the day.",
    ),
    _chat(
        "list",
        "List five fruits that are rich in vitamin C.",
        "Here are five fruits rich in vitamin C:\n\n- Oranges\n- Kiwis\n- Strawberries\n"
        "- Guavas\n- Papayas\n\nA single kiwi or a cup of strawberries gives you most of the "
        "vitamin C an adult needs in a day.",
    ),
    _chat(
        "code",
        "Write a short Python function that returns the n-th Fibonacci number.",
        "Here is a simple iterative version:\n\n```python\ndef fibonacci(n: int) -> int:\n"
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```\n\n"
        "It runs in linear time and constant memory. For example, fibonacci(10) returns 55.",
    ),
    _chat(
        "code",
        "Write a Python function that checks whether a string is a palindrome.",
        "```python\ndef is_palindrome(text: str) -> bool:\n"
        '    """True if text reads the same backwards, ignoring case and spaces."""\n'
        '    cleaned = "".join(ch.lower() for ch in text if ch.isalnum())\n'
        "    return cleaned == cleaned[::-1]\n```\n\n"
        'For example, is_palindrome("A man, a plan, a canal: Panama") returns True, and '
        'is_palindrome("hello") returns False.',
    ),
    _chat(
        "numbers",
        "What is 17 times 23? Show your working.",
        "17 times 23 can be split into 17 times 20 plus 17 times 3.\n\n17 x 20 = 340\n"
        "17 x 3 = 51\n340 + 51 = 391\n\nSo 17 times 23 is 391.",
    ),
    _chat(
        "numbers",
        "A train leaves at 9:45 and the journey takes 2 hours and 50 minutes. When does it arrive?",
        "Add the hours first: 9:45 plus 2 hours is 11:45. Then add the 50 minutes: 11:45 plus "
        "15 minutes is 12:00, and 35 minutes more makes 12:35. The train arrives at 12:35.",
    ),
    _chat(
        "json",
        "Give me a JSON object describing a book with a title, an author and a year.",
        '```json\n{\n  "title": "The Little Prince",\n  "author": "Antoine de Saint-Exupery",\n'
        '  "year": 1943\n}\n```',
    ),
    _chat(
        "summary",
        "Summarise this in one sentence: The city council met on Tuesday to discuss the new "
        "bicycle lanes. Several residents said the lanes had made their commute safer, while "
        "shop owners on the main street worried that removing parking spaces would cost them "
        "customers. The council agreed to count cyclists and shoppers for six months before "
        "deciding whether to extend the lanes.",
        "The council heard that the new bicycle lanes made commuting safer but worried shop "
        "owners, and it will count cyclists and shoppers for six months before deciding "
        "whether to extend them.",
    ),
    _chat(
        "non-English",
        "Quelle est la plus haute montagne d'Europe occidentale ?",
        "La plus haute montagne d'Europe occidentale est le mont Blanc, dans les Alpes, à la "
        "frontière entre la France et l'Italie. Son sommet culmine à environ 4 805 mètres, "
        "mais sa hauteur exacte varie un peu d'une année à l'autre selon l'épaisseur de la "
        "neige et de la glace.",
    ),
    _chat(
        "non-English",
        "¿Cómo se dice 'good morning, how are you?' en español y en alemán?",
        "En español se dice «Buenos días, ¿cómo estás?» (o «¿cómo está usted?» en un contexto "
        "formal). En alemán se dice «Guten Morgen, wie geht es dir?», y en un contexto formal "
        "«Guten Morgen, wie geht es Ihnen?».",
    ),
    _chat(
        "multi-turn",
        "I'm planning a picnic on Saturday. What should I bring?",
        "For a picnic, bring a blanket, plenty of water, easy food such as sandwiches, fruit "
        "and cheese, plates and napkins, a bag for rubbish and some sun cream. A small cooler "
        "keeps drinks and food fresh.",
        "It might rain. Should I change anything?",
        "If rain is possible, pack a waterproof sheet to put under the blanket, bring "
        "umbrellas or rain jackets, and keep the food in closed boxes. It also helps to pick a "
        "park with a shelter or a covered area nearby, so you can move if a shower comes.",
        "Thanks! Any ideas for games?",
        "Simple games work best outdoors: a frisbee, a football, a deck of cards, or a round of "
        "twenty questions. If children are coming, a scavenger hunt for leaves, stones and "
        "flowers keeps them busy for a long time.",
    ),
    _chat(
        "explain",
        "Why do we have seasons on Earth?",
        "We have seasons because the Earth's axis is tilted by about 23.5 degrees relative to "
        "its orbit around the sun. As the Earth travels around the sun, first one hemisphere "
        "and then the other leans towards it. The hemisphere tilted towards the sun gets more "
        "direct sunlight and longer days, which makes summer, while the other gets slanted "
        "light and shorter days, which makes winter. The distance to the sun changes very "
        "little and is not the cause.",
    ),
)


def render_ids(tokenizer: Any, messages: list[dict[str, str]], *, prompt: bool) -> list[int]:
    """Token ids of a conversation; ``prompt`` adds the assistant's opening. Without a chat
    template: the turns' texts joined by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
        )
    text = "\n\n".join(m["content"] for m in messages) + ("\n\n" if prompt and messages else "")
    return list(tokenizer(text)["input_ids"])


def reference_spans(tokenizer: Any, sample: Sample) -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the [start, end) spans of its assistant turns' tokens."""
    messages = [dict(m) for m in sample.messages]
    ids = render_ids(tokenizer, messages, prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render_ids(tokenizer, messages[:i], prompt=True)
        through = render_ids(tokenizer, messages[: i + 1], prompt=False)
        start = _common_prefix(before, ids)
        end = min(_common_prefix(through, ids), len(ids))
        if end > start:
            spans.append((start, end))
    return ids, spans


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
