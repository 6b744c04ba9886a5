"""The prompts benchmarks/decode.py times: chat questions and input-grounded tasks.

Two workloads, 16 prompts each, fixed here (not read from the project's docs) so that figures
from different commits compare:

- ``chat``: a short held-out question for batch 1 (the one the README's figures always used) and
  16 distinct questions behind 0 to ~170 tokens of context, so concurrent rows have mixed lengths;
- ``grounded``: summarise / quote / correct / list a given text of ~200-450 tokens. The answer
  repeats much of the input, which is where prompt-lookup (n-gram) speculation pays.

Every prompt is a user message through the model's chat template, as token ids: every system is
given exactly these tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT_SINGLE = "What is the capital of France? Answer in a few sentences."

CHAT_CONTEXT = (
    "The Seine flows through Paris. The city has twenty arrondissements. Its metro opened in "
    "1900. The Louvre was a royal palace before it became a museum. Gustave Eiffel's tower was "
    "built for the world's fair of 1889. Haussmann rebuilt much of the centre in the 1850s and "
    "1860s. The Pantheon holds the tombs of Voltaire and Marie Curie. Montmartre was a village "
    "of windmills and vineyards. The Sorbonne dates from the thirteenth century. Notre-Dame lost "
    "its spire to a fire in 2019. The Paris Commune ruled the city for two months in 1871. The "
    "catacombs hold the remains of some six million people. The Canal Saint-Martin links the "
    "Seine to the Canal de l'Ourcq."
)

CHAT_QUESTIONS = (
    "What is the capital of France? Answer in a few sentences.",
    "Give me three tips for learning a new language.",
    "Why is the sky blue? Explain it simply.",
    "Write a short poem about the sea.",
    "What should I pack for a weekend of hiking?",
    "Explain what a hash table is to a beginner.",
    "How do I make a good cup of tea?",
    "What are the main causes of inflation?",
    "Suggest a name for a small bakery and say why.",
    "What is the difference between weather and climate?",
    "How does a bicycle stay upright?",
    "Write a polite email declining a meeting invitation.",
    "What is photosynthesis?",
    "List some good habits for working from home.",
    "Why do cats purr?",
    "Describe a typical day of a medieval farmer.",
)

# Four texts of different lengths; each has a few spelling mistakes for the "correct" task.
TEXTS = (
    "The first practical bicycle was built in the 1860s in France, but the machine we ride "
    "today took another twenty years to appear. Early velocipedes had iron tyres and pedals "
    "fixed to the front wheel, and riders called them boneshakers for good reason. In the "
    "1870s makers enlarged the front wheel to go faster with each turn of the pedals, and the "
    "high-wheeler, or penny-farthing, was born. It was fast but dangerous: a rider sat nearly "
    "two metres above the road and a stone could throw him over the handlebars. In 1885 John "
    "Kemp Starley built the Rover, with two wheels of similar size and a chain driving the rear "
    "wheel. Three years later John Boyd Dunlop fitted his son's tricycle with air-filled tyres, "
    "and the modern bicycle was complete. By 1895 there were more than four hundred bicycle "
    "makers in the United States alone. Women in particular took to the new machine, which gave "
    "them a freedom of movment they had rarely known, and changed what they wore: long skirts "
    "gave way to bloomers. The bicycle also prepared the way for the car. Smooth roads, ball "
    "bearings, pneumatic tyres and mass production were all developed for bicycles first, and "
    "several of the first car and aircraft makers, among them the Wright brothers, began as "
    "bicycle mechanics.",
    "Dear Ms Turner, thank you for your letter of 12 March about the delayed delivery of your "
    "order. I am sorry that the sofa did not arrive on the date we promised. Our warehouse in "
    "Leeds was closed for three days because of flooding, and about two hundred orders were "
    "held up. Your sofa left the warehouse yesterday and will be delivered on Friday between "
    "9 am and 1 pm. The driver will call you thirty minutes before he arrives. As an apology we "
    "have refunded the delivery charge of 45 pounds to your card; you should see it within "
    "five working days. If Friday is not convenient, please call our customer team on the "
    "number below and we will arange another day. Thank you for your patience, and I hope you "
    "enjoy your new sofa for many years. Yours sincerely, Daniel Brooks, Customer Services "
    "Manager.",
    "To make a simple loaf of bread you need 500 grams of strong white flour, 7 grams of dried "
    "yeast, 10 grams of salt, 2 tablespoons of olive oil and about 300 millilitres of warm "
    "water. Put the flour in a large bowl and add the salt on one side and the yeast on the "
    "other, because salt can slow the yeast down if they touch at first. Add the oil and three "
    "quarters of the water and mix with your hand, then add the rest of the water a little at "
    "a time until you have a soft dough that is not too sticky. Tip it onto a lightly oiled "
    "surface and knead it for ten minutes, until it is smooth and stretchy. Put it back in the "
    "bowl, cover it and leave it to rise for one to two hours, untill it has doubled in size. "
    "Knock the air out of it, shape it into a ball and place it on a baking tray. Leave it to "
    "rise again for an hour. Heat the oven to 220 degrees, dust the loaf with flour, cut a "
    "cross in the top and bake it for 30 minutes, until it sounds hollow when you tap the "
    "bottom. Let it cool on a wire rack before you slice it.",
    "The town council met on Tuesday evening to discuss the future of the old railway station. "
    "The building, which dates from 1874, has been empty since the line closed in 1968, and "
    "its roof was damaged in a storm two winters ago. Three proposals were presented. The "
    "first, from a housing association, would turn the station into twelve flats for young "
    "families, keeping the front of the building as it is. The second, from a local arts "
    "group, would make it a museum and café, with a small hall for concerts and exhibitions. "
    "The third, from a supermarket chain, would knock the station down and build a shop with "
    "a car park of 150 spaces. More than two hundred residents attended the meeting, and most "
    "of those who spoke were against the supermarket. Several said the station was part of the "
    "town's history and should be protected. Others pointed out that the town badly needs "
    "afordable homes and that the arts group had not explained how it would pay for the "
    "repairs, which an engineer has estimated at 1.2 million pounds. The council's planning "
    "committee will visit the site next month and make a recomendation in June. A final "
    "decision is expected before the end of the year. The council leader, Margaret Hill, said "
    "that whatever was chosen, the work must begin soon, because the building would not "
    "survive many more winters without a new roof. She thanked residents for coming and "
    "promised that their views would be taken into account.",
)

TASKS = (
    "Correct the spelling mistakes in the following text and return the whole corrected text.",
    "Summarise the following text in a few sentences.",
    "Quote, word for word, every sentence of the following text that contains a number.",
    "Rewrite the following text as a bulleted list, keeping its wording.",
)


@dataclass(frozen=True)
class Workload:
    """One workload as token ids: ``single`` for batch 1, ``mixed`` for concurrent runs."""

    name: str
    single: list[int]
    mixed: list[list[int]]

    def take(self, n: int) -> list[list[int]]:
        """``n`` prompts spread over the mixed lengths (``n`` = 1: the batch-1 prompt)."""
        if n == 1:
            return [self.single]
        step = max(1, len(self.mixed) // n)
        return [self.mixed[(i * step) % len(self.mixed)] for i in range(n)]


def _chat(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return [int(t) for t in ids]


def chat_texts() -> list[str]:
    """16 questions behind 0 to 13 sentences of context: mixed lengths, every one different."""
    sentences = [s.strip() + "." for s in CHAT_CONTEXT.split(". ")]
    out = []
    for i, question in enumerate(CHAT_QUESTIONS):
        context = " ".join(sentences[: i % (len(sentences) + 1)])
        out.append(f"{context}\n\n{question}" if context else question)
    return out


def grounded_texts() -> list[str]:
    """Every task on every text (16); the first, correcting text 0, is the batch-1 prompt."""
    return [f"{task}\n\n{text}" for text in TEXTS for task in TASKS]


def load_workloads(tokenizer: Any, names: list[str]) -> list[Workload]:
    """The named workloads (``chat``, ``grounded``) as token ids of ``tokenizer``."""
    out = []
    for name in names:
        if name == "chat":
            mixed = [_chat(tokenizer, t) for t in chat_texts()]
            out.append(Workload(name, _chat(tokenizer, CHAT_SINGLE), mixed))
        elif name == "grounded":
            mixed = [_chat(tokenizer, t) for t in grounded_texts()]
            out.append(Workload(name, mixed[0], mixed))
        else:
            raise ValueError(f"unknown workload {name!r}: chat or grounded")
    return out
